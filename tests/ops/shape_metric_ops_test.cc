// Tests of ops/shape_ops.cc, ops/metric_ops.cc, the gelu/leaky_relu/log_softmax/clip ops of
// ops/activation_ops.cc and the layers of framework/dsl/tensor_layers.h: forward values against
// naive reference loops (float32 and float64, int types where registered), gradients by finite
// differences (float64), and bad shapes / ids reported as keel::Error naming the op and shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/autodiff/backward.h"
#include "framework/dsl/program_guard.h"
#include "framework/dsl/tensor_layers.h"
#include "framework/error.h"
#include "framework/runtime/cpu_threads.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64};

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

// Row-major multi-index of flat index `flat` in `d`, and back.
std::vector<int64_t> Unravel(int64_t flat, const DDim& d) {
  std::vector<int64_t> idx(d.size());
  for (int i = d.size() - 1; i >= 0; --i) {
    idx[i] = flat % d[i];
    flat /= d[i];
  }
  return idx;
}
int64_t Ravel(const std::vector<int64_t>& idx, const DDim& d) {
  int64_t flat = 0;
  for (int i = 0; i < d.size(); ++i) flat = flat * d[i] + idx[i];
  return flat;
}

int Canon(int axis, int rank) { return axis < 0 ? axis + rank : axis; }

// A random tensor of integers in [lo, hi] (as dtype), so int kernels and exact ties get tested.
Tensor RandomInts(const DDim& dims, DType dtype, int lo, int hi, uint64_t seed) {
  Tensor r = RandomTensor(dims, DType::kFloat64, lo, hi + 1, seed);
  Tensor t(dtype, dims);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = std::floor(r.data<double>()[i]);
    VisitDType(dtype, [&](auto z) {
      using V = decltype(z);
      t.data<V>()[i] = static_cast<V>(v);
    });
  }
  return t;
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
    OpCase g = UnaryCase(p.name + "_grad", p.type, RandomTensor(dims, DType::kFloat32, -4, 4, 8),
                         p.attrs);
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
  axis = Canon(axis, dims.size());
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

// --------------------------------------------------------------------------------- lookup_table

struct LookupParams {
  std::string name;
  DDim w;                    // [V, D]
  DDim ids_dims;             // [..., 1]
  std::vector<int64_t> ids;  // may repeat; padding_idx rows read as zeros
  int64_t padding_idx;
};

const LookupParams kLookupCases[] = {
    {"plain", {5, 3}, {4, 1}, {0, 4, 2, 2}, -1},
    {"padding_2", {5, 3}, {6, 1}, {2, 1, 2, 4, 0, 1}, 2},
    {"padding_0", {6, 4}, {3, 1}, {0, 5, 0}, 0},
    {"rank3_ids", {7, 2}, {2, 3, 1}, {6, 0, 3, 3, 1, 6}, -1},
    {"one_row", {1, 5}, {2, 1}, {0, 0}, -1},
};

OpCase LookupCase(const LookupParams& p, DType dt) {
  OpCase c;
  c.name = p.name;
  c.type = "lookup_table";
  c.inputs = {{"W", {RandomTensor(p.w, dt, -1, 1, 31)}},
              {"Ids", {Tensor::FromVector(p.ids, p.ids_dims)}}};
  c.attrs = {{"padding_idx", p.padding_idx}};
  c.no_grad_inputs = {"Ids"};
  return c;
}

TEST(LookupTableOp, ForwardMatchesReference) {
  for (const auto& p : kLookupCases)
    for (DType dt : kFloatTypes) {
      OpCase c = LookupCase(p, dt);
      std::vector<double> w = ToDouble(c.inputs[0].second[0]);
      const int64_t D = p.w[1];
      std::vector<double> want;
      for (int64_t id : p.ids)
        for (int64_t j = 0; j < D; ++j) want.push_back(id == p.padding_idx ? 0.0 : w[id * D + j]);
      DDim out = p.ids_dims;
      out[out.size() - 1] = D;
      ExpectOutputNear(c, "Out", out, want, {0, /*dtype_of_first_input=*/true});
    }
}

// W only (Ids is int64); the padding row's gradient is zero, which the numeric check confirms.
TEST(LookupTableOp, GradWrtWMatchesFiniteDifferences) {
  for (const auto& p : kLookupCases) CheckGrad(LookupCase(p, DType::kFloat64));
}

