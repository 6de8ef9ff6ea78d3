// Tests of ops/loss_ops.cc (cross_entropy, softmax_with_cross_entropy): forward values against
// naive reference loops (float32 and float64), gradients by finite differences (float64), and bad
// labels reported as keel::Error at build or run time.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/autodiff/backward.h"
#include "framework/dsl/program_guard.h"
#include "framework/error.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

// The int64 label tensor [values.size(), 1].
Tensor Labels(const std::vector<int64_t>& values) {
  return Tensor::FromVector(values, DDim{static_cast<int64_t>(values.size()), 1});
}

// -------------------------------------------------------------------------------- cross_entropy

struct CrossEntropyParams {
  std::string name;
  DDim x;                       // [..., D]
  std::vector<int64_t> labels;  // hard labels, one per row; empty: soft labels
  int ignore_index;
};

const CrossEntropyParams kCrossEntropyCases[] = {
    {"hard", {4, 3}, {0, 2, 1, 2}, -100},
    {"hard_ignored_row", {4, 3}, {0, -100, 1, 2}, -100},
    {"hard_ignore_index_1", {4, 3}, {0, 1, 1, 2}, 1},
    {"hard_rank3", {2, 3, 4}, {0, 1, 2, 3, 3, 0}, -100},
    {"mlp_head", {128, 2}, std::vector<int64_t>(128, 1), -100},
    {"soft", {4, 3}, {}, -100},
    {"soft_rank3", {2, 2, 5}, {}, -100},
};

OpCase CrossEntropyCase(const CrossEntropyParams& p, DType dt) {
  OpCase c;
  c.name = p.name;
  c.type = "cross_entropy";
  c.outputs = {{"Y", 1}};
  Tensor x = RandomTensor(p.x, dt, 0.1, 1, 21);
  DDim label_dims = p.x;
  label_dims[p.x.size() - 1] = 1;
  Tensor label;
  if (p.labels.empty()) {
    label = RandomTensor(p.x, dt, 0, 1, 22);
  } else {
    label = Tensor::FromVector(p.labels, label_dims);
  }
  c.inputs = {{"X", {x}}, {"Label", {label}}};
  c.attrs = {{"soft_label", p.labels.empty()}, {"ignore_index", p.ignore_index}};
  c.no_grad_inputs = {"Label"};
  return c;
}

TEST(CrossEntropyOp, ForwardMatchesReference) {
  for (const auto& p : kCrossEntropyCases)
    for (DType dt : kFloatTypes) {
      OpCase c = CrossEntropyCase(p, dt);
      std::vector<double> x = ToDouble(c.inputs[0].second[0]);
      const int64_t d = p.x[p.x.size() - 1], rows = p.x.numel() / d;
      std::vector<double> want(rows, 0.0);
      if (p.labels.empty()) {
        std::vector<double> l = ToDouble(c.inputs[1].second[0]);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < d; ++j) want[i] -= l[i * d + j] * std::log(x[i * d + j]);
      } else {
        for (int64_t i = 0; i < rows; ++i)
          if (p.labels[i] != p.ignore_index) want[i] = -std::log(x[i * d + p.labels[i]]);
      }
      DDim out = p.x;
      out[p.x.size() - 1] = 1;
      ExpectForward(c, "Y", out, want);
    }
}

TEST(CrossEntropyOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kCrossEntropyCases)
    if (p.x.numel() <= 64) CheckGrad(CrossEntropyCase(p, DType::kFloat64));
}

TEST(CrossEntropyOp, Int32LabelIsABuildErrorMentioningInt64) {
  OpCase c = CrossEntropyCase(kCrossEntropyCases[0], DType::kFloat32);
  c.inputs[1].second[0] = Tensor::FromVector<int32_t>({0, 2, 1, 2}, {4, 1});
  ExpectErrorContainsAll(ForwardError(c), {"cross_entropy", "int64", "int32"});
}

