// Narrowed outputs and widened inputs (OpTraits::narrows_outputs, widens_inputs), what
// transpiler/narrow_grads_pass.h builds fp16_allreduce's casts out of, and the GEMM that adds into
// gradient merge's buffers (transpiler/fuse_grad_accumulation_pass.h):
//   - blas's GEMM from float32 operands into a 16-bit C is the float32 GEMM rounded, bit for bit,
//     on every shape, transpose and thread count tried;
//   - fused_gemm_epilogue_grad, mul_grad and elementwise_add_grad store a weight or bias gradient
//     declared 16-bit as their float32 gradient rounded, bit for bit; shape inference keeps the
//     declaration where the op narrows the slot and overrides it where it does not;
// (The updates that widen a 16-bit gradient: multi_precision_ops_test.cc.)
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/program_guard.h"
#include "framework/error.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/blas.h"
#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/float16.h"
#include "framework/runtime/half_convert.h"
#include "tests/util/lowp_test_util.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// ---------------------------------------------------------------- the narrowing GEMM

template <typename TC>
void CheckNarrowingGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  SCOPED_TRACE(std::string(ta ? "T" : "N") + (tb ? "T " : "N ") + std::to_string(M) + "x" +
               std::to_string(N) + "x" + std::to_string(K) + " " + DTypeName(DTypeOf<TC>::value));
  const Tensor a = RandomTensor(DDim({M * K}), DType::kFloat32, -1, 1, 11);
  const Tensor b = RandomTensor(DDim({K * N}), DType::kFloat32, -1, 1, 12);
  std::vector<float> c32(static_cast<size_t>(M * N));
  blas::Gemm<float, float>(ta, tb, M, N, K, 0.75f, a.data<float>(), b.data<float>(), 0.0f,
                           c32.data());
  std::vector<TC> want(c32.size()), got(c32.size());
  NarrowN(c32.data(), want.data(), M * N);
  blas::Gemm<float, TC>(ta, tb, M, N, K, 0.75f, a.data<float>(), b.data<float>(), 0.0f, got.data());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(TC)), 0);
}

// The seed MLP's weight gradients (X' * dY: 1280 x 1280 over a batch of 128, in 13 blocks of 96
// rows and one of 32; its first and last layers'), uneven blocks (129 rows of 1031 columns: 112
// and 17) and remainders under 16 rows the last block takes in (129 rows of 1024 columns, 113 of
// 1031, 17 of 200,000: one block each), a single row or column, and every transpose; on one
// thread and on two (the blocks are cut by the shape alone).
TEST(NarrowingGemm, IsTheFloat32GemmRoundedBitForBit) {
  const struct {
    int64_t M, N, K;
  } shapes[] = {{1280, 1280, 128}, {32, 1280, 128}, {1280, 2, 128},  {1, 300, 7},
                {300, 1, 9},       {17, 33, 1},     {129, 1031, 65}, {129, 1024, 65},
                {113, 1031, 65},   {17, 200000, 3}};
  const int budget = cpu_threads::Budget();
  for (int threads : {1, 2}) {
    cpu_threads::SetBudget(threads);
    for (const auto& s : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          CheckNarrowingGemm<bfloat16>(ta, tb, s.M, s.N, s.K);
          CheckNarrowingGemm<float16>(ta, tb, s.M, s.N, s.K);
        }
  }
  cpu_threads::SetBudget(budget);
}

// blas::GemmAccumulate (gradient merge's buffers, which the gradients' ops add into): C plus the
// float32 GEMM's product, bit for bit as a GEMM into a temporary and a sum after, on the same
// shapes, transposes and thread counts.
TEST(GemmAccumulate, IsTheGemmThenASumBitForBit) {
  const struct {
    int64_t M, N, K;
  } shapes[] = {{1280, 1280, 128}, {32, 1280, 128}, {1280, 2, 128}, {129, 1031, 65}, {17, 33, 1}};
  const int budget = cpu_threads::Budget();
  for (int threads : {1, 2}) {
    cpu_threads::SetBudget(threads);
    for (const auto& g : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          SCOPED_TRACE(std::to_string(g.M) + "x" + std::to_string(g.N) + "x" + std::to_string(g.K) +
                       (ta ? " A'" : "") + (tb ? " B'" : ""));
          const Tensor a = RandomTensor(DDim({g.M * g.K}), DType::kFloat32, -1, 1, 21);
          const Tensor b = RandomTensor(DDim({g.K * g.N}), DType::kFloat32, -1, 1, 22);
          const Tensor c0 = RandomTensor(DDim({g.M * g.N}), DType::kFloat32, -1, 1, 23);
          std::vector<float> product(static_cast<size_t>(g.M * g.N));
          blas::Gemm<float, float>(ta, tb, g.M, g.N, g.K, 0.5f, a.data<float>(), b.data<float>(),
                                   0.0f, product.data());
          std::vector<float> want(c0.data<float>(), c0.data<float>() + g.M * g.N);
          for (size_t i = 0; i < want.size(); ++i) want[i] += product[i];
          std::vector<float> got(c0.data<float>(), c0.data<float>() + g.M * g.N);
          blas::GemmAccumulate(ta, tb, g.M, g.N, g.K, 0.5f, a.data<float>(), ta ? g.M : g.K,
                               b.data<float>(), tb ? g.K : g.N, got.data(), g.N);
          EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
        }
  }
  cpu_threads::SetBudget(budget);
}

