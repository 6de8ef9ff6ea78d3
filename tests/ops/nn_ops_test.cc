// Tests of ops/pool_ops.cc, batch_norm_ops.cc, dropout_ops.cc and layer_norm_ops.cc and their DSL
// layers (framework/dsl/nn_layers.h): forward values against naive reference loops (float32 and
// float64), gradients by finite differences (float64), the moving-stat update, the dropout mask's
// seeding and rate, and bad input reported as keel::Error naming op and shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/autodiff/backward.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/program_guard.h"
#include "framework/error.h"
#include "framework/runtime/cpu_threads.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

// float32 outputs are sums of up to a few hundred terms (windows, batch statistics): allow 1e-5
// relative.
constexpr double kF32Tol = 1e-5;

// ------------------------------------------------------------------------------------- pool2d

struct PoolParams {
  std::string name;
  DDim x;
  std::string type;
  std::vector<int> ksize, strides, paddings;
  bool global, ceil_mode, exclusive;
};

const PoolParams kPoolCases[] = {
    {"max_2x2_s2", {2, 3, 6, 6}, "max", {2, 2}, {2, 2}, {0, 0}, false, false, true},
    {"avg_2x2_s2", {2, 3, 6, 6}, "avg", {2, 2}, {2, 2}, {0, 0}, false, false, true},
    // The 2x2 fast path with an odd row and column left out of every window.
    {"max_2x2_s2_odd", {1, 2, 5, 7}, "max", {2, 2}, {2, 2}, {0, 0}, false, false, true},
    {"avg_2x2_s2_odd", {1, 2, 5, 7}, "avg", {2, 2}, {2, 2}, {0, 0}, false, false, true},
    {"max_3x3_s2_pad1", {1, 2, 7, 7}, "max", {3, 3}, {2, 2}, {1, 1}, false, false, true},
    {"avg_pad_exclusive", {1, 2, 5, 5}, "avg", {3, 3}, {2, 2}, {1, 1}, false, false, true},
    {"avg_pad_inclusive", {1, 2, 5, 5}, "avg", {3, 3}, {2, 2}, {1, 1}, false, false, false},
    {"max_ceil", {1, 2, 5, 5}, "max", {2, 2}, {2, 2}, {0, 0}, false, true, true},
    {"avg_ceil_exclusive", {1, 2, 5, 7}, "avg", {2, 3}, {2, 2}, {0, 0}, false, true, true},
    {"avg_ceil_inclusive", {1, 2, 5, 7}, "avg", {2, 3}, {2, 2}, {0, 1}, false, true, false},
    {"max_overlap_s1", {2, 1, 4, 5}, "max", {2, 2}, {1, 1}, {0, 0}, false, false, true},
    {"max_global", {2, 3, 4, 5}, "max", {1, 1}, {1, 1}, {0, 0}, true, false, true},
    {"avg_global", {2, 3, 4, 5}, "avg", {2, 2}, {3, 3}, {1, 1}, true, true, false},
};

struct PoolDims {
  int64_t kh, kw, sh, sw, ph, pw, Ho, Wo;
};
PoolDims PoolGeometry(const PoolParams& p) {
  if (p.global) return {p.x[2], p.x[3], 1, 1, 0, 0, 1, 1};
  auto out = [&](int d) {
    return (p.x[2 + d] - p.ksize[d] + 2 * p.paddings[d] + (p.ceil_mode ? p.strides[d] - 1 : 0)) /
               p.strides[d] +
           1;
  };
  return {p.ksize[0],    p.ksize[1],    p.strides[0], p.strides[1],
          p.paddings[0], p.paddings[1], out(0),       out(1)};
}

std::vector<double> NaivePool(const PoolParams& p, const std::vector<double>& x) {
  const PoolDims g = PoolGeometry(p);
  const int64_t H = p.x[2], W = p.x[3], planes = p.x[0] * p.x[1];
  std::vector<double> out;
  for (int64_t c = 0; c < planes; ++c)
    for (int64_t oh = 0; oh < g.Ho; ++oh)
      for (int64_t ow = 0; ow < g.Wo; ++ow) {
        double mx = -INFINITY, sum = 0;
        int64_t n = 0;
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t ih = oh * g.sh - g.ph + i, iw = ow * g.sw - g.pw + j;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const double v = x[(c * H + ih) * W + iw];
            mx = std::max(mx, v);
            sum += v;
            ++n;
          }
        if (p.type == "max") {
          out.push_back(n ? mx : 0.0);
        } else {
          out.push_back(sum / (p.exclusive ? n : g.kh * g.kw));
        }
      }
  return out;
}

