// Tests of ops/activation_ops.cc (the activations, gelu, leaky_relu, clip, softmax,
// log_softmax): forward values against naive reference loops (float32 and float64), gradients by
// finite differences (float64), saturation without NaN, big inputs run in pieces on the pool, and
// bad attributes reported as keel::Error at build time.
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
#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/float16.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

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

// relu and relu_grad on the 16-bit types (which select bits instead of widening and rounding)
// give, for every one of the 65536 patterns, what float32's relu gives rounded back: positive
// values and NaNs pass (relu_grad passes dout there), the rest become +0.
template <typename H>
void ExpectReluOfEveryPattern(DType dt) {
  Tensor x(dt, {65536}), g(dt, {65536});
  for (int i = 0; i < 65536; ++i) {
    x.data<H>()[i] = H::FromBits(static_cast<uint16_t>(i));
    g.data<H>()[i] = H::FromBits(static_cast<uint16_t>((i * 7 + 3) & 0x3fff));  // finite
  }
  OpCase fwd;
  fwd.type = "relu";
  fwd.inputs = {{"X", {x}}};
  const Tensor out = RunForward(fwd)["Out"][0];
  OpCase bwd;
  bwd.type = "relu_grad";
  bwd.inputs = {{"Out", {x}}, {GradVarName("Out"), {g}}};
  bwd.outputs = {{GradVarName("X"), 1}};
  const Tensor dx = RunForward(bwd)[GradVarName("X")][0];
  int checked = 0;
  for (int i = 0; i < 65536; ++i) {
    const float v = static_cast<float>(x.data<H>()[i]);
    const bool keep = v > 0 || std::isnan(v);
    const float want = keep ? v : 0.0f;
    const float got = static_cast<float>(out.data<H>()[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << i;
    } else {
      EXPECT_EQ(out.data<H>()[i].bits, H(want).bits) << i;
    }
    EXPECT_EQ(dx.data<H>()[i].bits, keep ? g.data<H>()[i].bits : uint16_t{0}) << i;
    ++checked;
  }
  EXPECT_EQ(checked, 65536);
}

TEST(ActivationOps, ReluOfEverySixteenBitPatternIsFloat32sRelu) {
  ExpectReluOfEveryPattern<bfloat16>(DType::kBFloat16);
  ExpectReluOfEveryPattern<float16>(DType::kFloat16);
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

// ------------------------------------------------------------------- gelu, leaky_relu, clip

struct ElementwiseParams {
  std::string name, type;
  std::map<std::string, Attribute> attrs;
  std::function<double(double)> fn;
};

const double kPi = 3.14159265358979323846;

const ElementwiseParams kElementwise[] = {
    {"gelu_erf", "gelu", {}, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
    {"gelu_tanh",
     "gelu",
     {{"approximate", true}},
     [](double x) {
       return 0.5 * x * (1 + std::tanh(std::sqrt(2 / kPi) * (x + 0.044715 * x * x * x)));
     }},
    {"leaky_relu_default",
     "leaky_relu",
     {},
     [](double x) { return x > 0 ? x : double(0.02f) * x; }},
    {"leaky_relu_0.3",
     "leaky_relu",
     {{"alpha", 0.3f}},
     [](double x) { return x > 0 ? x : double(0.3f) * x; }},
    {"clip",
     "clip",
     {{"min", -0.5f}, {"max", 0.75f}},
     [](double x) { return std::min(std::max(x, -0.5), 0.75); }},
};

TEST(ElementwiseActivations, ForwardMatchesReference) {
  for (const auto& p : kElementwise)
    for (const DDim& dims : {DDim{3, 5}, DDim{2, 3, 4}, DDim{1}, DDim{64, 130}})
      for (DType dt : kFloatTypes) {
        OpCase c =
            UnaryCase(p.name + dims.str(), p.type, RandomTensor(dims, dt, -4, 4, 3), p.attrs);
        std::vector<double> want = ToDouble(c.inputs[0].second[0]);
        for (double& v : want) v = p.fn(v);
        ExpectForward(c, "Out", dims, want);
      }
}

// Big inputs are cut into pieces (gelu's smaller than the others', for its erf and exp), the last
// one shorter, that run on the pool: every element is still computed, as on one thread.
TEST(ElementwiseActivations, BigInputsRunInPiecesOnThePoolAndMatchTheReference) {
  cpu_threads::SetBudget(4);
  const DDim dims{3, 100003};  // 2.3 pieces of 128 K elements, 9.2 of gelu's 32 K
  for (const auto& p : kElementwise) {
    OpCase c = UnaryCase(p.name, p.type, RandomTensor(dims, DType::kFloat32, -4, 4, 7), p.attrs);
    std::vector<double> want = ToDouble(c.inputs[0].second[0]);
    for (double& v : want) v = p.fn(v);
    const int64_t before = cpu_threads::SplitCalls();
    ExpectForward(c, "Out", dims, want);
    EXPECT_GT(cpu_threads::SplitCalls(), before) << p.name << " ran in one piece";
    // The gradient kernels share the cut: 4 threads give one thread's bits.
    OpCase g =
        UnaryCase(p.name + "_grad", p.type, RandomTensor(dims, DType::kFloat32, -4, 4, 8), p.attrs);
    auto grads = [&] {
      std::vector<Tensor> v;
      for (auto& kv : RunGrads(g, CPUPlace())) v.push_back(kv.second);
      return v;
    };
    cpu_threads::SetBudget(1);
    const std::vector<Tensor> one = grads();
    cpu_threads::SetBudget(4);
    EXPECT_TRUE(SameBits(one, grads())) << p.name;
  }
  cpu_threads::SetBudget(1);
}

TEST(ElementwiseActivations, GradMatchesFiniteDifferences) {
  for (const auto& p : kElementwise)
    for (const DDim& dims : {DDim{3, 4}, DDim{2, 3, 2}})
      CheckGrad(UnaryCase(p.name + dims.str(), p.type,
                          RandomTensor(dims, DType::kFloat64, -2, 2, 5), p.attrs));
}

TEST(ElementwiseActivations, GeluGradAtLargeMagnitudes) {
  // Far from 0 gelu is x or 0: the gradient is 1 or 0 without NaN.
  for (bool approximate : {false, true})
    CheckGrad(UnaryCase(approximate ? "tanh" : "erf", "gelu",
                        Tensor::FromVector<double>({-30, -8, 8, 30}, {4}),
                        {{"approximate", approximate}}));
}

TEST(ClipOp, MinAboveMaxIsABuildError) {
  OpCase c = UnaryCase("min_gt_max", "clip", Tensor(DType::kFloat32, {2, 3}),
                       {{"min", 1.0f}, {"max", -1.0f}});
  ExpectErrorContainsAll(ForwardError(c), {"clip", "min 1", "max -1"});
}

TEST(ClipOp, MissingBoundIsAnError) {
  OpCase c = UnaryCase("no_max", "clip", Tensor(DType::kFloat32, {2, 3}), {{"min", 1.0f}});
  ExpectErrorContainsAll(ForwardError(c), {"clip", "max"});
}

// ---------------------------------------------------------------------------------- log_softmax

struct LogSoftmaxParams {
  std::string name;
  DDim dims;
  int axis;
  double lo, hi;
};

const LogSoftmaxParams kLogSoftmaxCases[] = {
    {"rows", {4, 5}, -1, -3, 3},
    {"rank3_last", {2, 3, 4}, 2, -3, 3},
    {"rank3_middle", {2, 3, 4}, 1, -3, 3},
    {"rank3_first", {2, 3, 4}, 0, -3, 3},
    {"one_class", {3, 1}, -1, -3, 3},
    {"huge_logits", {3, 4}, -1, 900, 1000},
    {"tiny_logits", {3, 4}, -1, -1000, -900},
    {"wide", {16, 1000}, -1, -5, 5},
};

std::vector<double> NaiveLogSoftmax(const std::vector<double>& x, const DDim& dims, int axis) {
  axis = CanonicalAxis(axis, dims.size());
  const int64_t pre = dims.prod(0, axis), n = dims[axis], post = dims.prod(axis + 1, dims.size());
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < pre; ++i)
    for (int64_t j = 0; j < post; ++j) {
      auto at = [&](int64_t k) { return (i * n + k) * post + j; };
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t k = 0; k < n; ++k) mx = std::max(mx, x[at(k)]);
      for (int64_t k = 0; k < n; ++k) sum += std::exp(x[at(k)] - mx);
      for (int64_t k = 0; k < n; ++k) y[at(k)] = x[at(k)] - mx - std::log(sum);
    }
  return y;
}

OpCase LogSoftmaxCase(const LogSoftmaxParams& p, DType dt) {
  return UnaryCase(p.name, "log_softmax", RandomTensor(p.dims, dt, p.lo, p.hi, 11),
                   {{"axis", p.axis}});
}

TEST(LogSoftmaxOp, ForwardMatchesReference) {
  for (const auto& p : kLogSoftmaxCases)
    for (DType dt : kFloatTypes) {
      OpCase c = LogSoftmaxCase(p, dt);
      ExpectForward(c, "Out", p.dims,
                    NaiveLogSoftmax(ToDouble(c.inputs[0].second[0]), p.dims, p.axis));
    }
}

TEST(LogSoftmaxOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kLogSoftmaxCases)
    if (p.dims.numel() <= 64) CheckGrad(LogSoftmaxCase(p, DType::kFloat64));
}

TEST(LogSoftmaxOp, AxisOutOfRangeIsABuildError) {
  OpCase c = UnaryCase("axis_2", "log_softmax", Tensor(DType::kFloat32, {3, 4}), {{"axis", 2}});
  ExpectErrorContainsAll(ForwardError(c), {"log_softmax", "axis 2", "[3, 4]"});
}
}  // namespace
}  // namespace keel::testing