TEST(NarrowingGemm, AccumulatingIntoA16BitResultIsRefused) {
  std::vector<float> a(4, 1.0f), b(4, 1.0f);
  std::vector<bfloat16> c(4);
  ExpectErrorContainsAll(ErrorOf([&] {
                           blas::Gemm<float, bfloat16>(false, false, 2, 2, 2, 1.0f, a.data(),
                                                       b.data(), 1.0f, c.data());
                         }),
                         {"16-bit C", "beta must be 0"});
}

// ---------------------------------------------------------------- narrowed gradients

// Declares var `name` of `dtype` and `dims` in `block`.
void Declare(Block& block, const std::string& name, DType dtype, const DDim& dims) {
  VarDesc* v = block.Var(name);
  v->set_dtype(dtype);
  v->set_dims(dims);
}

// Runs the grad op `type` (fused_gemm_epilogue_grad or mul_grad) on X [M, K], Y [K, N], Bias [N]
// and Out@GRAD [M, N], with Y@GRAD (and Bias@GRAD) declared `grad_dtype`; returns the outputs by
// var name, and in *declared what the program declares them after shape inference.
std::map<std::string, Tensor> RunGrad(const std::string& type, DType grad_dtype, int64_t M,
                                      int64_t K, int64_t N,
                                      std::map<std::string, DType>* declared) {
  Program prog;
  Block& block = prog.global_block();
  const bool fused = type == "fused_gemm_epilogue_grad";
  FeedMap feed;
  auto input = [&](const std::string& name, const DDim& d, uint64_t seed) {
    Declare(block, name, DType::kFloat32, d);
    block.Var(name)->set_is_data(true);
    feed[name] = RandomTensor(d, DType::kFloat32, -1, 1, seed);
  };
  input("x", {M, K}, 1);
  input("y", {K, N}, 2);
  input("dout", {M, N}, 3);
  OpDesc::VarMap ins = {{"X", {"x"}}, {"Y", {"y"}}};
  OpDesc::VarMap outs = {{"X@GRAD", {"dx"}}, {"Y@GRAD", {"dy"}}};
  Declare(block, "dx", DType::kFloat32, {M, K});
  Declare(block, "dy", grad_dtype, {K, N});
  std::map<std::string, Attribute> attrs = {{"x_num_col_dims", 1}};
  if (fused) {
    input("b", {N}, 4);
    input("out", {M, N}, 5);
    ins.push_back({"Bias", {"b"}});
    ins.push_back({"Out", {"out"}});
    outs.push_back({"Bias@GRAD", {"db"}});
    Declare(block, "db", grad_dtype, {N});
  } else {
    attrs["y_num_col_dims"] = 1;
  }
  ins.push_back({"Out@GRAD", {"dout"}});
  AppendOp(block, type, ins, outs, attrs);
  std::vector<std::string> fetch = {"dx", "dy"};
  if (fused) fetch.push_back("db");
  for (const std::string& f : fetch) (*declared)[f] = block.FindVar(f)->dtype();
  Executor exe;
  const std::vector<Tensor> got = exe.Run(prog, feed, fetch);
  std::map<std::string, Tensor> r;
  for (size_t i = 0; i < fetch.size(); ++i) r[fetch[i]] = got[i];
  return r;
}