OpCase PoolCase(const PoolParams& p, DType dt) {
  OpCase c;
  c.name = p.name;
  c.type = "pool2d";
  c.inputs = {{"X", {RandomTensor(p.x, dt, -1, 1, 111)}}};
  c.attrs = {{"pooling_type", p.type},  {"ksize", p.ksize},           {"strides", p.strides},
             {"paddings", p.paddings},  {"global_pooling", p.global}, {"ceil_mode", p.ceil_mode},
             {"exclusive", p.exclusive}};
  return c;
}

TEST(Pool2DOp, ForwardMatchesReference) {
  for (const auto& p : kPoolCases)
    for (DType dt : kFloatTypes) {
      OpCase c = PoolCase(p, dt);
      const PoolDims g = PoolGeometry(p);
      ExpectForward(c, "Out", {p.x[0], p.x[1], g.Ho, g.Wo},
                    NaivePool(p, ToDouble(c.inputs[0].second[0])), kF32Tol);
    }
}

TEST(Pool2DOp, CeilModeAddsTheOverhangingWindow) {
  EXPECT_EQ(PoolGeometry(kPoolCases[5]).Ho,
            3);  // 5 wide, 2 x 2 stride 2: floor gives 2
  OpCase c = PoolCase(kPoolCases[5], DType::kFloat32);
  EXPECT_EQ(RunForward(c)["Out"][0].dims(), DDim({1, 2, 3, 3}));
}

TEST(Pool2DOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kPoolCases) CheckGrad(PoolCase(p, DType::kFloat64));
}

// Ties (ReLU zeros feed max pools all the time): the gradient goes to the first maximum of each
// window in row-major order, once, on both the 2x2 fast path and the general path.
TEST(Pool2DOp, MaxGradGoesToTheFirstOfTiedMaxima) {
  for (const char* name : {"max_2x2_s2", "max_overlap_s1"}) {
    const PoolParams* p = nullptr;
    for (const auto& q : kPoolCases)
      if (std::string(q.name) == name) p = &q;
    ASSERT_NE(p, nullptr);
    OpCase c = PoolCase(*p, DType::kFloat32);
    Tensor x(DType::kFloat32, p->x);
    std::fill(x.data<float>(), x.data<float>() + x.numel(), 0.0f);  // every window all ties
    c.inputs[0].second[0] = x;
    const PoolDims g = PoolGeometry(*p);
    const int64_t H = p->x[2], W = p->x[3], planes = p->x[0] * p->x[1];
    std::vector<double> want(static_cast<size_t>(x.numel()), 0.0);
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t oh = 0; oh < g.Ho; ++oh)
        for (int64_t ow = 0; ow < g.Wo; ++ow) want[(pl * H + oh * g.sh) * W + ow * g.sw] += 1.0;
    Tensor out = RunForward(c)["Out"][0];
    Tensor ones(DType::kFloat32, out.dims());
    std::fill(ones.data<float>(), ones.data<float>() + ones.numel(), 1.0f);
    OpCase gc = c;
    gc.type = "pool2d_grad";
    gc.inputs = {{"X", {x}}, {"Out", {out}}, {GradVarName("Out"), {ones}}};
    gc.outputs = {{GradVarName("X"), 1}};
    EXPECT_EQ(ToDouble(RunForward(gc)[GradVarName("X")][0]), want) << name;
  }
}