TEST(LookupTableOp, IdOutOfRangeIsARunError) {
  for (int64_t bad : {5, -3}) {
    OpCase c = LookupCase(kLookupCases[0], DType::kFloat32);
    c.name = "id_" + std::to_string(bad);
    c.inputs[1].second[0] = Tensor::FromVector<int64_t>({0, 1, bad, 2}, {4, 1});
    SCOPED_TRACE(Describe(c));
    ExpectErrorContainsAll(ForwardError(c), {"lookup_table", "Ids value " + std::to_string(bad),
                                             "index 2", "[0, 5)", "[5, 3]"});
  }
}

TEST(LookupTableOp, BadShapesAreBuildErrors) {
  OpCase c = LookupCase(kLookupCases[0], DType::kFloat32);
  c.name = "ids_last_dim_2";
  c.inputs[1].second[0] = Tensor::FromVector<int64_t>({0, 1, 2, 3}, {2, 2});
  ExpectErrorContainsAll(ForwardError(c), {"lookup_table", "[2, 2]", "[..., 1]"});

  c = LookupCase(kLookupCases[0], DType::kFloat32);
  c.name = "w_rank_1";
  c.inputs[0].second[0] = RandomTensor({5}, DType::kFloat32);
  ExpectErrorContainsAll(ForwardError(c), {"lookup_table", "W", "[5]"});

  c = LookupCase(kLookupCases[0], DType::kFloat32);
  c.name = "ids_int32";
  c.inputs[1].second[0] = Tensor::FromVector<int32_t>({0, 1, 2, 3}, {4, 1});
  ExpectErrorContainsAll(ForwardError(c), {"lookup_table", "int64", "int32"});

  c = LookupCase(kLookupCases[0], DType::kFloat32);
  c.name = "padding_idx_5";
  c.attrs["padding_idx"] = int64_t{5};
  ExpectErrorContainsAll(ForwardError(c), {"lookup_table", "padding_idx 5", "[5, 3]"});
}

// ---------------------------------------------------------------------------------------- concat

struct ConcatParams {
  std::string name;
  std::vector<DDim> xs;
  int axis;
};

const ConcatParams kConcatCases[] = {
    {"rows", {{2, 3}, {4, 3}}, 0},
    {"cols", {{2, 3}, {2, 1}, {2, 4}}, 1},
    {"last_negative", {{2, 2, 3}, {2, 2, 1}}, -1},
    {"rank3_middle", {{2, 1, 3}, {2, 4, 3}, {2, 2, 3}}, 1},
    {"single", {{3, 2}}, 0},
    {"rank1", {{3}, {2}}, 0},
};

OpCase ConcatCase(const ConcatParams& p, DType dt) {
  OpCase c;
  c.name = p.name;
  c.type = "concat";
  std::vector<Tensor> xs;
  uint64_t seed = 40;
  for (const DDim& d : p.xs)
    xs.push_back(dt == DType::kInt64 || dt == DType::kInt32 ? RandomInts(d, dt, -50, 50, seed++)
                                                            : RandomTensor(d, dt, -1, 1, seed++));
  c.inputs = {{"X", xs}};
  c.attrs = {{"axis", p.axis}};
  return c;
}

// The concatenation by multi-index: X[k]'s element idx lands at idx with idx[axis] + offset_k.
DDim NaiveConcat(const std::vector<std::vector<double>>& xs, const std::vector<DDim>& dims,
                 int axis, std::vector<double>* out) {
  const int a = Canon(axis, dims[0].size());
  DDim od = dims[0];
  for (size_t k = 1; k < dims.size(); ++k) od[a] += dims[k][a];
  out->assign(od.numel(), 0);
  int64_t off = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    for (int64_t e = 0; e < dims[k].numel(); ++e) {
      std::vector<int64_t> idx = Unravel(e, dims[k]);
      idx[a] += off;
      (*out)[Ravel(idx, od)] = xs[k][e];
    }
    off += dims[k][a];
  }
  return od;
}

TEST(ConcatOp, ForwardMatchesReference) {
  for (const auto& p : kConcatCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      OpCase c = ConcatCase(p, dt);
      std::vector<std::vector<double>> xs;
      for (const Tensor& t : c.inputs[0].second) xs.push_back(ToDouble(t));
      std::vector<double> want;
      DDim od = NaiveConcat(xs, p.xs, p.axis, &want);
      ExpectOutputNear(c, "Out", od, want, {0, /*dtype_of_first_input=*/true});
    }
}

TEST(ConcatOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kConcatCases) CheckGrad(ConcatCase(p, DType::kFloat64));
}

