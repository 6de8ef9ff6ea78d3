// NaN and infinity in ops, as PyTorch treats them: relu and max pooling pass a NaN on (forward,
// and the gradient to where it came from), and a soft label of 0 on a -inf logit contributes
// nothing to softmax_with_cross_entropy. A NaN that an op turns into a number hides an overflow
// from FLAGS_check_nan_inf and from loss scaling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor F(std::vector<float> v, const DDim& d) { return Tensor::FromVector<float>(v, d); }

TEST(NanSemantics, ReluPassesNanForwardAndItsGradientBackward) {
  OpCase c{"relu_nan",   "relu", {{"X", {F({1.5f, -1.f, kNan, 0.f, -kInf, kInf}, {2, 3})}}},
           {{"Out", 1}}, {},     {}};
  const std::vector<double> out = ToDouble(RunForward(c)["Out"][0]);
  EXPECT_EQ(out[0], 1.5);
  EXPECT_EQ(out[1], 0.0);
  EXPECT_TRUE(std::isnan(out[2])) << out[2];
  EXPECT_EQ(out[3], 0.0);
  EXPECT_EQ(out[4], 0.0);
  EXPECT_EQ(out[5], INFINITY);
  // loss = sum(out * w): the gradient is w where relu passes its input on, NaN included.
  const std::vector<double> dx = ToDouble(RunGrads(c, CPUPlace()).at("X_0"));
  EXPECT_NE(dx[0], 0.0);
  EXPECT_EQ(dx[1], 0.0);
  EXPECT_NE(dx[2], 0.0);
  EXPECT_FALSE(std::isnan(dx[2]));
  EXPECT_EQ(dx[3], 0.0);
  EXPECT_EQ(dx[4], 0.0);
}

OpCase MaxPool(const std::string& name, Tensor x, std::vector<int> k, std::vector<int> s) {
  OpCase c{name, "pool2d", {{"X", {std::move(x)}}}, {{"Out", 1}}, {}, {}};
  c.attrs = {{"pooling_type", std::string("max")},
             {"ksize", k},
             {"strides", s},
             {"paddings", std::vector<int>{0, 0}}};
  return c;
}

// A 4x4 plane: window (0, 0) of the 2x2 tiling holds one NaN, window (1, 1) only NaNs.
Tensor PlaneWithNans() {
  return F({1, 2, 3, 4,         //
            5, kNan, 7, 8,      //
            9, 10, kNan, kNan,  //
            11, 12, kNan, kNan},
           {1, 1, 4, 4});
}

TEST(NanSemantics, MaxPoolPropagatesNanAndSendsItsGradientToTheNan) {
  struct Want {
    OpCase c;
    std::vector<double> out;         // NaN: a NaN expected
    std::vector<int> gets_gradient;  // the elements of X that take a window's gradient
  };
  const double nan = std::nan("");
  const std::vector<Want> cases = {
      // 2x2 stride 2 (the tiled path): windows [1 2 5 NaN], [3 4 7 8], [9 10 11 12], all NaN.
      {MaxPool("tiled", PlaneWithNans(), {2, 2}, {2, 2}), {nan, 8, 12, nan}, {5, 7, 13, 10}},
      // 3x3 stride 1 (the general loop): every window holds (1, 1), the first NaN of each.
      {MaxPool("general", PlaneWithNans(), {3, 3}, {1, 1}), {nan, nan, nan, nan}, {5}}};
  for (const Want& w : cases) {
    SCOPED_TRACE(w.c.name);
    const std::vector<double> out = ToDouble(RunForward(w.c)["Out"][0]);
    ASSERT_EQ(out.size(), w.out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      if (std::isnan(w.out[i])) {
        EXPECT_TRUE(std::isnan(out[i])) << i << ": " << out[i];
      } else {
        EXPECT_EQ(out[i], w.out[i]) << i;
      }
    }
    const std::vector<double> dx = ToDouble(RunGrads(w.c, CPUPlace()).at("X_0"));
    for (int i = 0; i < 16; ++i) {
      const bool takes =
          std::find(w.gets_gradient.begin(), w.gets_gradient.end(), i) != w.gets_gradient.end();
      EXPECT_EQ(dx[i] != 0.0, takes) << i << ": " << dx[i];
      EXPECT_FALSE(std::isnan(dx[i])) << i;
    }
  }
  // Without a NaN the maximum is a number again: the NaN of one plane does not leak into another.
  OpCase plain = MaxPool("plain", F({1, 2, 3, 4}, {1, 1, 2, 2}), {2, 2}, {2, 2});
  EXPECT_EQ(ToDouble(RunForward(plain)["Out"][0]), std::vector<double>{4});
}

TEST(NanSemantics, SoftLabelZeroOnAMinusInfinityLogitContributesNothing) {
  // Short rows (3 classes) and long ones (40), one row with a -inf logit under a 0 label.
  for (int64_t n : {3, 40}) {
    SCOPED_TRACE(n);
    std::vector<float> logits(2 * n, 0.f), label(2 * n, 0.f);
    logits[1] = -kInf;  // row 0, class 1: label 0
    logits[2] = 1.f;
    label[0] = 0.3f;
    label[2] = 0.7f;
    for (int64_t j = 0; j < n; ++j) logits[n + j] = 0.1f * j, label[n + j] = 1.f / n;
    OpCase c{"swce_soft_inf",
             "softmax_with_cross_entropy",
             {{"Logits", {F(logits, {2, n})}}, {"Label", {F(label, {2, n})}}},
             {{"Softmax", 1}, {"Loss", 1}},
             {{"soft_label", true}},
             {"Label"}};
    const std::vector<double> loss = ToDouble(RunForward(c)["Loss"][0]);
    // -sum_j l_j log softmax_j over the finite classes: 0 and 1, plus n - 3 zeros.
    const double lse = std::log(1.0 * (n - 2) + std::exp(1.0));
    EXPECT_NEAR(loss[0], lse - 0.7, 1e-6);
    EXPECT_TRUE(std::isfinite(loss[1]));
    const std::vector<double> dx = ToDouble(RunGrads(c, CPUPlace()).at("Logits_0"));
    for (double v : dx) EXPECT_TRUE(std::isfinite(v)) << v;
    // A NaN logit still makes its row's loss NaN.
    logits[n + 1] = kNan;
    c.inputs[0].second[0] = F(logits, {2, n});
    EXPECT_TRUE(std::isnan(ToDouble(RunForward(c)["Loss"][0])[1]));
  }
}

}  // namespace
}  // namespace keel::testing