// Planes run in pieces on the thread budget: forward and gradient are the same bits on one thread
// and on three, on the 2x2 path (with an odd leftover row and column) and the general one, with
// enough planes for several pieces (512 planes of 29 x 29: 4; of 20 x 20: 2).
TEST(Pool2DOp, PlanesInPiecesGiveTheSameBitsOnAnyThreadCount) {
  const PoolParams cases[] = {
      {"max_2x2_odd", {32, 16, 29, 29}, "max", {2, 2}, {2, 2}, {0, 0}, false, false, true},
      {"avg_3x3_s1", {32, 16, 20, 20}, "avg", {3, 3}, {1, 1}, {1, 1}, false, false, true},
  };
  for (const auto& p : cases) {
    SCOPED_TRACE(p.name);
    OpCase c = PoolCase(p, DType::kFloat32);
    const PoolDims g = PoolGeometry(p);
    OpCase gc = c;
    gc.type = "pool2d_grad";
    gc.inputs.push_back({"Out", {}});
    gc.outputs = {{GradVarName("X"), 1}};
    std::vector<std::vector<float>> got;
    for (int threads : {1, 3}) {
      cpu_threads::SetBudget(threads);
      const Tensor out = RunForward(c)["Out"][0];
      gc.inputs.back().second = {out};
      gc.inputs.push_back(
          {GradVarName("Out"),
           {RandomTensor({p.x[0], p.x[1], g.Ho, g.Wo}, DType::kFloat32, -1, 1, 7)}});
      const Tensor dx = RunForward(gc)[GradVarName("X")][0];
      gc.inputs.pop_back();
      got.push_back(std::vector<float>(out.data<float>(), out.data<float>() + out.numel()));
      got.back().insert(got.back().end(), dx.data<float>(), dx.data<float>() + dx.numel());
    }
    cpu_threads::SetBudget(1);
    EXPECT_EQ(got[0], got[1]);
  }
}

TEST(Pool2DOp, BadInputIsABuildError) {
  OpCase c = PoolCase(kPoolCases[0], DType::kFloat32);
  c.name = "rank3";
  c.inputs[0].second[0] = Tensor(DType::kFloat32, {3, 6, 6});
  ExpectErrorContainsAll(ForwardError(c), {"pool2d", "[3, 6, 6]", "4-D"});

  c = PoolCase(kPoolCases[0], DType::kFloat32);
  c.name = "window_too_big";
  c.attrs["ksize"] = Pair(7, 7);
  ExpectErrorContainsAll(ForwardError(c), {"pool2d", "[2, 3, 6, 6]", "ksize [7, 7]"});

  c = PoolCase(kPoolCases[0], DType::kFloat32);
  c.name = "bad_type";
  c.attrs["pooling_type"] = std::string("min");
  ExpectErrorContainsAll(ForwardError(c), {"pool2d", "pooling_type", "min"});
}

// --------------------------------------------------------------------------------- batch_norm

struct BatchNormParams {
  std::string name;
  DDim x;
  bool is_test;
  float momentum, epsilon;
  bool use_global_stats = false;  // training with the moving stats, as is_test, frozen
};

const BatchNormParams kBatchNormCases[] = {
    {"nchw_train", {2, 3, 4, 5}, false, 0.9f, 1e-5f},
    {"nc_train", {6, 4}, false, 0.9f, 1e-5f},
    {"nchw_train_momentum_0.5", {3, 2, 3, 3}, false, 0.5f, 1e-3f},
    {"nchw_test", {2, 3, 4, 5}, true, 0.9f, 1e-5f},
    {"nc_test", {5, 3}, true, 0.9f, 1e-5f},
    {"nchw_use_global_stats", {2, 3, 4, 5}, false, 0.9f, 1e-5f, true},
    {"nc_use_global_stats", {5, 3}, false, 0.7f, 1e-3f, true},
};

OpCase BatchNormCase(const BatchNormParams& p, DType dt) {
  const DDim c{p.x[1]};
  OpCase o;
  o.name = p.name;
  o.type = "batch_norm";
  o.inputs = {{"X", {RandomTensor(p.x, dt, -2, 3, 121)}},
              {"Scale", {RandomTensor(c, dt, 0.5, 1.5, 122)}},
              {"Bias", {RandomTensor(c, dt, -1, 1, 123)}},
              {"Mean", {RandomTensor(c, dt, -0.5, 0.5, 124)}},
              {"Variance", {RandomTensor(c, dt, 0.5, 2, 125)}}};
  o.outputs = {
      {"Y", 1}, {"MeanOut", 1}, {"VarianceOut", 1}, {"SavedMean", 1}, {"SavedVariance", 1}};
  o.attrs = {{"is_test", p.is_test},
             {"momentum", p.momentum},
             {"epsilon", p.epsilon},
             {"use_global_stats", p.use_global_stats}};
  o.no_grad_inputs = {"Mean", "Variance"};
  return o;
}

