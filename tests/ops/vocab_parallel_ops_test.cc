// Tests of ops/vocab_parallel_ops.cc on one process: on a group of one each op is its one-process
// form (softmax_with_cross_entropy, top_k with k = 1) on the same inputs; the loss's gradient by
// finite differences; the backward on another rank's columns; bad labels, shapes and a missing
// ring named. Across ranks: tests/fleet/tensor_parallel_test.cc (the transformer's TP=2 loss and
// accuracy equal TP=1's).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

Tensor Labels(const std::vector<int64_t>& v) {
  return Tensor::FromVector<int64_t>(v, {static_cast<int64_t>(v.size()), 1});
}

OpCase LossCase(const std::string& type, Tensor logits, Tensor label,
                std::map<std::string, Attribute> attrs = {}) {
  OpCase c;
  c.name = type;
  c.type = type;
  c.inputs = {{"Logits", {std::move(logits)}}, {"Label", {std::move(label)}}};
  c.outputs = {{"Softmax", 1}, {"Loss", 1}};
  c.attrs = std::move(attrs);
  c.no_grad_inputs = {"Label"};
  return c;
}

void ExpectNear(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.dims(), want.dims()) << what;
  const std::vector<double> g = ToDouble(got), w = ToDouble(want);
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(g[i], w[i], tol * std::max(1.0, std::abs(w[i]))) << what << " [" << i << "]";
}

TEST(CSoftmaxWithCrossEntropyOp, OnAGroupOfOneEqualsSoftmaxWithCrossEntropy) {
  for (DType dt : kFloatTypes) {
    // Large logits too (the max shift), and an ignored row.
    Tensor logits = RandomTensor({6, 9}, dt, -30, 30, 3);
    Tensor label = Labels({0, 8, 4, -100, 2, 7});
    auto got = RunForward(LossCase("c_softmax_with_cross_entropy", logits, label));
    auto want = RunForward(LossCase("softmax_with_cross_entropy", logits, label));
    const double tol = dt == DType::kFloat32 ? 1e-6 : 1e-13;
    ExpectNear(got["Softmax"][0], want["Softmax"][0], tol, "Softmax");
    ExpectNear(got["Loss"][0], want["Loss"][0], tol, "Loss");
    EXPECT_EQ(ToDouble(got["Loss"][0])[3], 0.0) << "the ignored row";
  }
}

TEST(CSoftmaxWithCrossEntropyOp, GradMatchesFiniteDifferences) {
  CheckGrad(LossCase("c_softmax_with_cross_entropy",
                     RandomTensor({4, 5}, DType::kFloat64, -2, 2, 7), Labels({1, 4, -100, 0})),
            1e-6, 1e-4, 1e-6, {"Loss"});
}

// Rank 1 of 2 holds classes 3..5: its gradient is Softmax * dLoss, minus dLoss at the label's
// column only where the label is one of its classes; an ignored row gets zeros.
TEST(CSoftmaxWithCrossEntropyOp, BackwardSubtractsTheLabelOnlyOnTheRankHoldingIt) {
  const std::vector<double> sm = {0.1, 0.2, 0.3, 0.05, 0.05, 0.1, 0.2, 0.2, 0.2};
  OpCase c;
  c.name = "grad on rank 1 of 2";
  c.type = "c_softmax_with_cross_entropy_grad";
  Tensor smt(DType::kFloat64, {3, 3});
  for (int i = 0; i < 9; ++i) smt.data<double>()[i] = sm[i];
  c.inputs = {{"Softmax", {smt}},
              {"Label", {Labels({4, 1, -100})}},
              {"Loss@GRAD", {Tensor::FromVector<double>({2.0, 3.0, 5.0}, {3, 1})}}};
  c.outputs = {{"Logits@GRAD", 1}};
  c.attrs = {{"nranks", 2}, {"rank", 1}};
  ExpectForward(c, "Logits@GRAD", {3, 3},
                {0.2, 0.4 - 2.0, 0.6,  // label 4: column 1 here
                 0.15, 0.15, 0.3,      // label 1: rank 0's
                 0, 0, 0});            // ignored
}

TEST(CSoftmaxWithCrossEntropyOp, BadLabelsShapesAndAMissingRingAreNamed) {
  Tensor logits = RandomTensor({2, 3}, DType::kFloat32, -1, 1, 1);
  ExpectErrorContainsAll(
      ForwardError(LossCase("c_softmax_with_cross_entropy", logits, Labels({1, 3}))),
      {"c_softmax_with_cross_entropy", "Label value 3 at row 1 is outside [0, 3)"});
  ExpectErrorContainsAll(
      ForwardError(LossCase("c_softmax_with_cross_entropy", logits, Labels({1, 2, 0}))),
      {"c_softmax_with_cross_entropy", "Label [3, 1] must be [2, 1]"});
  ExpectErrorContainsAll(ForwardError(LossCase("c_softmax_with_cross_entropy", logits,
                                               Labels({1, 2}), {{"nranks", 2}, {"rank", 2}})),
                         {"c_softmax_with_cross_entropy", "rank 2 must be < nranks 2"});
  // Two ranks but no ring 0 in this process: named, not a crash.
  ExpectErrorContainsAll(ForwardError(LossCase("c_softmax_with_cross_entropy", logits,
                                               Labels({1, 2}), {{"nranks", 2}, {"rank", 0}})),
                         {"c_softmax_with_cross_entropy", "ring"});
}

OpCase Top1Case(const std::string& type, Tensor x) {
  OpCase c = UnaryCase(type, type, std::move(x));
  c.outputs = {{"Out", 1}, {"Indices", 1}};
  if (type == "top_k") c.attrs = {{"k", 1}};
  return c;
}

// Ties go to the lower index and NaN ranks first, as top_k's.
TEST(CTop1Op, OnAGroupOfOneEqualsTopKOfOne) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : kFloatTypes) {
    Tensor x(dt, {4, 4});
    const std::vector<double> v = {1, 3, 3, 2, 5, nan, 7, nan, -1, -1, -1, -1, 0, 4, 9, 8};
    for (int i = 0; i < 16; ++i) {
      if (dt == DType::kFloat32)
        x.data<float>()[i] = static_cast<float>(v[i]);
      else
        x.data<double>()[i] = v[i];
    }
    auto got = RunForward(Top1Case("c_top1", x));
    auto want = RunForward(Top1Case("top_k", x));
    EXPECT_EQ(ToDouble(got["Indices"][0]), ToDouble(want["Indices"][0]));
    EXPECT_EQ(ToDouble(got["Indices"][0]), (std::vector<double>{1, 1, 0, 2}));
    EXPECT_TRUE(SameBits(got["Out"], want["Out"]));
  }
}

TEST(CTop1Op, TwoRanksWithoutARingAreNamed) {
  OpCase c = Top1Case("c_top1", RandomTensor({2, 3}, DType::kFloat32, -1, 1, 2));
  c.attrs = {{"nranks", 2}, {"rank", 1}, {"ring_id", 5}};
  ExpectErrorContainsAll(ForwardError(c), {"c_top1", "ring 5"});
}

}  // namespace
}  // namespace keel::testing
