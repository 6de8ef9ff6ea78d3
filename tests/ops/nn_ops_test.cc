// Tests of ops/{activation,loss,reduce,tensor,optimizer}_ops.cc: forward values against naive
// reference loops (float32 and float64), gradients by finite differences (float64), seeded
// random ops, and bad input reported as keel::Error at build or run time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
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

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64};

// Output `slot` of c's forward run equals `want` (shape and values, to the dtype's precision).
void ExpectForward(const OpCase& c, const std::string& slot, const DDim& want_dims,
                   const std::vector<double>& want) {
  ExpectOutputNear(c, slot, want_dims, want, {2e-6});
}

OpCase UnaryCase(const std::string& name, const std::string& type, Tensor x,
                 std::map<std::string, Attribute> attrs = {}) {
  OpCase c;
  c.name = name;
  c.type = type;
  c.inputs = {{"X", {std::move(x)}}};
  c.attrs = std::move(attrs);
  return c;
}

// The int64 label tensor [values.size(), 1].
Tensor Labels(const std::vector<int64_t>& values) {
  return Tensor::FromVector(values, DDim{static_cast<int64_t>(values.size()), 1});
}

// ---------------------------------------------------------------------------------- activations

struct ActParams {
  std::string type;
  std::function<double(double)> fn;
};

const ActParams kActivations[] = {
    {"tanh", [](double x) { return std::tanh(x); }},
    {"sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }},
    {"relu", [](double x) { return x > 0 ? x : 0; }},
};

const DDim kActShapes[] = {{3, 5}, {2, 3, 4}, {1}, {128, 1280}};

TEST(ActivationOps, ForwardMatchesReference) {
  for (const auto& a : kActivations)
    for (const DDim& dims : kActShapes)
      for (DType dt : kFloatTypes) {
        OpCase c = UnaryCase(dims.str(), a.type, RandomTensor(dims, dt, -4, 4, 3));
        std::vector<double> want = ToDouble(c.inputs[0].second[0]);
        for (double& v : want) v = a.fn(v);
        ExpectForward(c, "Out", dims, want);
      }
}

TEST(ActivationOps, SigmoidSaturatesWithoutNaN) {
  Tensor x = Tensor::FromVector<float>({-1000, -90, 0, 90, 1000}, {5});
  auto out = RunForward(UnaryCase("extremes", "sigmoid", x))["Out"][0];
  std::vector<double> want = {0, 0, 0.5, 1, 1};
  std::vector<double> got = ToDouble(out);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-7) << "at " << i;
}

TEST(ActivationOps, GradMatchesFiniteDifferences) {
  for (const auto& a : kActivations)
    for (const DDim& dims : {DDim{3, 4}, DDim{2, 3, 2}})
      CheckGrad(UnaryCase(dims.str(), a.type, RandomTensor(dims, DType::kFloat64, -2, 2, 5)));
}

// The grad ops read Out, not X, so X can be freed after the forward pass.
TEST(ActivationOps, GradOpReadsOutNotX) {
  for (const char* type : {"tanh", "sigmoid", "relu", "softmax"}) {
    SCOPED_TRACE(type);
    Program prog;
    Block& block = prog.global_block();
    VarDesc* x = block.Var("x");
    x->set_shape({2, 3});
    x->set_dtype(DType::kFloat64);
    AppendOp(block, type, {{"X", {"x"}}}, {{"Out", {"y"}}});
    AppendOp(block, "mean", {{"X", {"y"}}}, {{"Out", {"loss"}}});
    append_backward(prog, "loss");
    const OpDesc* grad = nullptr;
    for (auto& op : block.ops())
      if (op->type() == std::string(type) + "_grad") grad = op.get();
    ASSERT_NE(grad, nullptr);
    EXPECT_FALSE(grad->HasInput("X"));
    EXPECT_EQ(grad->Input("Out"), std::vector<std::string>{"y"});
    EXPECT_EQ(grad->Output(GradVarName("X")), std::vector<std::string>{"x@GRAD"});
    EXPECT_EQ(block.FindVar("x@GRAD")->dims(), DDim({2, 3}));
    EXPECT_EQ(block.FindVar("x@GRAD")->dtype(), DType::kFloat64);
  }
}

// ------------------------------------------------------------------------------------- softmax

struct SoftmaxParams {
  std::string name;
  DDim dims;
  int axis;
  double lo, hi;  // input range
};

