// Tests of ops/fused_gemm_ops.cc: fused_gemm_epilogue gives mul-then-elementwise_add's bits in
// every dtype (small and large shapes: the large ones run the GEMM and the add in pieces), its
// gradients match finite differences, and bad shapes are build errors naming the slot.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/util/grad_checker.h"
#include "tests/util/lowp_test_util.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

struct FusedParams {
  std::string name;
  DDim x, y;
  int xk;
};

const FusedParams kCases[] = {
    {"2d", {5, 7}, {7, 3}, 1},
    {"x_rank3_xk2", {2, 3, 4}, {4, 5}, 2},
    {"x_rank3_xk1", {2, 3, 4}, {12, 5}, 1},
    {"large", {300, 70}, {70, 130}, 1},
};

// Random values of `dtype` (the 16-bit types: float32 ones converted).
Tensor Random(const DDim& d, DType dtype, uint64_t seed) {
  if (dtype == DType::kFloat32 || dtype == DType::kFloat64)
    return RandomTensor(d, dtype, -1, 1, seed);
  return ConvertTensor(RandomTensor(d, DType::kFloat32, -1, 1, seed), dtype);
}

OpCase FusedCase(const FusedParams& p, DType dtype) {
  OpCase c;
  c.name = p.name;
  c.type = "fused_gemm_epilogue";
  c.inputs = {{"X", {Random(p.x, dtype, 1)}},
              {"Y", {Random(p.y, dtype, 2)}},
              {"Bias", {Random({p.y[1]}, dtype, 3)}}};
  c.attrs = {{"x_num_col_dims", p.xk}};
  return c;
}

TEST(FusedGemmEpilogueOp, ForwardIsMulThenBiasAddBitForBit) {
  for (const auto& p : kCases) {
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(p.name + " " + DTypeName(dt));
      const OpCase fused = FusedCase(p, dt);
      OpCase mul;
      mul.type = "mul";
      mul.inputs = {fused.inputs[0], fused.inputs[1]};
      mul.attrs = {{"x_num_col_dims", p.xk}, {"y_num_col_dims", 1}};
      const Tensor product = RunForward(mul)["Out"][0];
      OpCase add;
      add.type = "elementwise_add";
      add.inputs = {{"X", {product}}, {"Y", fused.inputs[2].second}};
      add.attrs = {{"axis", p.xk}};
      const auto want = RunForward(add)["Out"];
      const auto got = RunForward(fused)["Out"];
      ASSERT_EQ(got[0].dims(), want[0].dims());
      EXPECT_TRUE(SameBits(got, want));
    }
  }
}

TEST(FusedGemmEpilogueOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kCases)
    if (p.name != "large") CheckGrad(FusedCase(p, DType::kFloat64));
  // Only some gradients asked for: the others are @EMPTY@.
  for (const char* skip : {"X", "Y", "Bias"}) {
    OpCase c = FusedCase(kCases[1], DType::kFloat64);
    c.name += std::string("_no_grad_") + skip;
    c.no_grad_inputs = {skip};
    CheckGrad(c);
  }
}

TEST(FusedGemmEpilogueOp, BadShapesAreBuildErrorsNamingTheSlot) {
  OpCase c = FusedCase(kCases[0], DType::kFloat32);
  c.inputs[2].second = {Random({4}, DType::kFloat32, 4)};
  ExpectErrorContainsAll(ForwardError(c), {"fused_gemm_epilogue", "Bias", "3"});
  c = FusedCase(kCases[0], DType::kFloat32);
  c.inputs[1].second = {RandomTensor({7, 3, 1}, DType::kFloat32)};
  ExpectErrorContainsAll(ForwardError(c), {"fused_gemm_epilogue", "Y must be 2-D"});
  c = FusedCase(kCases[0], DType::kFloat32);
  c.inputs[2].second = {RandomTensor({3}, DType::kFloat64)};
  ExpectErrorContainsAll(ForwardError(c), {"fused_gemm_epilogue", "Bias is float64"});
  c = FusedCase(kCases[0], DType::kFloat32);
  c.inputs[1].second = {RandomTensor({6, 3}, DType::kFloat32)};
  ExpectErrorContainsAll(ForwardError(c), {"fused_gemm_epilogue", "X's width 7", "height 6"});
}

}  // namespace
}  // namespace keel::testing