TEST(ConcatOp, MismatchedShapesAreBuildErrors) {
  ConcatParams p{"dim0_differs", {{2, 3}, {3, 4}}, 1};
  ExpectErrorContainsAll(ForwardError(ConcatCase(p, DType::kFloat32)),
                         {"concat", "X[1] [3, 4]", "X[0] [2, 3]", "axis 1"});
  p = {"rank_differs", {{2, 3}, {2, 3, 1}}, 0};
  ExpectErrorContainsAll(ForwardError(ConcatCase(p, DType::kFloat32)),
                         {"concat", "[2, 3, 1]", "[2, 3]"});
  p = {"axis_2", {{2, 3}, {2, 3}}, 2};
  ExpectErrorContainsAll(ForwardError(ConcatCase(p, DType::kFloat32)),
                         {"concat", "axis 2", "[2, 3]"});
}

TEST(ConcatOp, UnknownBatchDimPassesBuildTimeCheck) {
  Program prog;
  Block& block = prog.global_block();
  block.Var("a")->set_shape({-1, 3});
  block.Var("b")->set_shape({-1, 5});
  AppendOp(block, "concat", {{"X", {"a", "b"}}}, {{"Out", {"c"}}}, {{"axis", 1}});
  EXPECT_EQ(block.FindVar("c")->dims(), DDim({-1, 8}));
  AppendOp(block, "concat", {{"X", {"a", "a"}}}, {{"Out", {"d"}}}, {{"axis", 0}});
  EXPECT_EQ(block.FindVar("d")->dims(), DDim({-1, 3}));
}

// ----------------------------------------------------------------------------------------- split

struct SplitParams {
  std::string name;
  DDim x;
  int num;
  std::vector<int> sections;
  int axis;
  std::vector<int64_t> sizes;  // expected sizes along axis
};

const SplitParams kSplitCases[] = {
    {"num_rows", {6, 2}, 3, {}, 0, {2, 2, 2}},
    {"num_cols", {2, 6}, 2, {}, 1, {3, 3}},
    {"sections", {2, 6}, 0, {1, 3, 2}, 1, {1, 3, 2}},
    {"sections_infer", {2, 6}, 0, {1, -1, 2}, -1, {1, 3, 2}},
    {"rank3_middle", {2, 5, 3}, 0, {2, 3}, 1, {2, 3}},
    {"zero_section", {2, 4}, 0, {0, 4}, 1, {0, 4}},
};

OpCase SplitCase(const SplitParams& p, DType dt) {
  OpCase c =
      UnaryCase(p.name, "split",
                dt == DType::kInt64 || dt == DType::kInt32 ? RandomInts(p.x, dt, -9, 9, 51)
                                                           : RandomTensor(p.x, dt, -1, 1, 51),
                {{"num", p.num}, {"sections", p.sections}, {"axis", p.axis}});
  c.outputs = {{"Out", static_cast<int>(p.sizes.size())}};
  return c;
}

TEST(SplitOp, ForwardMatchesReference) {
  for (const auto& p : kSplitCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      OpCase c = SplitCase(p, dt);
      SCOPED_TRACE(Describe(c));
      std::vector<double> x = ToDouble(c.inputs[0].second[0]);
      auto outs = RunForward(c)["Out"];
      ASSERT_EQ(outs.size(), p.sizes.size());
      const int a = Canon(p.axis, p.x.size());
      int64_t off = 0;
      for (size_t k = 0; k < outs.size(); ++k) {
        DDim od = p.x;
        od[a] = p.sizes[k];
        ASSERT_EQ(outs[k].dims(), od) << "Out[" << k << "]";
        ASSERT_EQ(outs[k].dtype(), dt);
        std::vector<double> got = ToDouble(outs[k]);
        for (int64_t e = 0; e < od.numel(); ++e) {
          std::vector<int64_t> idx = Unravel(e, od);
          idx[a] += off;
          ASSERT_EQ(got[e], x[Ravel(idx, p.x)]) << "Out[" << k << "] at " << e;
        }
        off += p.sizes[k];
      }
    }
}

TEST(SplitOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kSplitCases) CheckGrad(SplitCase(p, DType::kFloat64));
}

TEST(SplitOp, BadPartsAreBuildErrors) {
  SplitParams p{"num_4_of_6", {2, 6}, 4, {}, 1, {1, 1, 1, 1}};
  ExpectErrorContainsAll(ForwardError(SplitCase(p, DType::kFloat32)), {"split", "[2, 6]", "num 4"});
  p = {"sections_sum_5", {2, 6}, 0, {2, 3}, 1, {2, 3}};
  ExpectErrorContainsAll(ForwardError(SplitCase(p, DType::kFloat32)),
                         {"split", "[2, 3]", "sum to 5", "[2, 6]"});
  p = {"num_vs_outputs", {2, 6}, 3, {}, 1, {3, 3}};
  ExpectErrorContainsAll(ForwardError(SplitCase(p, DType::kFloat32)), {"split", "num 3", "2 Out"});
  p = {"axis_2", {2, 6}, 2, {}, 2, {3, 3}};
  ExpectErrorContainsAll(ForwardError(SplitCase(p, DType::kFloat32)),
                         {"split", "axis 2", "[2, 6]"});
}