const SoftmaxParams kSoftmaxCases[] = {
    {"rows", {4, 5}, -1, -3, 3},
    {"rank3_last", {2, 3, 4}, 2, -3, 3},
    {"rank3_middle", {2, 3, 4}, 1, -3, 3},
    {"rank3_first", {2, 3, 4}, 0, -3, 3},
    {"rank2_axis0", {3, 4}, -2, -3, 3},
    {"one_class", {3, 1}, -1, -3, 3},
    {"huge_logits", {3, 4}, -1, 900, 1000},
    {"long_rows", {2, 20}, -1, -3, 3},  // past the short-row path
    {"mlp_head", {128, 2}, -1, -5, 5},
    {"wide", {128, 1280}, -1, -5, 5},
};

// dims split around the axis as [pre, n, post]; element (i, k, j) at (i * n + k) * post + j.
struct Split {
  int64_t pre, n, post;
};
Split SplitAt(const DDim& d, int axis) {
  if (axis < 0) axis += d.size();
  return {d.prod(0, axis), d[axis], d.prod(axis + 1, d.size())};
}

std::vector<double> NaiveSoftmax(const std::vector<double>& x, const DDim& dims, int axis) {
  Split s = SplitAt(dims, axis);
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < s.pre; ++i)
    for (int64_t j = 0; j < s.post; ++j) {
      auto at = [&](int64_t k) { return (i * s.n + k) * s.post + j; };
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t k = 0; k < s.n; ++k) mx = std::max(mx, x[at(k)]);
      for (int64_t k = 0; k < s.n; ++k) sum += std::exp(x[at(k)] - mx);
      for (int64_t k = 0; k < s.n; ++k) y[at(k)] = std::exp(x[at(k)] - mx) / sum;
    }
  return y;
}

OpCase SoftmaxCase(const SoftmaxParams& p, DType dt) {
  return UnaryCase(p.name, "softmax", RandomTensor(p.dims, dt, p.lo, p.hi, 11), {{"axis", p.axis}});
}

TEST(SoftmaxOp, ForwardMatchesReference) {
  for (const auto& p : kSoftmaxCases)
    for (DType dt : kFloatTypes) {
      OpCase c = SoftmaxCase(p, dt);
      ExpectForward(c, "Out", p.dims,
                    NaiveSoftmax(ToDouble(c.inputs[0].second[0]), p.dims, p.axis));
    }
}

TEST(SoftmaxOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kSoftmaxCases)
    if (p.dims.numel() <= 64) CheckGrad(SoftmaxCase(p, DType::kFloat64));
}