// The weight and bias gradients declared bfloat16 or float16 come out as the float32 op's rounded,
// bit for bit (a weight gradient of 1100 x 260 whose GEMM runs in three blocks of rows, and a small
// one); the input gradient stays the float32 op's.
TEST(NarrowedGrads, GemmGradOpsStoreTheirFloat32GradientsRounded) {
  for (const std::string type : {"fused_gemm_epilogue_grad", "mul_grad"})
    for (DType low : {DType::kBFloat16, DType::kFloat16})
      for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{64, 1100, 260}, {3, 5, 7}}) {
        SCOPED_TRACE(type + " " + DTypeName(low) + " " + std::to_string(K) + "x" +
                     std::to_string(N));
        std::map<std::string, DType> decl32, decl;
        const auto ref = RunGrad(type, DType::kFloat32, M, K, N, &decl32);
        const auto got = RunGrad(type, low, M, K, N, &decl);
        EXPECT_EQ(decl.at("dy"), low) << "shape inference kept the narrowed declaration";
        EXPECT_TRUE(SameBytes(got.at("dy"), ConvertTensor(ref.at("dy"), low)));
        EXPECT_TRUE(SameBytes(got.at("dx"), ref.at("dx")));
        if (got.count("db")) {
          EXPECT_EQ(decl.at("db"), low);
          EXPECT_TRUE(SameBytes(got.at("db"), ConvertTensor(ref.at("db"), low)));
        }
      }
}

// elementwise_add_grad's Y@GRAD (an unfused fc's bias gradient) declared 16-bit is the float32
// column sums rounded, for a bias over rows and a Y of X's own shape (whose float32 gradient may be
// dOut's own buffer). An op that does not narrow a slot gets the dtype its shape function gives,
// whatever the var was declared: elementwise_sub_grad's Y@GRAD, mul_grad's X@GRAD.
TEST(NarrowedGrads, TheAddsBiasGradientIsNarrowedOtherSlotsAreNot) {
  for (DType low : {DType::kBFloat16, DType::kFloat16})
    for (bool rows : {true, false}) {
      SCOPED_TRACE(std::string(DTypeName(low)) + (rows ? " bias over rows" : " same shape"));
      const DDim x({70, 33}), y = rows ? DDim({33}) : x;
      auto run = [&](DType dy_dtype, DType* declared) {
        Program prog;
        Block& block = prog.global_block();
        FeedMap feed;
        for (auto [name, d, seed] :
             {std::tuple<const char*, DDim, uint64_t>{"x", x, 1}, {"y", y, 2}, {"dout", x, 3}}) {
          Declare(block, name, DType::kFloat32, d);
          block.Var(name)->set_is_data(true);
          feed[name] = RandomTensor(d, DType::kFloat32, -1, 1, seed);
        }
        Declare(block, "dx", DType::kFloat32, x);
        Declare(block, "dy", dy_dtype, y);
        AppendOp(block, "elementwise_add_grad",
                 {{"X", {"x"}}, {"Y", {"y"}}, {"Out@GRAD", {"dout"}}},
                 {{"X@GRAD", {"dx"}}, {"Y@GRAD", {"dy"}}}, {{"axis", -1}});
        *declared = block.FindVar("dy")->dtype();
        Executor exe;
        return exe.Run(prog, feed, {"dy", "dx"});
      };
      DType d32, dlow;
      const std::vector<Tensor> ref = run(DType::kFloat32, &d32);
      const std::vector<Tensor> got = run(low, &dlow);
      EXPECT_EQ(dlow, low);
      EXPECT_TRUE(SameBytes(got[0], ConvertTensor(ref[0], low)));
      EXPECT_TRUE(SameBytes(got[1], ref[1]));
    }
  Program prog;
  Block& block = prog.global_block();
  for (const char* v : {"x", "dout", "dx"}) Declare(block, v, DType::kFloat32, {4, 3});
  Declare(block, "b", DType::kFloat32, {3});
  Declare(block, "db", DType::kBFloat16, {3});
  AppendOp(block, "elementwise_sub_grad", {{"X", {"x"}}, {"Y", {"b"}}, {"Out@GRAD", {"dout"}}},
           {{"X@GRAD", {"dx"}}, {"Y@GRAD", {"db"}}}, {{"axis", -1}});
  EXPECT_EQ(block.FindVar("db")->dtype(), DType::kFloat32);
  EXPECT_FALSE(OpRegistry::Traits("mul_grad").NarrowsOutput("X@GRAD"));
  EXPECT_TRUE(OpRegistry::Traits("mul_grad").NarrowsOutput("Y@GRAD"));
}

}  // namespace
}  // namespace keel::testing