// ------------------------------------------------------------------------------------- transpose

struct TransposeParams {
  std::string name;
  DDim x;
  std::vector<int> perm;
};

const TransposeParams kTransposeCases[] = {
    {"matrix", {3, 4}, {1, 0}},
    {"identity", {3, 4}, {0, 1}},
    {"rank3", {2, 3, 4}, {2, 0, 1}},
    {"rank3_swap_last", {2, 3, 4}, {0, 2, 1}},
    {"rank4", {2, 3, 1, 4}, {3, 1, 0, 2}},
    {"rank1", {5}, {0}},
};

OpCase TransposeCase(const TransposeParams& p, DType dt) {
  return UnaryCase(p.name, "transpose",
                   dt == DType::kInt64 || dt == DType::kInt32 ? RandomInts(p.x, dt, -99, 99, 61)
                                                              : RandomTensor(p.x, dt, -1, 1, 61),
                   {{"axis", p.perm}});
}

TEST(TransposeOp, ForwardMatchesReference) {
  for (const auto& p : kTransposeCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      OpCase c = TransposeCase(p, dt);
      std::vector<double> x = ToDouble(c.inputs[0].second[0]);
      DDim od = p.x;
      for (size_t i = 0; i < p.perm.size(); ++i) od[i] = p.x[p.perm[i]];
      std::vector<double> want(x.size());
      for (int64_t e = 0; e < od.numel(); ++e) {
        std::vector<int64_t> oi = Unravel(e, od), xi(p.perm.size());
        for (size_t i = 0; i < p.perm.size(); ++i) xi[p.perm[i]] = oi[i];
        want[e] = x[Ravel(xi, p.x)];
      }
      ExpectOutputNear(c, "Out", od, want, {0, /*dtype_of_first_input=*/true});
    }
}

TEST(TransposeOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kTransposeCases) CheckGrad(TransposeCase(p, DType::kFloat64));
}

TEST(TransposeOp, NotAPermutationIsABuildError) {
  for (const auto& perm :
       {std::vector<int>{0, 0, 1}, std::vector<int>{0, 1}, std::vector<int>{0, 1, 3}}) {
    TransposeParams p{"bad_perm", {2, 3, 4}, perm};
    ExpectErrorContainsAll(ForwardError(TransposeCase(p, DType::kFloat32)),
                           {"transpose", "permutation", "[2, 3, 4]"});
  }
}

// ----------------------------------------------------------------- flatten, unsqueeze, squeeze

struct ReshapeLikeParams {
  std::string name, type;
  DDim x;
  std::map<std::string, Attribute> attrs;
  DDim out;
};

const ReshapeLikeParams kReshapeLikeCases[] = {
    {"flatten_1", "flatten", {2, 3, 4}, {{"axis", 1}}, {2, 12}},
    {"flatten_0", "flatten", {2, 3, 4}, {{"axis", 0}}, {1, 24}},
    {"flatten_2", "flatten", {2, 3, 4}, {{"axis", 2}}, {6, 4}},
    {"flatten_3", "flatten", {2, 3, 4}, {{"axis", 3}}, {24, 1}},
    {"flatten_default", "flatten", {5, 2, 2}, {}, {5, 4}},
    {"unsqueeze_front", "unsqueeze", {3, 4}, {{"axes", std::vector<int>{0}}}, {1, 3, 4}},
    {"unsqueeze_back", "unsqueeze", {3, 4}, {{"axes", std::vector<int>{-1}}}, {3, 4, 1}},
    {"unsqueeze_both", "unsqueeze", {3, 4}, {{"axes", std::vector<int>{0, -1}}}, {1, 3, 4, 1}},
    {"unsqueeze_twice_mid", "unsqueeze", {3, 4}, {{"axes", std::vector<int>{1, 1}}}, {3, 1, 1, 4}},
    {"squeeze_all", "squeeze", {1, 3, 1, 4}, {}, {3, 4}},
    {"squeeze_axis0", "squeeze", {1, 3, 1, 4}, {{"axes", std::vector<int>{0}}}, {3, 1, 4}},
    {"squeeze_negative", "squeeze", {1, 3, 1, 4}, {{"axes", std::vector<int>{-2}}}, {1, 3, 4}},
    {"squeeze_to_scalar", "squeeze", {1, 1}, {}, {}},
};