struct BatchNormRef {
  std::vector<double> y, mean_out, var_out, saved_mean, saved_inv_std;
};

BatchNormRef NaiveBatchNorm(const BatchNormParams& p, const OpCase& c) {
  std::vector<double> x = ToDouble(c.inputs[0].second[0]);
  std::vector<double> scale = ToDouble(c.inputs[1].second[0]),
                      bias = ToDouble(c.inputs[2].second[0]);
  std::vector<double> rmean = ToDouble(c.inputs[3].second[0]);
  std::vector<double> rvar = ToDouble(c.inputs[4].second[0]);
  const int64_t N = p.x[0], C = p.x[1], S = p.x.numel() / (N * C);
  BatchNormRef r;
  r.y.resize(x.size());
  for (int64_t ch = 0; ch < C; ++ch) {
    double mean = 0, var = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) mean += x[(n * C + ch) * S + s];
    mean /= N * S;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) var += std::pow(x[(n * C + ch) * S + s] - mean, 2);
    var /= N * S;  // biased
    const bool fixed = p.is_test || p.use_global_stats;
    if (fixed) mean = rmean[ch], var = rvar[ch];
    const double inv_std = 1 / std::sqrt(var + p.epsilon);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t i = (n * C + ch) * S + s;
        r.y[i] = scale[ch] * (x[i] - mean) * inv_std + bias[ch];
      }
    r.saved_mean.push_back(mean);
    r.saved_inv_std.push_back(inv_std);
    const double m = p.momentum;
    r.mean_out.push_back(fixed ? rmean[ch] : m * rmean[ch] + (1 - m) * mean);
    r.var_out.push_back(fixed ? rvar[ch] : m * rvar[ch] + (1 - m) * var);
  }
  return r;
}

TEST(BatchNormOp, ForwardMatchesReference) {
  for (const auto& p : kBatchNormCases)
    for (DType dt : kFloatTypes) {
      OpCase c = BatchNormCase(p, dt);
      BatchNormRef r = NaiveBatchNorm(p, c);
      const DDim ch{p.x[1]};
      ExpectForward(c, "Y", p.x, r.y, kF32Tol);
      ExpectForward(c, "MeanOut", ch, r.mean_out, kF32Tol);
      ExpectForward(c, "VarianceOut", ch, r.var_out, kF32Tol);
      ExpectForward(c, "SavedMean", ch, r.saved_mean, kF32Tol);
      ExpectForward(c, "SavedVariance", ch, r.saved_inv_std, kF32Tol);
    }
}

// MeanOut and VarianceOut are updated state, not functions to differentiate: the loss is on Y.
TEST(BatchNormOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kBatchNormCases)
    CheckGrad(BatchNormCase(p, DType::kFloat64), 1e-6, 1e-4, 1e-6, {"Y"});
}

// In a program MeanOut is Mean: the moving stats are updated in place, run after run.
TEST(BatchNormOp, MovingStatsUpdateInPlaceAcrossRuns) {
  Program prog;
  Block& block = prog.global_block();
  for (const char* n : {"x", "scale", "bias"}) block.Var(n)->set_is_data(true);
  block.Var("x")->set_shape({4, 2, 3, 3});
  for (const char* n : {"scale", "bias", "mean", "var"}) block.Var(n)->set_shape({2});
  block.Var("mean")->set_persistable(true);
  block.Var("var")->set_persistable(true);
  AppendOp(block, "batch_norm",
           {{"X", {"x"}},
            {"Scale", {"scale"}},
            {"Bias", {"bias"}},
            {"Mean", {"mean"}},
            {"Variance", {"var"}}},
           {{"Y", {"y"}},
            {"MeanOut", {"mean"}},
            {"VarianceOut", {"var"}},
            {"SavedMean", {"sm"}},
            {"SavedVariance", {"sv"}}},
           {{"momentum", 0.8f}});
  Tensor x = RandomTensor({4, 2, 3, 3}, DType::kFloat32, -1, 3, 131);
  Tensor ones = Tensor::FromVector<float>({1, 1}, {2});
  Tensor zeros = Tensor::FromVector<float>({0, 0}, {2});
  Executor exe;
  auto r1 = exe.Run(
      prog,
      {{"x", x}, {"scale", ones}, {"bias", zeros}, {"mean", zeros.Clone()}, {"var", ones.Clone()}},
      {"mean", "var", "sm"});
  auto r2 = exe.Run(prog, {{"x", x}, {"scale", ones}, {"bias", zeros}}, {"mean", "var", "sv"});
  std::vector<double> bm = ToDouble(r1[2]), m1 = ToDouble(r1[0]), m2 = ToDouble(r2[0]);
  std::vector<double> v1 = ToDouble(r1[1]), v2 = ToDouble(r2[1]), inv_std = ToDouble(r2[2]);
  for (int c = 0; c < 2; ++c) {
    const double bv = 1 / (inv_std[c] * inv_std[c]) - 1e-5;  // the batch's biased variance
    EXPECT_NEAR(m1[c], 0.2 * bm[c], 1e-6);
    EXPECT_NEAR(m2[c], 0.8 * 0.2 * bm[c] + 0.2 * bm[c], 1e-6);
    EXPECT_NEAR(v1[c], 0.8 + 0.2 * bv, 1e-5);
    EXPECT_NEAR(v2[c], 0.8 * v1[c] + 0.2 * bv, 1e-5);
  }
}