TEST(CrossEntropyOp, LabelOutOfRangeIsARunError) {
  for (int64_t bad : {3, -1}) {
    OpCase c = CrossEntropyCase(kCrossEntropyCases[0], DType::kFloat32);
    c.name = "label_" + std::to_string(bad);
    c.inputs[1].second[0] = Labels({0, bad, 1, 2});
    SCOPED_TRACE(Describe(c));
    ExpectErrorContainsAll(ForwardError(c), {"cross_entropy", "Label value " + std::to_string(bad),
                                             "row 1", "[0, 3)"});
  }
}

TEST(CrossEntropyOp, BadLabelShapesAreBuildErrors) {
  OpCase c = CrossEntropyCase(kCrossEntropyCases[0], DType::kFloat32);
  c.name = "label_rows_differ";
  c.inputs[1].second[0] = Labels({0, 1, 2});
  ExpectErrorContainsAll(ForwardError(c), {"cross_entropy", "[4, 3]", "[3, 1]"});

  c.name = "label_rank_1";
  c.inputs[1].second[0] = Tensor::FromVector<int64_t>({0, 1, 2, 0}, {4});
  ExpectErrorContainsAll(ForwardError(c), {"cross_entropy", "[4, 3]", "[4]", "rank"});

  c.name = "soft_label_width";
  c.attrs["soft_label"] = true;
  c.inputs[1].second[0] = RandomTensor({4, 2}, DType::kFloat32, 0, 1, 3);
  ExpectErrorContainsAll(ForwardError(c), {"cross_entropy", "[4, 3]", "[4, 2]"});
}

TEST(CrossEntropyOp, UnknownBatchDimPassesBuildTimeCheck) {
  Program prog;
  Block& block = prog.global_block();
  block.Var("x")->set_shape({-1, 10});
  block.Var("label")->set_shape({-1, 1});
  block.Var("label")->set_dtype(DType::kInt64);
  AppendOp(block, "cross_entropy", {{"X", {"x"}}, {"Label", {"label"}}}, {{"Y", {"y"}}});
  EXPECT_EQ(block.FindVar("y")->dims(), DDim({-1, 1}));
  EXPECT_EQ(block.FindVar("y")->dtype(), DType::kFloat32);
}

// ------------------------------------------------------------------- softmax_with_cross_entropy

struct SwceParams {
  std::string name;
  DDim logits;
  int axis;
  std::vector<int64_t> labels;  // one per position of Loss; empty: soft labels
  int ignore_index;
  double lo, hi;  // logit range
};

const SwceParams kSwceCases[] = {
    {"hard", {4, 3}, -1, {0, 2, 1, 2}, -100, -3, 3},
    {"hard_ignored_row", {4, 3}, -1, {0, 5, 1, 2}, 5, -3, 3},
    {"hard_axis1_rank3", {2, 3, 2}, 1, {0, 2, 1, 1}, -100, -3, 3},
    {"huge_logits", {3, 4}, -1, {3, 0, 1}, -100, 500, 1000},
    {"soft", {4, 3}, -1, {}, -100, -3, 3},
    {"soft_axis0", {3, 2}, 0, {}, -100, -3, 3},
    {"hard_long_rows", {3, 20}, -1, {0, 19, 7}, 7, -3, 3},  // past the short-row path
    {"soft_long_rows", {2, 17}, -1, {}, -100, -3, 3},
    {"mlp_head", {128, 2}, -1, std::vector<int64_t>(128, 0), -100, -5, 5},
};

DDim LossDims(const SwceParams& p) {
  DDim d = p.logits;
  d[p.axis < 0 ? p.axis + d.size() : p.axis] = 1;
  return d;
}