OpCase ReshapeLikeCase(const ReshapeLikeParams& p, DType dt) {
  return UnaryCase(p.name, p.type,
                   dt == DType::kInt64 || dt == DType::kInt32 ? RandomInts(p.x, dt, -99, 99, 71)
                                                              : RandomTensor(p.x, dt, -1, 1, 71),
                   p.attrs);
}

TEST(ReshapeLikeOps, ForwardKeepsElementsInNewShape) {
  for (const auto& p : kReshapeLikeCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      OpCase c = ReshapeLikeCase(p, dt);
      ExpectOutputNear(c, "Out", p.out, ToDouble(c.inputs[0].second[0]),
                       {0, /*dtype_of_first_input=*/true});
    }
}

TEST(ReshapeLikeOps, GradMatchesFiniteDifferences) {
  for (const auto& p : kReshapeLikeCases) CheckGrad(ReshapeLikeCase(p, DType::kFloat64));
}

TEST(ReshapeLikeOps, BadAxesAreBuildErrors) {
  struct Bad {
    ReshapeLikeParams p;
    std::vector<std::string> parts;
  };
  const Bad bad[] = {
      {{"flatten_4", "flatten", {2, 3, 4}, {{"axis", 4}}, {}}, {"flatten", "axis 4", "[2, 3, 4]"}},
      {{"flatten_neg", "flatten", {2, 3}, {{"axis", -1}}, {}}, {"flatten", "axis -1", "[2, 3]"}},
      {{"unsqueeze_4", "unsqueeze", {2, 3}, {{"axes", std::vector<int>{4}}}, {}},
       {"unsqueeze", "axis 4", "[2, 3]"}},
      {{"unsqueeze_empty", "unsqueeze", {2, 3}, {{"axes", std::vector<int>{}}}, {}},
       {"unsqueeze", "empty", "[2, 3]"}},
      {{"squeeze_not_1", "squeeze", {2, 1, 3}, {{"axes", std::vector<int>{0}}}, {}},
       {"squeeze", "axis 0", "[2, 1, 3]", "size 2"}},
      {{"squeeze_3", "squeeze", {2, 1, 3}, {{"axes", std::vector<int>{3}}}, {}},
       {"squeeze", "axis 3", "[2, 1, 3]"}},
  };
  for (const auto& b : bad)
    ExpectErrorContainsAll(ForwardError(ReshapeLikeCase(b.p, DType::kFloat32)), b.parts);
}

TEST(ReshapeLikeOps, UnknownBatchDimAtBuildTime) {
  Program prog;
  Block& block = prog.global_block();
  block.Var("x")->set_shape({-1, 1, 3, 4});
  AppendOp(block, "flatten", {{"X", {"x"}}}, {{"Out", {"f1"}}}, {{"axis", 1}});
  EXPECT_EQ(block.FindVar("f1")->dims(), DDim({-1, 12}));
  AppendOp(block, "flatten", {{"X", {"x"}}}, {{"Out", {"f2"}}}, {{"axis", 2}});
  EXPECT_EQ(block.FindVar("f2")->dims(), DDim({-1, 12}));
  AppendOp(block, "squeeze", {{"X", {"x"}}}, {{"Out", {"s"}}}, {});
  EXPECT_EQ(block.FindVar("s")->dims(), DDim({-1, 3, 4}));
  AppendOp(block, "unsqueeze", {{"X", {"x"}}}, {{"Out", {"u"}}}, {{"axes", std::vector<int>{1}}});
  EXPECT_EQ(block.FindVar("u")->dims(), DDim({-1, 1, 1, 3, 4}));
  AppendOp(block, "transpose", {{"X", {"x"}}}, {{"Out", {"t"}}},
           {{"axis", std::vector<int>{3, 0, 1, 2}}});
  EXPECT_EQ(block.FindVar("t")->dims(), DDim({4, -1, 1, 3}));
}

// ----------------------------------------------------------------------------------------- top_k

struct TopKParams {
  std::string name;
  DDim x;
  int k;
};

const TopKParams kTopKCases[] = {
    {"rows", {5, 7}, 3},     {"all", {4, 6}, 6}, {"one", {3, 10}, 1},
    {"rank3", {2, 3, 5}, 2}, {"rank1", {9}, 4},  {"wide", {4, 1000}, 5},
};

