// Tests of ops/tensor_parallel_ops.cc on one process: c_split's part of X for each rank and axis,
// c_embedding's rows and zeros, gradients by finite differences where one process can run them
// (c_split and c_concat on a group of one, c_embedding on any part), which grad op each op's
// backward is, and bad shapes named. The collectives across ranks are exercised by
// tests/fleet/tensor_parallel_test.cc (c_concat forward, c_split's backward all-gather,
// c_identity's backward and mp_allreduce_sum's forward all-reduce), against one process.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "framework/op/op_registry.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

Tensor Iota(const DDim& d, DType dt) {
  std::vector<double> v(d.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  Tensor t(dt, d);
  for (int64_t i = 0; i < d.numel(); ++i) {
    if (dt == DType::kFloat32)
      t.data<float>()[i] = static_cast<float>(v[i]);
    else
      t.data<double>()[i] = v[i];
  }
  return t;
}

OpCase SplitCase(const DDim& x, int nranks, int rank, int axis, DType dt) {
  OpCase c;
  c.name = "c_split " + x.str() + " n" + std::to_string(nranks) + " r" + std::to_string(rank) +
           " axis " + std::to_string(axis);
  c.type = "c_split";
  c.inputs = {{"X", {Iota(x, dt)}}};
  c.attrs = {{"nranks", nranks}, {"rank", rank}, {"axis", axis}};
  return c;
}

TEST(CSplitOp, KeepsThisRanksPartAlongTheAxis) {
  for (DType dt : kFloatTypes) {
    // X [2, 6] = 0..11.
    ExpectForward(SplitCase({2, 6}, 2, 1, -1, dt), "Out", {2, 3}, {3, 4, 5, 9, 10, 11});
    ExpectForward(SplitCase({2, 6}, 3, 0, 1, dt), "Out", {2, 2}, {0, 1, 6, 7});
    ExpectForward(SplitCase({2, 6}, 2, 1, 0, dt), "Out", {1, 6}, {6, 7, 8, 9, 10, 11});
    // X [2, 4, 2] = 0..15, axis 1, rank 1 of 2: rows 2..3 of each of the two blocks.
    ExpectForward(SplitCase({2, 4, 2}, 2, 1, 1, dt), "Out", {2, 2, 2},
                  {4, 5, 6, 7, 12, 13, 14, 15});
  }
}

// A group of one: c_split keeps all of X and its backward (c_concat of one part) needs no ring.
TEST(CSplitOp, GradOnAGroupOfOneMatchesFiniteDifferences) {
  OpCase c = SplitCase({3, 4}, 1, 0, -1, DType::kFloat64);
  c.inputs = {{"X", {RandomTensor({3, 4}, DType::kFloat64, -1, 1, 5)}}};
  CheckGrad(c);
  OpCase cat = c;
  cat.type = "c_concat";
  CheckGrad(cat);
}

TEST(CSplitOp, BadShapesAndRanksAreBuildErrors) {
  ExpectErrorContainsAll(ForwardError(SplitCase({2, 5}, 2, 0, -1, DType::kFloat32)),
                         {"c_split", "dim 1 of X [2, 5] must divide by nranks 2"});
  ExpectErrorContainsAll(ForwardError(SplitCase({2, 4}, 2, 2, -1, DType::kFloat32)),
                         {"c_split", "rank 2 must be < nranks 2"});
  ExpectErrorContainsAll(ForwardError(SplitCase({2, 4}, 2, 0, 2, DType::kFloat32)),
                         {"c_split", "axis 2 is outside the 2 dims of X [2, 4]"});
}

OpCase EmbeddingCase(int64_t start, DType dt) {
  OpCase c;
  c.name = "c_embedding start " + std::to_string(start);
  c.type = "c_embedding";
  c.inputs = {{"W", {RandomTensor({3, 2}, dt, -1, 1, 9)}},
              {"Ids", {Tensor::FromVector<int64_t>({0, 3, 5, 4, 6, 3}, {2, 3, 1})}}};
  c.attrs = {{"start_index", start}};
  c.no_grad_inputs = {"Ids"};
  return c;
}

// W holds rows 3..5 of the table (start_index 3): ids 3, 5, 4, 3 read rows 0, 2, 1, 0; ids 0 and 6
// are another rank's and read zeros.
TEST(CEmbeddingOp, ReadsThisRanksRowsAndZerosElsewhere) {
  for (DType dt : kFloatTypes) {
    OpCase c = EmbeddingCase(3, dt);
    const std::vector<double> w = ToDouble(c.inputs[0].second[0]);
    std::vector<double> want;
    for (int64_t id : {0, 3, 5, 4, 6, 3})
      for (int j = 0; j < 2; ++j) want.push_back(id >= 3 && id < 6 ? w[(id - 3) * 2 + j] : 0.0);
    ExpectOutputNear(c, "Out", {2, 3, 2}, want, {0, /*dtype_of_first_input=*/true});
  }
}

TEST(CEmbeddingOp, GradWrtWMatchesFiniteDifferences) {
  for (int64_t start : {0, 3, 6}) CheckGrad(EmbeddingCase(start, DType::kFloat64));
}

// Each op's backward is its Megatron partner, on the same ring.
TEST(TensorParallelOps, EachBackwardIsItsPartnerOnTheSameRing) {
  auto grad_of = [](const std::string& type, std::map<std::string, Attribute> attrs) {
    OpDesc fwd(type);
    fwd.SetInput("X", {"x"});
    fwd.SetOutput("Out", {"y"});
    for (auto& kv : attrs) fwd.SetAttr(kv.first, kv.second);
    OpRegistry::Find(type)->Complete(&fwd);
    auto g = OpRegistry::Find(type)->grad_maker()(fwd);
    EXPECT_EQ(g.size(), 1u);
    EXPECT_EQ(g[0]->Input("X"), std::vector<std::string>{"y@GRAD"});
    EXPECT_EQ(g[0]->Output("Out"), std::vector<std::string>{"x@GRAD"});
    return std::move(g[0]);
  };
  auto g = grad_of("c_identity", {{"ring_id", 32}});
  EXPECT_EQ(g->type(), "c_allreduce_sum");
  EXPECT_EQ(g->Attr<int>("ring_id"), 32);
  EXPECT_EQ(grad_of("mp_allreduce_sum", {{"ring_id", 32}})->type(), "assign");
  g = grad_of("c_split", {{"ring_id", 32}, {"nranks", 4}, {"rank", 3}, {"axis", 0}});
  EXPECT_EQ(g->type(), "c_concat");
  EXPECT_EQ(g->Attr<int>("nranks"), 4);
  EXPECT_EQ(g->Attr<int>("rank"), 3);
  EXPECT_EQ(g->Attr<int>("axis"), 0);
  EXPECT_EQ(grad_of("c_concat", {{"ring_id", 32}, {"nranks", 2}})->type(), "c_split");
}

}  // namespace
}  // namespace keel::testing