TEST(SoftmaxOp, AxisOutOfRangeIsABuildError) {
  OpCase c = UnaryCase("axis_2_rank_2", "softmax", Tensor(DType::kFloat32, {3, 4}), {{"axis", 2}});
  ExpectErrorContainsAll(ForwardError(c), {"softmax", "axis 2", "[3, 4]"});
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
    Split s = SplitAt(p.logits, p.axis);
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
      Split s = SplitAt(p.logits, p.axis);
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

// ------------------------------------------------------------------------------------------ mean

TEST(MeanOp, ForwardMatchesReference) {
  for (const DDim& dims : {DDim{1}, DDim{4, 3}, DDim{2, 3, 4}, DDim{128, 1280}})
    for (DType dt : kFloatTypes) {
      OpCase c = UnaryCase(dims.str(), "mean", RandomTensor(dims, dt, -1, 2, 41));
      double sum = 0;
      for (double v : ToDouble(c.inputs[0].second[0])) sum += v;
      ExpectForward(c, "Out", {1}, {sum / dims.numel()});
    }
}

TEST(MeanOp, GradMatchesFiniteDifferences) {
  for (const DDim& dims : {DDim{1}, DDim{4, 3}, DDim{2, 3, 4}})
    CheckGrad(UnaryCase(dims.str(), "mean", RandomTensor(dims, DType::kFloat64, -1, 1, 42)));
}

// ---------------------------------------------------------------------------- reduce_sum, _mean

struct ReduceParams {
  std::string name;
  DDim x;
  std::vector<int> dim;
  bool keep_dim, reduce_all;
  DDim out;
};

const ReduceParams kReduceCases[] = {
    {"dim0", {3, 4}, {0}, false, false, {4}},
    {"dim1", {3, 4}, {1}, false, false, {3}},
    {"dim_neg1_keep", {3, 4}, {-1}, true, false, {3, 1}},
    {"rank3_middle", {2, 3, 4}, {1}, false, false, {2, 4}},
    {"rank3_outer_two", {2, 3, 4}, {0, 2}, false, false, {3}},
    {"rank3_outer_two_keep", {2, 3, 4}, {0, -1}, true, false, {1, 3, 1}},
    {"rank3_inner_two", {2, 3, 4}, {1, 2}, false, false, {2}},
    {"rank4_alternating", {2, 3, 2, 3}, {0, 2}, false, false, {3, 3}},
    {"size1_dims", {2, 1, 3, 1}, {1, 2}, true, false, {2, 1, 1, 1}},
    {"every_dim_listed", {2, 3}, {0, 1}, false, false, {1}},
    {"reduce_all", {2, 3, 4}, {0}, false, true, {1}},
    {"reduce_all_keep", {2, 3, 4}, {0}, true, true, {1, 1, 1}},
    {"empty_dim_is_all", {2, 3}, {}, false, false, {1}},
    {"rank1", {5}, {0}, false, false, {1}},
};

// Sums x over the dims marked in `reduced`, into the row-major order of the kept dims.
std::vector<double> NaiveReduce(const std::vector<double>& x, const DDim& dims,
                                const std::vector<bool>& reduced, bool mean) {
  int64_t out_n = 1, count = 1;
  for (int d = 0; d < dims.size(); ++d) (reduced[d] ? count : out_n) *= dims[d];
  std::vector<double> out(out_n, 0.0);
  for (int64_t i = 0; i < dims.numel(); ++i) {
    int64_t rest = i, o = 0, scale = 1;
    for (int d = dims.size() - 1; d >= 0; --d) {
      int64_t idx = rest % dims[d];
      rest /= dims[d];
      if (!reduced[d]) {
        o += idx * scale;
        scale *= dims[d];
      }
    }
    out[o] += x[i];
  }
  if (mean)
    for (double& v : out) v /= count;
  return out;
}

OpCase ReduceCase(const ReduceParams& p, const std::string& type, DType dt) {
  return UnaryCase(p.name, type, RandomTensor(p.x, dt, -1, 1, 51),
                   {{"dim", p.dim}, {"keep_dim", p.keep_dim}, {"reduce_all", p.reduce_all}});
}

TEST(ReduceOps, ForwardMatchesReference) {
  for (const auto& p : kReduceCases)
    for (const std::string type : {"reduce_sum", "reduce_mean"})
      for (DType dt : kFloatTypes) {
        std::vector<bool> reduced(p.x.size(), p.reduce_all || p.dim.empty());
        for (int d : p.dim)
          if (!p.reduce_all) reduced[d < 0 ? d + p.x.size() : d] = true;
        OpCase c = ReduceCase(p, type, dt);
        ExpectForward(
            c, "Out", p.out,
            NaiveReduce(ToDouble(c.inputs[0].second[0]), p.x, reduced, type == "reduce_mean"));
      }
}

TEST(ReduceOps, IntegerSum) {
  OpCase c =
      UnaryCase("int64", "reduce_sum", Tensor::FromVector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}),
                {{"dim", std::vector<int>{1}}});
  auto out = RunForward(c)["Out"][0];
  EXPECT_EQ(out.dtype(), DType::kInt64);
  EXPECT_EQ(ToDouble(out), (std::vector<double>{6, 15}));
}

TEST(ReduceOps, GradMatchesFiniteDifferences) {
  for (const auto& p : kReduceCases)
    for (const std::string type : {"reduce_sum", "reduce_mean"})
      CheckGrad(ReduceCase(p, type, DType::kFloat64));
}

TEST(ReduceOps, DimOutOfRangeIsABuildError) {
  OpCase c = UnaryCase("dim_2_rank_2", "reduce_sum", Tensor(DType::kFloat32, {3, 4}),
                       {{"dim", std::vector<int>{2}}});
  ExpectErrorContainsAll(ForwardError(c), {"reduce_sum", "dim 2", "[3, 4]"});
}

// --------------------------------------------------------------------- fill_constant, zeros_like