OpCase TopKCase(const TopKParams& p, DType dt) {
  OpCase c = UnaryCase(p.name, "top_k",
                       dt == DType::kInt64 || dt == DType::kInt32
                           ? RandomInts(p.x, dt, 0, 4, 81)  // many ties
                           : RandomTensor(p.x, dt, -1, 1, 81),
                       {{"k", p.k}});
  c.outputs = {{"Out", 1}, {"Indices", 1}};
  return c;
}

TEST(TopKOp, ForwardMatchesReference) {
  for (const auto& p : kTopKCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      OpCase c = TopKCase(p, dt);
      std::vector<double> x = ToDouble(c.inputs[0].second[0]);
      const int64_t n = p.x[p.x.size() - 1], rows = p.x.numel() / n;
      std::vector<double> values, indices;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int64_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        // Larger first; equal values keep index order.
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return x[r * n + a] > x[r * n + b]; });
        for (int j = 0; j < p.k; ++j) {
          values.push_back(x[r * n + order[j]]);
          indices.push_back(static_cast<double>(order[j]));
        }
      }
      DDim od = p.x;
      od[od.size() - 1] = p.k;
      ExpectOutputNear(c, "Out", od, values, {0, /*dtype_of_first_input=*/true});
      ExpectOutputNear(c, "Indices", od, indices, {0});
      EXPECT_EQ(RunForward(c)["Indices"][0].dtype(), DType::kInt64);
    }
}

TEST(TopKOp, NaNRanksFirst) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  OpCase c =
      UnaryCase("nan", "top_k", Tensor::FromVector<double>({1, nan, 3, 2}, {1, 4}), {{"k", 2}});
  c.outputs = {{"Out", 1}, {"Indices", 1}};
  auto out = RunForward(c);
  EXPECT_EQ(ToDouble(out["Indices"][0]), (std::vector<double>{1, 2}));
}

TEST(TopKOp, KOutOfRangeIsABuildError) {
  for (int k : {8, 0}) {
    TopKParams p{"k_" + std::to_string(k), {5, 7}, k};
    ExpectErrorContainsAll(ForwardError(TopKCase(p, DType::kFloat32)),
                           {"top_k", "k " + std::to_string(k), "[5, 7]"});
  }
}

// --------------------------------------------------------------------------------------- arg_max

struct ArgMaxParams {
  std::string name;
  DDim x;
  int64_t axis;
  bool keepdims;
  DDim out;
};

const ArgMaxParams kArgMaxCases[] = {
    {"rows", {4, 6}, -1, false, {4}},
    {"cols", {4, 6}, 0, false, {6}},
    {"keepdims", {4, 6}, 1, true, {4, 1}},
    {"rank3_middle", {2, 5, 3}, 1, false, {2, 3}},
    {"rank3_first_keep", {2, 5, 3}, 0, true, {1, 5, 3}},
    {"rank1", {7}, 0, false, {1}},
};

TEST(ArgMaxOp, ForwardMatchesReference) {
  for (const auto& p : kArgMaxCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      Tensor x = dt == DType::kInt64 || dt == DType::kInt32 ? RandomInts(p.x, dt, 0, 3, 91)
                                                            : RandomTensor(p.x, dt, -1, 1, 91);
      OpCase c = UnaryCase(p.name, "arg_max", x, {{"axis", p.axis}, {"keepdims", p.keepdims}});
      std::vector<double> xv = ToDouble(x);
      const int a = Canon(static_cast<int>(p.axis), p.x.size());
      const int64_t pre = p.x.prod(0, a), n = p.x[a], post = p.x.prod(a + 1, p.x.size());
      std::vector<double> want;
      for (int64_t i = 0; i < pre; ++i)
        for (int64_t j = 0; j < post; ++j) {
          int64_t best = 0;  // the first of equal maxima
          for (int64_t k = 1; k < n; ++k)
            if (xv[(i * n + k) * post + j] > xv[(i * n + best) * post + j]) best = k;
          want.push_back(static_cast<double>(best));
        }
      ExpectOutputNear(c, "Out", p.out, want, {0});
      EXPECT_EQ(RunForward(c)["Out"][0].dtype(), DType::kInt64);
    }
}

TEST(ArgMaxOp, AxisOutOfRangeIsABuildError) {
  OpCase c =
      UnaryCase("axis_2", "arg_max", Tensor(DType::kFloat32, {3, 4}), {{"axis", int64_t{2}}});
  ExpectErrorContainsAll(ForwardError(c), {"arg_max", "axis 2", "[3, 4]"});
}