OpCase SwceCase(const SwceParams& p, DType dt) {
  OpCase c;
  c.name = p.name;
  c.type = "softmax_with_cross_entropy";
  c.outputs = {{"Softmax", 1}, {"Loss", 1}};
  Tensor logits = RandomTensor(p.logits, dt, p.lo, p.hi, 31);
  Tensor label;
  if (p.labels.empty()) {
    // A distribution along the axis: normalize random positives.
    std::vector<double> r = ToDouble(RandomTensor(p.logits, DType::kFloat64, 0.1, 1, 32));
    AxisParts s = SplitAroundAxis(p.logits, p.axis);
    for (int64_t i = 0; i < s.pre; ++i)
      for (int64_t j = 0; j < s.post; ++j) {
        double sum = 0;
        for (int64_t k = 0; k < s.n; ++k) sum += r[(i * s.n + k) * s.post + j];
        for (int64_t k = 0; k < s.n; ++k) r[(i * s.n + k) * s.post + j] /= sum;
      }
    label = Tensor(dt, p.logits);
    VisitDType(dt, [&](auto z) {
      using V = decltype(z);
      for (size_t i = 0; i < r.size(); ++i) label.data<V>()[i] = static_cast<V>(r[i]);
    });
  } else {
    label = Tensor::FromVector(p.labels, LossDims(p));
  }
  c.inputs = {{"Logits", {logits}}, {"Label", {label}}};
  c.attrs = {{"soft_label", p.labels.empty()}, {"ignore_index", p.ignore_index}, {"axis", p.axis}};
  c.no_grad_inputs = {"Label"};
  return c;
}

TEST(SoftmaxWithCrossEntropyOp, ForwardMatchesReference) {
  for (const auto& p : kSwceCases)
    for (DType dt : kFloatTypes) {
      OpCase c = SwceCase(p, dt);
      std::vector<double> x = ToDouble(c.inputs[0].second[0]);
      std::vector<double> sm = NaiveSoftmax(x, p.logits, p.axis);
      AxisParts s = SplitAroundAxis(p.logits, p.axis);
      std::vector<double> loss(s.pre * s.post, 0.0);
      std::vector<double> soft =
          p.labels.empty() ? ToDouble(c.inputs[1].second[0]) : std::vector<double>{};
      for (int64_t i = 0; i < s.pre; ++i)
        for (int64_t j = 0; j < s.post; ++j) {
          auto at = [&](int64_t k) { return (i * s.n + k) * s.post + j; };
          // log softmax in double, stable: x - max - log(sum(exp(x - max)))
          double mx = -std::numeric_limits<double>::infinity(), sum = 0;
          for (int64_t k = 0; k < s.n; ++k) mx = std::max(mx, x[at(k)]);
          for (int64_t k = 0; k < s.n; ++k) sum += std::exp(x[at(k)] - mx);
          auto log_sm = [&](int64_t k) { return x[at(k)] - mx - std::log(sum); };
          double& l = loss[i * s.post + j];
          if (p.labels.empty()) {
            for (int64_t k = 0; k < s.n; ++k) l -= soft[at(k)] * log_sm(k);
          } else if (p.labels[i * s.post + j] != p.ignore_index) {
            l = -log_sm(p.labels[i * s.post + j]);
          }
        }
      ExpectForward(c, "Softmax", p.logits, sm);
      ExpectForward(c, "Loss", LossDims(p), loss);
    }
}

TEST(SoftmaxWithCrossEntropyOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kSwceCases)
    if (p.logits.numel() <= 64 && p.hi < 100)
      CheckGrad(SwceCase(p, DType::kFloat64), 1e-6, 1e-4, 1e-6, {"Loss"});
}

TEST(SoftmaxWithCrossEntropyOp, LabelOutOfRangeIsARunError) {
  OpCase c = SwceCase(kSwceCases[0], DType::kFloat32);
  c.inputs[1].second[0] = Labels({0, 2, 7, 2});
  ExpectErrorContainsAll(ForwardError(c),
                         {"softmax_with_cross_entropy", "Label value 7", "row 2", "[0, 3)"});
}

TEST(SoftmaxWithCrossEntropyOp, Int32LabelIsABuildErrorMentioningInt64) {
  OpCase c = SwceCase(kSwceCases[0], DType::kFloat32);
  c.inputs[1].second[0] = Tensor::FromVector<int32_t>({0, 2, 1, 2}, {4, 1});
  ExpectErrorContainsAll(ForwardError(c), {"softmax_with_cross_entropy", "int64", "int32"});
}
}  // namespace
}  // namespace keel::testing