OpCase NoInputCase(const std::string& name, const std::string& type, DDim dims, DType dt,
                   std::map<std::string, Attribute> attrs) {
  OpCase c;
  c.name = name;
  c.type = type;
  c.attrs = std::move(attrs);
  c.attrs["shape"] = dims.vec();
  c.attrs["dtype"] = static_cast<int>(dt);
  return c;
}

TEST(FillConstantOp, EveryDType) {
  struct P {
    DType dtype;
    float value;
    double want;
  };
  const P cases[] = {{DType::kFloat32, 2.5f, 2.5}, {DType::kFloat64, -0.25f, -0.25},
                     {DType::kInt32, 7.0f, 7},     {DType::kInt64, -3.0f, -3},
                     {DType::kBool, 1.0f, 1},      {DType::kFloat32, 0.0f, 0}};
  for (const P& p : cases) {
    OpCase c =
        NoInputCase(DTypeName(p.dtype), "fill_constant", {2, 3}, p.dtype, {{"value", p.value}});
    SCOPED_TRACE(Describe(c));
    Tensor out = RunForward(c)["Out"][0];
    EXPECT_EQ(out.dtype(), p.dtype);
    EXPECT_EQ(out.dims(), DDim({2, 3}));
    EXPECT_EQ(ToDouble(out), std::vector<double>(6, p.want));
  }
}

TEST(FillConstantOp, BadDTypeIsABuildError) {
  OpCase c = NoInputCase("dtype_99", "fill_constant", {2}, static_cast<DType>(99), {});
  ExpectErrorContainsAll(ForwardError(c), {"fill_constant", "dtype", "99"});
}

TEST(FillZerosLikeOp, ShapeAndDTypeOfX) {
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    OpCase c = UnaryCase(DTypeName(dt), "fill_zeros_like", RandomTensor({3, 2}, dt, 1, 5, 61));
    SCOPED_TRACE(Describe(c));
    Tensor out = RunForward(c)["Out"][0];
    EXPECT_EQ(out.dtype(), dt);
    EXPECT_EQ(out.dims(), DDim({3, 2}));
    EXPECT_EQ(ToDouble(out), std::vector<double>(6, 0.0));
  }
}

// -------------------------------------------------------------------------------- random ops

struct RandomParams {
  std::string type;
  std::map<std::string, Attribute> attrs;
  double mean, std;  // of the distribution
  double lo, hi;     // every value in [lo, hi)
};

const RandomParams kRandomCases[] = {
    {"uniform_random", {{"min", -1.0f}, {"max", 1.0f}}, 0.0, 2 / std::sqrt(12.0), -1, 1},
    {"uniform_random", {{"min", 2.0f}, {"max", 5.0f}}, 3.5, 3 / std::sqrt(12.0), 2, 5},
    {"gaussian_random", {{"mean", 0.0f}, {"std", 1.0f}}, 0.0, 1.0, -10, 10},
    {"gaussian_random", {{"mean", 3.0f}, {"std", 0.5f}}, 3.0, 0.5, -10, 10},
};

OpCase RandomCase(const RandomParams& p, DType dt, int seed, DDim dims = {200, 100}) {
  std::map<std::string, Attribute> attrs = p.attrs;
  attrs["seed"] = seed;
  return NoInputCase(p.type + "_seed" + std::to_string(seed), p.type, dims, dt, attrs);
}

TEST(RandomOps, SameSeedGivesIdenticalValues) {
  for (const auto& p : kRandomCases)
    for (DType dt : kFloatTypes) {
      OpCase a = RandomCase(p, dt, 42), b = RandomCase(p, dt, 42), other = RandomCase(p, dt, 43);
      SCOPED_TRACE(Describe(a));
      std::vector<double> va = ToDouble(RunForward(a)["Out"][0]);
      EXPECT_EQ(va, ToDouble(RunForward(b)["Out"][0]));
      EXPECT_NE(va, ToDouble(RunForward(other)["Out"][0]));
    }
}

TEST(RandomOps, MeanStdAndRange) {
  for (const auto& p : kRandomCases)
    for (DType dt : kFloatTypes) {
      OpCase c = RandomCase(p, dt, 7);
      SCOPED_TRACE(Describe(c));
      Tensor out = RunForward(c)["Out"][0];
      ASSERT_EQ(out.dtype(), dt);
      ASSERT_EQ(out.dims(), DDim({200, 100}));
      std::vector<double> v = ToDouble(out);
      double sum = 0, sq = 0;
      for (double x : v) {
        ASSERT_GE(x, p.lo);
        ASSERT_LT(x, p.hi);
        sum += x;
      }
      const double mean = sum / v.size();
      for (double x : v) sq += (x - mean) * (x - mean);
      const double std = std::sqrt(sq / v.size());
      // 20000 samples: the mean's standard error is std / 141.
      EXPECT_NEAR(mean, p.mean, 5 * p.std / 141);
      EXPECT_NEAR(std, p.std, 0.02 * p.std);
    }
}