// -------------------------------------------------------------------------------------- accuracy

OpCase AccuracyCase(const std::string& name, Tensor indices, Tensor label) {
  OpCase c;
  c.name = name;
  c.type = "accuracy";
  c.inputs = {{"Out", {RandomTensor(indices.dims(), DType::kFloat32, 0, 1, 3)}},
              {"Indices", {std::move(indices)}},
              {"Label", {std::move(label)}}};
  c.outputs = {{"Accuracy", 1}, {"Correct", 1}, {"Total", 1}};
  return c;
}

TEST(AccuracyOp, CountsRowsWithLabelAmongTopK) {
  // Rows 0, 2, 3 hold their label among the indices; row 1 does not.
  OpCase c = AccuracyCase("top2", Tensor::FromVector<int64_t>({1, 2, 0, 3, 2, 1, 3, 0}, {4, 2}),
                          Tensor::FromVector<int64_t>({2, 1, 1, 0}, {4, 1}));
  auto out = RunForward(c);
  EXPECT_EQ(out["Accuracy"][0].dtype(), DType::kFloat32);
  EXPECT_EQ(out["Accuracy"][0].dims(), DDim({1}));
  EXPECT_FLOAT_EQ(out["Accuracy"][0].item<float>(), 0.75f);
  EXPECT_EQ(out["Correct"][0].dtype(), DType::kInt32);
  EXPECT_EQ(out["Correct"][0].item<int>(), 3);
  EXPECT_EQ(out["Total"][0].dtype(), DType::kInt32);
  EXPECT_EQ(out["Total"][0].item<int>(), 4);
}

TEST(AccuracyOp, MatchesNaiveCountOnRandomRows) {
  const int64_t N = 50, k = 3, classes = 6;
  Tensor idx = RandomInts({N, k}, DType::kInt64, 0, classes - 1, 5);
  Tensor label = RandomInts({N, 1}, DType::kInt64, 0, classes - 1, 6);
  int correct = 0;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = 0; j < k; ++j)
      if (idx.data<int64_t>()[r * k + j] == label.data<int64_t>()[r]) {
        ++correct;
        break;
      }
  auto out = RunForward(AccuracyCase("random", idx, label));
  EXPECT_EQ(out["Correct"][0].item<int>(), correct);
  EXPECT_EQ(out["Total"][0].item<int>(), N);
  EXPECT_FLOAT_EQ(out["Accuracy"][0].item<float>(), static_cast<float>(correct) / N);
}

TEST(AccuracyOp, BadShapesAreBuildErrors) {
  OpCase c = AccuracyCase("label_rows", Tensor::FromVector<int64_t>({1, 2, 0, 3}, {2, 2}),
                          Tensor::FromVector<int64_t>({1, 2, 3}, {3, 1}));
  ExpectErrorContainsAll(ForwardError(c), {"accuracy", "[2, 2]", "[3, 1]"});
  c = AccuracyCase("label_int32", Tensor::FromVector<int64_t>({1, 2, 0, 3}, {2, 2}),
                   Tensor::FromVector<int32_t>({1, 2}, {2, 1}));
  ExpectErrorContainsAll(ForwardError(c), {"accuracy", "int64", "int32"});
}

// ------------------------------------------------------------------------------------------ DSL