TEST(BatchNormOp, BadShapesAreBuildErrors) {
  OpCase c = BatchNormCase(kBatchNormCases[0], DType::kFloat32);
  c.name = "scale_size";
  c.inputs[1].second[0] = Tensor(DType::kFloat32, {4});
  ExpectErrorContainsAll(ForwardError(c), {"batch_norm", "Scale [4]", "[2, 3, 4, 5]"});

  c = BatchNormCase(kBatchNormCases[0], DType::kFloat32);
  c.name = "rank1";
  c.inputs[0].second[0] = Tensor(DType::kFloat32, {3});
  ExpectErrorContainsAll(ForwardError(c), {"batch_norm", "X [3]"});

  c = BatchNormCase(kBatchNormCases[0], DType::kFloat32);
  c.name = "ndhwc";  // NHWC is channels_last_test.cc's
  c.attrs["data_layout"] = std::string("NDHWC");
  ExpectErrorContainsAll(ForwardError(c), {"batch_norm", "data_layout", "NDHWC"});
}

// ------------------------------------------------------------------------------------ dropout

OpCase DropoutCase(const std::string& name, DDim dims, DType dt, float p, int seed,
                   const std::string& impl = "upscale_in_train", bool is_test = false) {
  OpCase c;
  c.name = name;
  c.type = "dropout";
  c.inputs = {{"X", {RandomTensor(dims, dt, 0.5, 1.5, 141)}}};
  c.outputs = {{"Out", 1}};
  if (!is_test) c.outputs.push_back({"Mask", 1});
  c.attrs = {
      {"dropout_prob", p}, {"seed", seed}, {"dropout_implementation", impl}, {"is_test", is_test}};
  return c;
}

TEST(DropoutOp, SameSeedSameMaskOtherSeedOtherMask) {
  for (DType dt : kFloatTypes) {
    OpCase a = DropoutCase("seed5", {40, 50}, dt, 0.5f, 5);
    OpCase b = DropoutCase("seed5_again", {40, 50}, dt, 0.5f, 5);
    OpCase other = DropoutCase("seed6", {40, 50}, dt, 0.5f, 6);
    SCOPED_TRACE(Describe(a));
    auto ra = RunForward(a), rb = RunForward(b), ro = RunForward(other);
    EXPECT_EQ(ToDouble(ra["Mask"][0]), ToDouble(rb["Mask"][0]));
    EXPECT_EQ(ToDouble(ra["Out"][0]), ToDouble(rb["Out"][0]));
    EXPECT_NE(ToDouble(ra["Mask"][0]), ToDouble(ro["Mask"][0]));
  }
}