TEST(RandomOps, OddSizeAndEmptyShape) {
  for (const auto& p : kRandomCases)
    for (const DDim& dims : {DDim{3}, DDim{0}, DDim{1, 1}}) {
      OpCase c = RandomCase(p, DType::kFloat32, 9, dims);
      SCOPED_TRACE(Describe(c));
      EXPECT_EQ(RunForward(c)["Out"][0].dims(), dims);
    }
}

// The engine persists in the kernel: a second run continues the stream, and a fresh executor
// with the same seed replays it from the start.
TEST(RandomOps, RunsContinueTheStreamAndReplayPerExecutor) {
  for (const char* type : {"uniform_random", "gaussian_random"}) {
    SCOPED_TRACE(type);
    Program prog;
    AppendOp(prog.global_block(), type, {}, {{"Out", {"r"}}},
             {{"shape", std::vector<int64_t>{4, 5}}, {"seed", 5}});
    Executor first, second;
    std::vector<double> a1 = ToDouble(first.Run(prog, {}, {"r"})[0]);
    std::vector<double> a2 = ToDouble(first.Run(prog, {}, {"r"})[0]);
    EXPECT_NE(a1, a2);
    EXPECT_EQ(a1, ToDouble(second.Run(prog, {}, {"r"})[0]));
    EXPECT_EQ(a2, ToDouble(second.Run(prog, {}, {"r"})[0]));
  }
}

TEST(RandomOps, ProgramSeedMakesUnseededOpsReproducible) {
  auto run = [](int64_t program_seed) {
    Program prog;
    prog.set_random_seed(program_seed);
    AppendOp(prog.global_block(), "gaussian_random", {}, {{"Out", {"r"}}},
             {{"shape", std::vector<int64_t>{8}}});
    Executor exe;
    return ToDouble(exe.Run(prog, {}, {"r"})[0]);
  };
  EXPECT_EQ(run(90), run(90));
  EXPECT_NE(run(90), run(91));
}

TEST(RandomOps, MinNotBelowMaxIsABuildError) {
  OpCase c = NoInputCase("min_eq_max", "uniform_random", {2}, DType::kFloat32,
                         {{"min", 1.0f}, {"max", 1.0f}});
  ExpectErrorContainsAll(ForwardError(c), {"uniform_random", "min", "max"});
}

// ------------------------------------------------------------------------------------------ cast

const DType kCastTypes[] = {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64,
                            DType::kBool};

// values (as double) held in a tensor of dtype `dt`, converted by static_cast.
Tensor TypedTensor(const std::vector<double>& values, DType dt) {
  Tensor t(dt, DDim{static_cast<int64_t>(values.size())});
  VisitDType(dt, [&](auto z) {
    using V = decltype(z);
    for (size_t i = 0; i < values.size(); ++i) t.data<V>()[i] = static_cast<V>(values[i]);
  });
  return t;
}

TEST(CastOp, AllPairs) {
  const std::vector<double> values = {0, 1, 2.75, -3.5, 100, -0.25};
  for (DType from : kCastTypes)
    for (DType to : kCastTypes) {
      Tensor x = TypedTensor(values, from);
      OpCase c =
          UnaryCase(std::string(DTypeName(from)) + "_to_" + DTypeName(to), "cast", x,
                    {{"in_dtype", static_cast<int>(from)}, {"out_dtype", static_cast<int>(to)}});
      SCOPED_TRACE(Describe(c));
      // Reference: static_cast from the typed input.
      std::vector<double> want;
      VisitDType(from, [&](auto zf) {
        using F = decltype(zf);
        VisitDType(to, [&](auto zt) {
          using T = decltype(zt);
          for (int64_t i = 0; i < x.numel(); ++i)
            want.push_back(static_cast<double>(static_cast<T>(x.data<F>()[i])));
        });
      });
      Tensor out = RunForward(c)["Out"][0];
      EXPECT_EQ(out.dtype(), to);
      EXPECT_EQ(out.dims(), x.dims());
      EXPECT_EQ(ToDouble(out), want);
    }
}