TEST(TensorLayers, BuildShapesAndTrainThroughEmbedding) {
  Program main, startup;
  ProgramGuard guard(main, startup);
  Var ids = layers::data("ids", {-1, 1}, DType::kInt64);
  Var label = layers::data("label", {-1, 1}, DType::kInt64);
  Var emb = layers::embedding(ids, {10, 4}, /*padding_idx=*/0);
  EXPECT_EQ(emb.shape(), DDim({-1, 4}));
  Var cat = layers::concat({emb, layers::gelu(emb)}, 1);
  EXPECT_EQ(cat.shape(), DDim({-1, 8}));
  std::vector<Var> parts = layers::split(cat, {3, -1}, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].shape(), DDim({-1, 5}));
  std::vector<Var> halves = layers::split(cat, 2, 1);
  ASSERT_EQ(halves.size(), 2u);
  EXPECT_EQ(halves[0].shape(), DDim({-1, 4}));
  Var t = layers::transpose(layers::unsqueeze(parts[1], {1}), {0, 2, 1});
  EXPECT_EQ(t.shape(), DDim({-1, 5, 1}));
  Var sq = layers::squeeze(t, {2});
  EXPECT_EQ(sq.shape(), DDim({-1, 5}));
  Var f = layers::flatten(layers::unsqueeze(sq, {1}), 1);
  EXPECT_EQ(f.shape(), DDim({-1, 5}));
  Var act = layers::clip(layers::leaky_relu(f, 0.1f), -3.0f, 3.0f);
  Var logp = layers::log_softmax(act, -1);
  auto [values, indices] = layers::topk(logp, 2);
  EXPECT_EQ(indices.shape(), DDim({-1, 2}));
  EXPECT_EQ(indices.dtype(), DType::kInt64);
  Var am = layers::argmax(logp, 1);
  EXPECT_EQ(am.shape(), DDim({-1}));
  Var acc = layers::accuracy(logp, label, 2);
  EXPECT_EQ(acc.shape(), DDim({1}));
  EXPECT_EQ(acc.dtype(), DType::kFloat32);
  Var loss = layers::mean(logp);
  append_backward(main, loss);

  // The embedding table: a Xavier (uniform) parameter, initialized in startup.
  const std::string w = emb.block()->ops()[0]->Input("W")[0];
  EXPECT_TRUE(main.global_block().FindVar(w)->is_parameter());
  ASSERT_EQ(startup.global_block().num_ops(), 1u);
  EXPECT_EQ(startup.global_block().op(0)->type(), "uniform_random");

  Executor exe;
  exe.Run(startup);
  Tensor id_t = Tensor::FromVector<int64_t>({3, 0, 7, 3}, {4, 1});
  Tensor label_t = Tensor::FromVector<int64_t>({0, 1, 2, 3}, {4, 1});
  auto out = exe.Run(main, {{"ids", id_t}, {"label", label_t}},
                     {emb.name(), am.name(), acc.name(), indices.name(), GradVarName(w)});
  EXPECT_EQ(out[0].dims(), DDim({4, 4}));
  std::vector<double> e = ToDouble(out[0]);
  for (int j = 4; j < 8; ++j) EXPECT_EQ(e[j], 0.0) << "the padding id's row is zeros";
  EXPECT_EQ(out[1].dims(), DDim({4}));
  // Accuracy agrees with the fetched top-2 indices.
  std::vector<double> idx = ToDouble(out[3]);
  int correct = 0;
  for (int r = 0; r < 4; ++r) correct += idx[2 * r] == r || idx[2 * r + 1] == r;
  EXPECT_FLOAT_EQ(out[2].item<float>(), correct / 4.0f);
  // W@GRAD is dense [10, 4]: rows of ids 3 and 7 get gradient, the padding row 0 and unused rows
  // none.
  ASSERT_EQ(out[4].dims(), DDim({10, 4}));
  std::vector<double> g = ToDouble(out[4]);
  auto row_norm = [&](int r) {
    double s = 0;
    for (int j = 0; j < 4; ++j) s += std::abs(g[r * 4 + j]);
    return s;
  };
  EXPECT_EQ(row_norm(0), 0.0);
  EXPECT_EQ(row_norm(5), 0.0);
  EXPECT_GT(row_norm(3), 0.0);
  EXPECT_GT(row_norm(7), 0.0);
}

// split's grad is a concat of the parts' grads; a part the loss does not use contributes zeros.
TEST(TensorLayers, SplitGradWithUnusedPartIsZeroThere) {
  Program main, startup;
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {2, 5}, DType::kFloat64, /*stop_gradient=*/false);
  std::vector<Var> parts = layers::split(x, {2, 3}, 1);
  Var loss = layers::reduce_sum(parts[1]);
  append_backward(main, loss);
  Executor exe;
  auto out =
      exe.Run(main, {{"x", RandomTensor({2, 5}, DType::kFloat64, -1, 1, 1)}}, {GradVarName("x")});
  EXPECT_EQ(ToDouble(out[0]), (std::vector<double>{0, 0, 1, 1, 1, 0, 0, 1, 1, 1}));
}

TEST(TensorLayers, WrongShapesFailAtTheLayerCall) {
  Program main, startup;
  ProgramGuard guard(main, startup);
  Var a = layers::data("a", {-1, 3});
  Var b = layers::data("b", {-1, 3, 1});
  ExpectErrorContainsAll(ErrorOf([&] { layers::concat({a, b}, 1); }), {"concat", "[-1, 3, 1]"});
  ExpectErrorContainsAll(ErrorOf([&] { layers::split(a, 2, 1); }), {"split", "[-1, 3]", "num 2"});
  ExpectErrorContainsAll(ErrorOf([&] {
                           layers::embedding(a, {10, 4});
                         }),
                         {"lookup_table", "int64", "float32"});
}

}  // namespace
}  // namespace keel::testing