TEST(DropoutOp, OutIsMaskedAndScaledAndRateIsNearP) {
  for (const std::string impl : {"upscale_in_train", "downgrade_in_infer"})
    for (float p : {0.1f, 0.5f, 0.8f})
      for (DType dt : kFloatTypes) {
        OpCase c = DropoutCase(impl, {200, 500}, dt, p, 17, impl);
        SCOPED_TRACE(Describe(c));
        auto r = RunForward(c);
        const Tensor& mask = r["Mask"][0];
        ASSERT_EQ(mask.dtype(), DType::kUInt8);
        ASSERT_EQ(mask.dims(), DDim({200, 500}));
        std::vector<double> m = ToDouble(mask), x = ToDouble(c.inputs[0].second[0]);
        std::vector<double> out = ToDouble(r["Out"][0]);
        const double scale = impl == "upscale_in_train" ? 1.0 / (1.0 - p) : 1.0;
        double dropped = 0;
        for (size_t i = 0; i < m.size(); ++i) {
          ASSERT_TRUE(m[i] == 0 || m[i] == 1);
          dropped += 1 - m[i];
          ASSERT_NEAR(out[i], x[i] * m[i] * scale, 1e-6 * (1 + std::abs(out[i]))) << i;
        }
        // 100000 draws: the rate's standard error is below 0.0016.
        EXPECT_NEAR(dropped / m.size(), p, 0.01);
      }
}

TEST(DropoutOp, ExtremeRates) {
  auto r0 = RunForward(DropoutCase("p0", {10, 10}, DType::kFloat32, 0.0f, 3));
  EXPECT_EQ(ToDouble(r0["Mask"][0]), std::vector<double>(100, 1.0));
  auto r1 = RunForward(DropoutCase("p1", {10, 10}, DType::kFloat32, 1.0f, 3));
  EXPECT_EQ(ToDouble(r1["Mask"][0]), std::vector<double>(100, 0.0));
  EXPECT_EQ(ToDouble(r1["Out"][0]), std::vector<double>(100, 0.0));
}

TEST(DropoutOp, IsTestIsIdentityOrDowngrade) {
  for (DType dt : kFloatTypes) {
    OpCase up = DropoutCase("test_upscale", {3, 4}, dt, 0.3f, 1, "upscale_in_train", true);
    ExpectForward(up, "Out", {3, 4}, ToDouble(up.inputs[0].second[0]), kF32Tol);
    OpCase down = DropoutCase("test_downgrade", {3, 4}, dt, 0.3f, 1, "downgrade_in_infer", true);
    std::vector<double> want = ToDouble(down.inputs[0].second[0]);
    for (double& v : want) v *= 1 - static_cast<double>(0.3f);
    ExpectForward(down, "Out", {3, 4}, want, kF32Tol);
  }
}

// A run continues the engine's stream (a new mask); fix_seed replays the same mask every run.
TEST(DropoutOp, RunsDrawNewMasksUnlessFixSeed) {
  for (bool fix : {false, true}) {
    SCOPED_TRACE(fix ? "fix_seed" : "no fix_seed");
    Program prog;
    Block& block = prog.global_block();
    block.Var("x")->set_shape({8, 8});
    block.Var("x")->set_is_data(true);
    AppendOp(block, "dropout", {{"X", {"x"}}}, {{"Out", {"y"}}, {"Mask", {"m"}}},
             {{"seed", 9}, {"fix_seed", fix}});
    Executor exe;
    Tensor x = RandomTensor({8, 8}, DType::kFloat32, 1, 2, 1);
    std::vector<double> a = ToDouble(exe.Run(prog, {{"x", x}}, {"m"})[0]);
    std::vector<double> b = ToDouble(exe.Run(prog, {{"x", x}}, {"m"})[0]);
    EXPECT_EQ(a == b, fix);
  }
}

// fix_seed keeps the mask fixed across the checker's runs, so finite differences apply.
TEST(DropoutOp, GradMatchesFiniteDifferences) {
  for (const std::string impl : {"upscale_in_train", "downgrade_in_infer"})
    for (bool is_test : {false, true}) {
      OpCase c = DropoutCase(impl, {4, 5}, DType::kFloat64, 0.4f, 21, impl, is_test);
      c.attrs["fix_seed"] = true;
      CheckGrad(c, 1e-6, 1e-4, 1e-6, {"Out"});
    }
}

TEST(DropoutOp, BadAttrsAreBuildErrors) {
  OpCase c = DropoutCase("p_1.5", {2, 2}, DType::kFloat32, 1.5f, 1);
  ExpectErrorContainsAll(ForwardError(c), {"dropout", "dropout_prob", "[0, 1]"});
  c = DropoutCase("bad_impl", {2, 2}, DType::kFloat32, 0.5f, 1, "upscale");
  ExpectErrorContainsAll(ForwardError(c), {"dropout", "dropout_implementation", "upscale"});
}