TEST(CastOp, GradCastsBack) {
  // float64 -> float32: the float32 round trip limits the finite differences to ~1e-4.
  for (DType to : {DType::kFloat32, DType::kFloat64})
    for (bool set_in_dtype : {true, false}) {
      OpCase c = UnaryCase(
          std::string("to_") + DTypeName(to) + (set_in_dtype ? "" : "_no_in_dtype"), "cast",
          RandomTensor({3, 4}, DType::kFloat64, -1, 1, 71), {{"out_dtype", static_cast<int>(to)}});
      if (set_in_dtype) c.attrs["in_dtype"] = static_cast<int>(DType::kFloat64);
      CheckGrad(c, 1e-2, 1e-3, 1e-3);
    }
}

TEST(CastOp, WrongInDTypeIsABuildError) {
  OpCase c = UnaryCase("in_dtype_mismatch", "cast", Tensor(DType::kFloat32, {2}),
                       {{"in_dtype", static_cast<int>(DType::kInt64)},
                        {"out_dtype", static_cast<int>(DType::kFloat64)}});
  ExpectErrorContainsAll(ForwardError(c), {"cast", "in_dtype", "int64", "float32"});
}

// --------------------------------------------------------------------------------------- reshape

struct ReshapeParams {
  std::string name;
  DDim x;
  std::vector<int> shape;
  DDim out;
};

const ReshapeParams kReshapeCases[] = {
    {"flatten_tail", {2, 3, 4}, {0, -1}, {2, 12}},    {"flatten_all", {2, 3, 4}, {-1}, {24}},
    {"copy_middle", {2, 3, 4}, {4, 0, 2}, {4, 3, 2}}, {"explicit", {2, 3, 4}, {6, 4}, {6, 4}},
    {"add_dims", {6}, {1, 2, 1, 3}, {1, 2, 1, 3}},    {"infer_first", {4, 6}, {-1, 3}, {8, 3}},
};

TEST(ReshapeOp, ForwardKeepsElementOrder) {
  for (const auto& p : kReshapeCases)
    for (DType dt : kFloatTypes) {
      OpCase c =
          UnaryCase(p.name, "reshape", RandomTensor(p.x, dt, -1, 1, 81), {{"shape", p.shape}});
      ExpectForward(c, "Out", p.out, ToDouble(c.inputs[0].second[0]));
    }
}

TEST(ReshapeOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kReshapeCases)
    CheckGrad(UnaryCase(p.name, "reshape", RandomTensor(p.x, DType::kFloat64, -1, 1, 82),
                        {{"shape", p.shape}}));
}

TEST(ReshapeOp, BadShapesAreBuildErrors) {
  struct P {
    std::string name;
    std::vector<int> shape;
    std::vector<std::string> parts;
  };
  const P cases[] = {
      {"wrong_count", {5, 5}, {"[2, 3, 4]", "[5, 5]", "24", "25"}},
      {"not_divisible", {5, -1}, {"[2, 3, 4]", "[5, -1]", "24"}},
      {"two_unknowns", {-1, -1}, {"[-1, -1]", "more than one -1"}},
      {"copy_past_rank", {0, 0, 0, 0}, {"[2, 3, 4]", "copies dim 3"}},
      {"negative", {-2, 12}, {"[-2, 12]"}},
  };
  for (const P& p : cases) {
    OpCase c =
        UnaryCase(p.name, "reshape", Tensor(DType::kFloat32, {2, 3, 4}), {{"shape", p.shape}});
    SCOPED_TRACE(Describe(c));
    std::vector<std::string> parts = p.parts;
    parts.push_back("reshape");
    ExpectErrorContainsAll(ForwardError(c), parts);
  }
}