// --------------------------------------------------------------------------------- layer_norm

struct LayerNormParams {
  std::string name;
  DDim x;
  int axis;
  bool scale, bias;
};

const LayerNormParams kLayerNormCases[] = {
    {"rows", {4, 6}, 1, true, true},
    {"rank3_last", {2, 3, 5}, 2, true, true},
    {"rank3_last_two", {2, 3, 4}, 1, true, true},
    {"no_scale", {3, 5}, 1, false, true},
    {"no_bias", {3, 5}, 1, true, false},
    {"neither", {3, 4}, 1, false, false},
    {"wide", {8, 512}, 1, true, true},
};

OpCase LayerNormCase(const LayerNormParams& p, DType dt) {
  const int64_t R = p.x.prod(p.axis, p.x.size());
  OpCase c;
  c.name = p.name;
  c.type = "layer_norm";
  c.inputs = {{"X", {RandomTensor(p.x, dt, -2, 3, 151)}}};
  if (p.scale) c.inputs.push_back({"Scale", {RandomTensor({R}, dt, 0.5, 1.5, 152)}});
  if (p.bias) c.inputs.push_back({"Bias", {RandomTensor({R}, dt, -1, 1, 153)}});
  c.outputs = {{"Y", 1}, {"Mean", 1}, {"Variance", 1}};
  c.attrs = {{"begin_norm_axis", p.axis}};
  return c;
}

TEST(LayerNormOp, ForwardMatchesReference) {
  for (const auto& p : kLayerNormCases)
    for (DType dt : kFloatTypes) {
      OpCase c = LayerNormCase(p, dt);
      const int64_t R = p.x.prod(p.axis, p.x.size()), rows = p.x.numel() / R;
      std::vector<double> x = ToDouble(c.inputs[0].second[0]);
      std::vector<double> scale(R, 1.0), bias(R, 0.0);
      size_t k = 1;
      if (p.scale) scale = ToDouble(c.inputs[k++].second[0]);
      if (p.bias) bias = ToDouble(c.inputs[k++].second[0]);
      std::vector<double> y(x.size()), mean(rows), var(rows);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < R; ++j) mean[i] += x[i * R + j] / R;
        for (int64_t j = 0; j < R; ++j) var[i] += std::pow(x[i * R + j] - mean[i], 2) / R;
        for (int64_t j = 0; j < R; ++j)
          y[i * R + j] = (x[i * R + j] - mean[i]) / std::sqrt(var[i] + 1e-5f) * scale[j] + bias[j];
      }
      ExpectForward(c, "Y", p.x, y, kF32Tol);
      ExpectForward(c, "Mean", {rows}, mean, kF32Tol);
      ExpectForward(c, "Variance", {rows}, var, kF32Tol);
    }
}

TEST(LayerNormOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kLayerNormCases)
    if (p.x.numel() <= 64) CheckGrad(LayerNormCase(p, DType::kFloat64), 1e-6, 1e-4, 1e-6, {"Y"});
}

TEST(LayerNormOp, BadInputIsABuildError) {
  OpCase c = LayerNormCase(kLayerNormCases[1], DType::kFloat32);
  c.name = "scale_size";
  c.inputs[1].second[0] = Tensor(DType::kFloat32, {4});
  ExpectErrorContainsAll(ForwardError(c), {"layer_norm", "Scale [4]", "[2, 3, 5]"});

  c = LayerNormCase(kLayerNormCases[1], DType::kFloat32);
  c.name = "axis_3";
  c.attrs["begin_norm_axis"] = 3;
  ExpectErrorContainsAll(ForwardError(c), {"layer_norm", "begin_norm_axis 3", "[2, 3, 5]"});
}

// ----------------------------------------------------------------------------------------- DSL

TEST(NnLayers, ConvBnReluPoolShapesAtBuildTime) {
  Program main, startup;
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 3, 32, 32});
  Var c = layers::conv2d(x, 8, 3, 1, 1);
  EXPECT_EQ(c.shape(), DDim({-1, 8, 32, 32}));
  Var b = layers::batch_norm(c, "relu");
  EXPECT_EQ(b.shape(), DDim({-1, 8, 32, 32}));
  Var p = layers::pool2d(b, 2, "max", 2);
  EXPECT_EQ(p.shape(), DDim({-1, 8, 16, 16}));
  Var s = layers::conv2d(p, 4, 3, 2, 1, 1, 1, "", {}, {}, /*with_bias=*/false);
  EXPECT_EQ(s.shape(), DDim({-1, 4, 8, 8}));
  Var g = layers::pool2d(s, 1, "avg", 1, 0, /*global_pooling=*/true);
  EXPECT_EQ(g.shape(), DDim({-1, 4, 1, 1}));
  Var d = layers::dropout(g, 0.5f);
  EXPECT_EQ(d.shape(), DDim({-1, 4, 1, 1}));
  Var l = layers::layer_norm(d, 1);
  EXPECT_EQ(l.shape(), DDim({-1, 4, 1, 1}));

  Block& mb = main.global_block();
  ASSERT_NE(mb.FindVar("conv2d_0.w_0"), nullptr);
  EXPECT_EQ(mb.FindVar("conv2d_0.w_0")->dims(), DDim({8, 3, 3, 3}));
  EXPECT_EQ(mb.FindVar("conv2d_0.b_0")->dims(), DDim({8}));
  EXPECT_EQ(mb.FindVar("conv2d_1.b_0"), nullptr);
  for (const char* n : {"batch_norm_0.w_0", "batch_norm_0.b_0"}) {
    ASSERT_NE(mb.FindVar(n), nullptr) << n;
    EXPECT_TRUE(mb.FindVar(n)->is_parameter()) << n;
  }
  for (const char* n : {"batch_norm_0.w_1", "batch_norm_0.w_2"}) {
    SCOPED_TRACE(n);
    ASSERT_NE(mb.FindVar(n), nullptr);
    EXPECT_TRUE(mb.FindVar(n)->persistable());
    EXPECT_FALSE(mb.FindVar(n)->is_parameter());
    ASSERT_NE(startup.global_block().FindVar(n), nullptr);
    EXPECT_TRUE(startup.global_block().FindVar(n)->persistable());
  }
  const OpDesc* bn = nullptr;
  for (auto& op : mb.ops())
    if (op->type() == "batch_norm") bn = op.get();
  ASSERT_NE(bn, nullptr);
  EXPECT_EQ(bn->Output("MeanOut"), bn->Input("Mean"));
  EXPECT_EQ(bn->Output("VarianceOut"), bn->Input("Variance"));
}

// The stack trains: startup fills the parameters, a step updates the moving mean, and the backward
// pass reaches the conv filter.
TEST(NnLayers, StackRunsForwardAndBackward) {
  Program main, startup;
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 2, 8, 8});
  Var h = layers::conv2d(x, 4, 3, 1, 1);
  h = layers::batch_norm(h, "relu");
  h = layers::pool2d(h, 2, "avg", 2);
  Var loss = layers::mean(h);
  auto params = append_backward(main, loss);
  bool has_filter_grad = false;
  for (auto& pg : params) has_filter_grad = has_filter_grad || pg.first == "conv2d_0.w_0";
  EXPECT_TRUE(has_filter_grad);

  Executor exe;
  exe.Run(startup);
  Tensor xt = RandomTensor({3, 2, 8, 8}, DType::kFloat32, 0, 2, 161);
  auto got =
      exe.Run(main, {{"x", xt}}, {h.name(), "batch_norm_0.w_1", GradVarName("conv2d_0.w_0")});
  EXPECT_EQ(got[0].dims(), DDim({3, 4, 4, 4}));
  double moved = 0;
  for (double v : ToDouble(got[1])) moved += std::abs(v);
  EXPECT_GT(moved, 0) << "the moving mean was not updated";
  EXPECT_EQ(got[2].dims(), DDim({4, 2, 3, 3}));
}

TEST(NnLayers, UnknownChannelsIsAnError) {
  Program main, startup;
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, -1, 8, 8});
  ExpectErrorContainsAll(ErrorOf([&] { layers::conv2d(x, 4, 3); }),
                         {"conv2d", "[-1, -1, 8, 8]", "channel"});
}
}  // namespace
}  // namespace keel::testing