TEST(ReshapeOp, UnknownBatchDimAtBuildTimeIsCheckedAtRunTime) {
  Program prog;
  Block& block = prog.global_block();
  VarDesc* x = block.Var("x");
  x->set_shape({-1, 6});
  x->set_is_data(true);
  AppendOp(block, "reshape", {{"X", {"x"}}}, {{"Out", {"y"}}},
           {{"shape", std::vector<int>{-1, 2, 3}}});
  AppendOp(block, "reshape", {{"X", {"x"}}}, {{"Out", {"z"}}},
           {{"shape", std::vector<int>{0, 3, 2}}});
  AppendOp(block, "reshape", {{"X", {"x"}}}, {{"Out", {"w"}}},
           {{"shape", std::vector<int>{4, -1}}});
  EXPECT_EQ(block.FindVar("y")->dims(), DDim({-1, 2, 3}));
  EXPECT_EQ(block.FindVar("z")->dims(), DDim({-1, 3, 2}));
  EXPECT_EQ(block.FindVar("w")->dims(), DDim({4, -1}));

  Executor exe;
  auto got = exe.Run(prog, {{"x", RandomTensor({2, 6}, DType::kFloat32)}}, {"y", "z", "w"});
  EXPECT_EQ(got[0].dims(), DDim({2, 2, 3}));
  EXPECT_EQ(got[1].dims(), DDim({2, 3, 2}));
  EXPECT_EQ(got[2].dims(), DDim({4, 3}));
  try {
    exe.Run(prog, {{"x", RandomTensor({3, 6}, DType::kFloat32)}}, {"w"});
    ADD_FAILURE() << "18 elements reshaped to [4, -1] did not fail";
  } catch (const Error& e) {
    ExpectErrorContainsAll(e.what(), {"reshape", "[3, 6]", "[4, -1]"});
  }
}

// ------------------------------------------------------------------------------------------- sgd

OpCase SgdCase(const std::string& name, DType dt, DDim param, DDim grad, float lr) {
  OpCase c;
  c.name = name;
  c.type = "sgd";
  Tensor rate(DType::kFloat32, {1});
  rate.data<float>()[0] = lr;
  c.inputs = {{"Param", {RandomTensor(param, dt, -1, 1, 91)}},
              {"Grad", {RandomTensor(grad, dt, -1, 1, 92)}},
              {"LearningRate", {rate}}};
  c.outputs = {{"ParamOut", 1}};
  return c;
}

TEST(SgdOp, ForwardMatchesReference) {
  for (DType dt : kFloatTypes)
    for (const DDim& dims : {DDim{5}, DDim{3, 4}, DDim{1280, 2}}) {
      OpCase c = SgdCase(dims.str(), dt, dims, dims, 0.1f);
      std::vector<double> p = ToDouble(c.inputs[0].second[0]), g = ToDouble(c.inputs[1].second[0]);
      std::vector<double> want(p.size());
      for (size_t i = 0; i < p.size(); ++i) want[i] = p[i] - static_cast<double>(0.1f) * g[i];
      ExpectForward(c, "ParamOut", dims, want);
    }
}

// ParamOut is Param's own var: the update is in place, in Param's allocation.
TEST(SgdOp, InPlaceUpdate) {
  Program prog;
  Block& block = prog.global_block();
  for (const char* n : {"w", "g", "lr"}) {
    block.Var(n)->set_is_data(true);
  }
  block.Var("w")->set_shape({2, 3});
  block.Var("g")->set_shape({2, 3});
  block.Var("lr")->set_shape({1});
  AppendOp(block, "sgd", {{"Param", {"w"}}, {"Grad", {"g"}}, {"LearningRate", {"lr"}}},
           {{"ParamOut", {"w"}}});
  Tensor w = RandomTensor({2, 3}, DType::kFloat32, -1, 1, 93);
  Tensor g = RandomTensor({2, 3}, DType::kFloat32, -1, 1, 94);
  Tensor lr = Tensor::FromVector<float>({0.5f}, {1});
  Tensor fed = w.Clone();  // the executor shares a fed tensor's memory
  Executor exe;
  std::vector<double> got = ToDouble(exe.Run(prog, {{"w", fed}, {"g", g}, {"lr", lr}}, {"w"})[0]);
  std::vector<double> wv = ToDouble(w), gv = ToDouble(g);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], wv[i] - 0.5 * gv[i]) << i;
  EXPECT_EQ(ToDouble(fed), got) << "the update did not land in Param's own allocation";
}

TEST(SgdOp, ShapeMismatchIsABuildError) {
  OpCase c = SgdCase("grad_shape", DType::kFloat32, {3, 4}, {4, 3}, 0.1f);
  ExpectErrorContainsAll(ForwardError(c), {"sgd", "[3, 4]", "[4, 3]"});
}

}  // namespace
}  // namespace keel::testing
