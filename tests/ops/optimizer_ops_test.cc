// Tests of ops/optimizer_ops.cc (sgd, momentum, adam, adamw, squared_l2_norm, clip_by_global_norm)
// and ops/lr_schedule_ops.cc (increment, lr_schedule): in-place steps against reference loops in
// double (float32 and float64), the documented schedule values at chosen steps, and bad shapes and
// attrs reported as keel::Error naming the op and the shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/program_guard.h"
#include "framework/error.h"
#include "framework/runtime/cpu_threads.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

using State = std::map<std::string, std::vector<double>>;  // slot -> values

Tensor Scalar(double v, DType dt) {
  Tensor t(dt, {1});
  if (dt == DType::kFloat64) {
    t.data<double>()[0] = v;
  } else {
    t.data<float>()[0] = static_cast<float>(v);
  }
  return t;
}

// Runs op `type` once per grads[k] with every output written in place into its input's var
// (outputs[i].first <- var of input slot outputs[i].second). Inputs are fed from `state`, whose
// tensors the executor shares, so they carry the op's updates from step to step; Grad is fed
// from grads[k]. After step k, check(k) sees the updated state.
void RunInPlaceSteps(const std::string& type, const std::map<std::string, Attribute>& attrs,
                     std::map<std::string, Tensor>& state, const std::vector<Tensor>& grads,
                     const std::vector<std::pair<std::string, std::string>>& outputs,
                     const std::function<void(int)>& check) {
  Program prog;
  Block& block = prog.global_block();
  OpDesc::VarMap ins, outs;
  auto declare = [&](const std::string& slot, const Tensor& t) {
    VarDesc* v = block.Var(slot);
    v->set_dtype(t.dtype());
    v->set_dims(t.dims());
    v->set_is_data(true);
    ins.emplace_back(slot, std::vector<std::string>{slot});
  };
  declare("Grad", grads[0]);
  for (auto& [slot, t] : state) declare(slot, t);
  for (auto& [out, in] : outputs) outs.emplace_back(out, std::vector<std::string>{in});
  AppendOp(block, type, ins, outs, attrs);
  Executor exe;
  for (size_t k = 0; k < grads.size(); ++k) {
    FeedMap feed(state.begin(), state.end());
    feed["Grad"] = grads[k];
    exe.Run(prog, feed);
    check(static_cast<int>(k));
  }
}

// EXPECTs t's values near want, relative to the dtype's precision.
void ExpectNear(const Tensor& t, const std::vector<double>& want, const std::string& what,
                double f32_tol = 2e-6) {
  std::vector<double> got = ToDouble(t);
  const double tol = t.dtype() == DType::kFloat32 ? f32_tol : 1e-12;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
}

std::vector<Tensor> Grads(const DDim& dims, DType dt, int steps) {
  std::vector<Tensor> g;
  for (int k = 0; k < steps; ++k) g.push_back(RandomTensor(dims, dt, -1, 1, 200 + k));
  return g;
}

// -------------------------------------------------------------------------------------- momentum

TEST(MomentumOp, ThreeInPlaceStepsMatchReference) {
  // The op sees the float32 values of lr and mu.
  const double lr = static_cast<double>(0.1f), mu = static_cast<double>(0.9f);
  for (bool nesterov : {false, true})
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(StrCat("use_nesterov=", nesterov, " ", DTypeName(dt)));
      const DDim dims{3, 4};
      std::map<std::string, Tensor> state = {{"Param", RandomTensor(dims, dt, -1, 1, 1)},
                                             {"Velocity", RandomTensor(dims, dt, -1, 1, 2)},
                                             {"LearningRate", Scalar(lr, DType::kFloat32)}};
      std::vector<Tensor> grads = Grads(dims, dt, 3);
      std::vector<double> p = ToDouble(state["Param"]), v = ToDouble(state["Velocity"]);
      RunInPlaceSteps("momentum", {{"mu", 0.9f}, {"use_nesterov", nesterov}}, state, grads,
                      {{"ParamOut", "Param"}, {"VelocityOut", "Velocity"}}, [&](int k) {
                        std::vector<double> g = ToDouble(grads[k]);
                        for (size_t i = 0; i < p.size(); ++i) {
                          v[i] = mu * v[i] + g[i];
                          p[i] -= nesterov ? lr * (g[i] + mu * v[i]) : lr * v[i];
                        }
                        ExpectNear(state["Velocity"], v, StrCat("Velocity after step ", k));
                        ExpectNear(state["Param"], p, StrCat("Param after step ", k));
                      });
    }
}

// ----------------------------------------------------------------------------------- adam, adamw

// Paddle's Adam over three steps, with AdamW's decay first when coeff > 0.
void CheckAdamSteps(const std::string& type, double coeff) {
  const double lr = static_cast<double>(0.01f);  // the LearningRate tensor is float32
  const double b1 = static_cast<double>(0.9f), b2 = static_cast<double>(0.999f);
  const double eps = static_cast<double>(1e-8f);
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(StrCat(type, " ", DTypeName(dt)));
    const DDim dims{5, 2};
    std::map<std::string, Tensor> state = {{"Param", RandomTensor(dims, dt, -1, 1, 3)},
                                           {"LearningRate", Scalar(lr, DType::kFloat32)},
                                           {"Moment1", RandomTensor(dims, dt, -0.1, 0.1, 4)},
                                           {"Moment2", RandomTensor(dims, dt, 0, 0.1, 5)},
                                           {"Beta1Pow", Scalar(b1, dt)},
                                           {"Beta2Pow", Scalar(b2, dt)}};
    std::vector<Tensor> grads = Grads(dims, dt, 3);
    std::vector<double> p = ToDouble(state["Param"]), m1 = ToDouble(state["Moment1"]),
                        m2 = ToDouble(state["Moment2"]);
    double b1_pow = ToDouble(state["Beta1Pow"])[0], b2_pow = ToDouble(state["Beta2Pow"])[0];
    std::map<std::string, Attribute> attrs = {{"beta1", 0.9f}, {"beta2", 0.999f}};
    if (type == "adamw") attrs["coeff"] = static_cast<float>(coeff);
    RunInPlaceSteps(type, attrs, state, grads,
                    {{"ParamOut", "Param"},
                     {"Moment1Out", "Moment1"},
                     {"Moment2Out", "Moment2"},
                     {"Beta1PowOut", "Beta1Pow"},
                     {"Beta2PowOut", "Beta2Pow"}},
                    [&](int k) {
                      std::vector<double> g = ToDouble(grads[k]);
                      const double lr_t = lr * std::sqrt(1 - b2_pow) / (1 - b1_pow);
                      for (size_t i = 0; i < p.size(); ++i) {
                        p[i] -= lr * coeff * p[i];
                        m1[i] = b1 * m1[i] + (1 - b1) * g[i];
                        m2[i] = b2 * m2[i] + (1 - b2) * g[i] * g[i];
                        p[i] -= lr_t * m1[i] / (std::sqrt(m2[i]) + eps * std::sqrt(1 - b2_pow));
                      }
                      b1_pow *= b1;
                      b2_pow *= b2;
                      const std::string after = StrCat(" after step ", k);
                      ExpectNear(state["Moment1"], m1, "Moment1" + after);
                      ExpectNear(state["Moment2"], m2, "Moment2" + after);
                      ExpectNear(state["Param"], p, "Param" + after, 1e-5);
                      ExpectNear(state["Beta1Pow"], {b1_pow}, "Beta1Pow" + after);
                      ExpectNear(state["Beta2Pow"], {b2_pow}, "Beta2Pow" + after);
                    });
  }
}

TEST(AdamOp, ThreeInPlaceStepsMatchPaddlesUpdate) { CheckAdamSteps("adam", 0); }

TEST(AdamWOp, ThreeInPlaceStepsDecayThenAdam) {
  CheckAdamSteps("adamw", static_cast<double>(0.1f));
}

// The DSL keeps the beta powers in float32 also for float64 parameters.
TEST(AdamOp, Float32BetaPowsWithFloat64Param) {
  OpCase c;
  c.name = "f32 pows";
  c.type = "adam";
  c.inputs = {{"Param", {Tensor::FromVector<double>({1.0}, {1})}},
              {"Grad", {Tensor::FromVector<double>({0.5}, {1})}},
              {"LearningRate", {Scalar(0.1, DType::kFloat32)}},
              {"Moment1", {Tensor::FromVector<double>({0.0}, {1})}},
              {"Moment2", {Tensor::FromVector<double>({0.0}, {1})}},
              {"Beta1Pow", {Scalar(0.9, DType::kFloat32)}},
              {"Beta2Pow", {Scalar(0.999, DType::kFloat32)}}};
  c.outputs = {{"ParamOut", 1},
               {"Moment1Out", 1},
               {"Moment2Out", 1},
               {"Beta1PowOut", 1},
               {"Beta2PowOut", 1}};
  auto out = RunForward(c);
  EXPECT_EQ(out["ParamOut"][0].dtype(), DType::kFloat64);
  EXPECT_EQ(out["Beta1PowOut"][0].dtype(), DType::kFloat32);
  EXPECT_FLOAT_EQ(out["Beta1PowOut"][0].item<float>(), 0.9f * 0.9f);
  // The first step of bias-corrected Adam moves by about lr * sign(g).
  EXPECT_NEAR(out["ParamOut"][0].item<double>(), 1.0 - 0.1, 1e-6);
}

// ------------------------------------------------------------------------------- shape mismatch

OpCase UpdateCase(const std::string& type, const std::map<std::string, DDim>& dims) {
  OpCase c;
  c.name = type;
  c.type = type;
  auto in = [&](const std::string& slot, const DDim& d) {
    auto it = dims.find(slot);
    c.inputs.push_back(
        {slot, {RandomTensor(it == dims.end() ? d : it->second, DType::kFloat32, 0, 1, 9)}});
  };
  in("Param", {3, 4});
  in("Grad", {3, 4});
  in("LearningRate", {1});
  if (type == "momentum") {
    in("Velocity", {3, 4});
    c.outputs = {{"ParamOut", 1}, {"VelocityOut", 1}};
  } else {
    in("Moment1", {3, 4});
    in("Moment2", {3, 4});
    in("Beta1Pow", {1});
    in("Beta2Pow", {1});
    c.outputs = {{"ParamOut", 1},
                 {"Moment1Out", 1},
                 {"Moment2Out", 1},
                 {"Beta1PowOut", 1},
                 {"Beta2PowOut", 1}};
  }
  return c;
}

TEST(OptimizerOps, ShapeMismatchesAreBuildErrorsWithBothShapes) {
  struct Bad {
    std::string type, slot;
    DDim dims;
    std::vector<std::string> parts;
  };
  const Bad cases[] = {
      {"momentum", "Grad", {4, 3}, {"momentum", "Grad", "[3, 4]", "[4, 3]"}},
      {"momentum", "Velocity", {3, 5}, {"momentum", "Velocity", "[3, 4]", "[3, 5]"}},
      {"momentum", "LearningRate", {2}, {"momentum", "LearningRate", "[2]"}},
      {"adam", "Moment1", {12}, {"adam", "Moment1", "[3, 4]", "[12]"}},
      {"adam", "Moment2", {3, 4, 1}, {"adam", "Moment2", "[3, 4]", "[3, 4, 1]"}},
      {"adam", "Beta1Pow", {2}, {"adam", "Beta1Pow", "one element", "[2]"}},
      {"adamw", "Grad", {3}, {"adamw", "[3, 4]", "[3]"}},
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.type + " " + b.slot);
    ExpectErrorContainsAll(ForwardError(UpdateCase(b.type, {{b.slot, b.dims}})), b.parts);
  }
}

TEST(OptimizerOps, BadAttrsAreBuildErrors) {
  OpCase c = UpdateCase("adam", {});
  c.attrs = {{"beta1", 1.5f}};
  ExpectErrorContainsAll(ForwardError(c), {"adam", "beta1", "[0, 1)"});
}

// ------------------------------------------------------------ squared_l2_norm, clip_by_global_norm

TEST(SquaredL2NormOp, SumOfSquares) {
  for (DType dt : kFloatTypes) {
    OpCase c;
    c.name = "sq";
    c.type = "squared_l2_norm";
    c.inputs = {{"X", {RandomTensor({7, 3}, dt, -2, 2, 11)}}};
    double want = 0;
    for (double x : ToDouble(c.inputs[0].second[0])) want += x * x;
    ExpectOutputNear(c, "Out", {1}, {want}, {2e-6, true});
  }
}

OpCase ClipCase(DType dt, float clip_norm) {
  OpCase c;
  c.name = StrCat("clip_norm=", clip_norm);
  c.type = "clip_by_global_norm";
  Tensor a = Tensor::FromVector<double>({3, 0}, {2});
  Tensor b = Tensor::FromVector<double>({0, 4, 0}, {1, 3});  // global norm 5
  if (dt == DType::kFloat32) {
    a = Tensor::FromVector<float>({3, 0}, {2});
    b = Tensor::FromVector<float>({0, 4, 0}, {1, 3});
  }
  c.inputs = {{"X", {a, b}}};
  c.outputs = {{"Out", 2}, {"GlobalNorm", 1}};
  c.attrs = {{"clip_norm", clip_norm}};
  return c;
}

TEST(ClipByGlobalNormOp, ScalesToClipNormOnlyAboveIt) {
  for (DType dt : kFloatTypes)
    for (float clip : {1.0f, 5.0f, 10.0f}) {
      OpCase c = ClipCase(dt, clip);
      SCOPED_TRACE(Describe(c));
      auto out = RunForward(c);
      const double s = clip < 5 ? clip / 5.0 : 1.0;
      ExpectNear(out["Out"][0], {3 * s, 0}, "Out[0]");
      ExpectNear(out["Out"][1], {0, 4 * s, 0}, "Out[1]");
      EXPECT_EQ(out["Out"][1].dims(), DDim({1, 3}));
      ExpectNear(out["GlobalNorm"][0], {5}, "GlobalNorm");
    }
}

TEST(ClipByGlobalNormOp, ClipsInPlace) {
  Program prog;
  Block& block = prog.global_block();
  for (const char* n : {"g0", "g1"}) {
    block.Var(n)->set_is_data(true);
    block.Var(n)->set_shape({2});
  }
  AppendOp(block, "clip_by_global_norm", {{"X", {"g0", "g1"}}}, {{"Out", {"g0", "g1"}}},
           {{"clip_norm", 0.5f}});
  Tensor g0 = Tensor::FromVector<float>({3, 0}, {2}), g1 = Tensor::FromVector<float>({0, 4}, {2});
  Executor exe;
  exe.Run(prog, {{"g0", g0}, {"g1", g1}});
  ExpectNear(g0, {0.3, 0}, "g0");
  ExpectNear(g1, {0, 0.4}, "g1");
}

TEST(ClipByGlobalNormOp, ErrorsNameTheProblem) {
  OpCase c = ClipCase(DType::kFloat32, 1.0f);
  c.inputs[0].second[1] = Tensor::FromVector<double>({0, 4, 0}, {1, 3});
  ExpectErrorContainsAll(ForwardError(c), {"clip_by_global_norm", "float64", "float32"});
  c = ClipCase(DType::kFloat32, 0.0f);
  ExpectErrorContainsAll(ForwardError(c), {"clip_by_global_norm", "clip_norm", "> 0"});
  c = ClipCase(DType::kFloat32, 1.0f);
  c.attrs.clear();
  ExpectErrorContainsAll(ForwardError(c), {"clip_by_global_norm", "clip_norm", "not set"});
}

// ------------------------------------------------------------------------------------ increment

TEST(IncrementOp, CountsInPlace) {
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt64}) {
    SCOPED_TRACE(DTypeName(dt));
    Program prog;
    Block& block = prog.global_block();
    VarDesc* v = block.Var("counter");
    v->set_is_data(true);
    v->set_shape({1});
    v->set_dtype(dt);
    AppendOp(block, "increment", {{"X", {"counter"}}}, {{"Out", {"counter"}}}, {{"step", 2.0f}});
    Tensor counter(dt, {1});
    VisitDType(dt, [&](auto z) { counter.data<decltype(z)>()[0] = decltype(z)(-1); });
    Executor exe;
    for (int k = 0; k < 3; ++k) {
      exe.Run(prog, {{"counter", counter}});
      EXPECT_EQ(ToDouble(counter)[0], -1 + 2 * (k + 1)) << "after run " << k;
    }
  }
}

TEST(IncrementOp, NeedsOneElement) {
  OpCase c;
  c.name = "two";
  c.type = "increment";
  c.inputs = {{"X", {Tensor::FromVector<float>({1, 2}, {2})}}};
  ExpectErrorContainsAll(ForwardError(c), {"increment", "one element", "[2]"});
}

// ---------------------------------------------------------------------------------- lr_schedule

OpCase ScheduleCase(double step, std::map<std::string, Attribute> attrs,
                    DType dt = DType::kFloat32) {
  OpCase c;
  c.name = StrCat("step ", step);
  c.type = "lr_schedule";
  Tensor s(dt, {1});
  VisitDType(dt, [&](auto z) { s.data<decltype(z)>()[0] = static_cast<decltype(z)>(step); });
  c.inputs = {{"Step", {s}}};
  c.outputs = {{"LearningRate", 1}};
  c.attrs = std::move(attrs);
  return c;
}

struct ScheduleParams {
  std::string name;
  std::map<std::string, Attribute> attrs;
  std::vector<std::pair<double, double>> step_lr;  // hand-computed
};

const std::vector<ScheduleParams>& Schedules() {
  static const std::vector<ScheduleParams> kSchedules = {
      {"constant",
       {{"type", std::string("constant")}, {"base_lr", 0.3f}},
       {{0, 0.3}, {1, 0.3}, {1000, 0.3}}},
      {"piecewise",
       {{"type", std::string("piecewise")},
        {"boundaries", std::vector<int>{3, 6}},
        {"values", std::vector<float>{1.0f, 0.5f, 0.1f}}},
       {{-1, 1.0}, {0, 1.0}, {1, 1.0}, {2, 1.0}, {3, 0.5}, {5, 0.5}, {6, 0.1}, {100, 0.1}}},
      // 0.1 + 0.9 * (1 + cos(pi * s / 10)) / 2
      {"cosine",
       {{"type", std::string("cosine")}, {"base_lr", 1.0f}, {"total_steps", 10}, {"min_lr", 0.1f}},
       {{0, 1.0}, {1, 0.9779754323}, {5, 0.55}, {9, 0.1220245677}, {10, 0.1}, {20, 0.1}}},
      // warm-up towards the piecewise value at step 4 (0.5), then piecewise
      {"warmup piecewise",
       {{"type", std::string("piecewise")},
        {"boundaries", std::vector<int>{3, 6}},
        {"values", std::vector<float>{1.0f, 0.5f, 0.1f}},
        {"warmup_steps", 4}},
       {{0, 0.0}, {1, 0.125}, {3, 0.375}, {4, 0.5}, {5, 0.5}, {6, 0.1}}},
      {"warmup with end_lr",
       {{"type", std::string("constant")},
        {"base_lr", 0.2f},
        {"warmup_steps", 4},
        {"warmup_start_lr", 0.1f},
        {"warmup_end_lr", 1.0f}},
       {{0, 0.1}, {2, 0.55}, {3, 0.775}, {4, 0.2}, {50, 0.2}}},
  };
  return kSchedules;
}

TEST(LrScheduleOp, DocumentedValuesAtChosenSteps) {
  for (const ScheduleParams& p : Schedules())
    for (auto [step, lr] : p.step_lr)
      for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt64}) {
        if (dt == DType::kInt64 && step < 0) continue;
        SCOPED_TRACE(p.name);
        ExpectOutputNear(ScheduleCase(step, p.attrs, dt), "LearningRate", {1}, {lr}, {1e-6});
      }
}

TEST(LrScheduleOp, OutputIsFloat32) {
  auto out = RunForward(ScheduleCase(2, {{"base_lr", 0.5f}}, DType::kFloat64));
  EXPECT_EQ(out["LearningRate"][0].dtype(), DType::kFloat32);
}

TEST(LrScheduleOp, BadAttrsAreBuildErrors) {
  ExpectErrorContainsAll(ForwardError(ScheduleCase(0, {{"type", std::string("linear")}})),
                         {"lr_schedule", "linear", "piecewise"});
  ExpectErrorContainsAll(ForwardError(ScheduleCase(0, {{"type", std::string("piecewise")},
                                                       {"boundaries", std::vector<int>{3}},
                                                       {"values", std::vector<float>{1.0f}}})),
                         {"lr_schedule", "1 boundaries", "1 values"});
  ExpectErrorContainsAll(
      ForwardError(ScheduleCase(0, {{"type", std::string("piecewise")},
                                    {"boundaries", std::vector<int>{5, 3}},
                                    {"values", std::vector<float>{1.0f, 0.5f, 0.1f}}})),
      {"lr_schedule", "increase", "5", "3"});
  ExpectErrorContainsAll(ForwardError(ScheduleCase(0, {{"type", std::string("cosine")}})),
                         {"lr_schedule", "total_steps"});
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

// A large parameter's sgd and momentum updates run in pieces of 128 K elements on the thread
// budget (memory-bound: one thread left the seed MLP's 1280 x 1280 update at 0.55-0.9 ms), with
// the reference's values.
TEST(OptimizerOps, LargeUpdatesRunInPiecesOnThePool) {
  cpu_threads::SetBudget(4);
  const DDim dims{3, 100003};  // 2.3 pieces
  OpCase c = SgdCase("large", DType::kFloat32, dims, dims, 0.1f);
  std::vector<double> p = ToDouble(c.inputs[0].second[0]), g = ToDouble(c.inputs[1].second[0]);
  std::vector<double> want(p.size());
  for (size_t i = 0; i < p.size(); ++i) want[i] = p[i] - static_cast<double>(0.1f) * g[i];
  int64_t before = cpu_threads::SplitCalls();
  ExpectForward(c, "ParamOut", dims, want);
  EXPECT_GT(cpu_threads::SplitCalls(), before) << "sgd ran in one piece";

  const double lr = static_cast<double>(0.1f), mu = static_cast<double>(0.9f);
  std::map<std::string, Tensor> state = {
      {"Param", RandomTensor(dims, DType::kFloat32, -1, 1, 1)},
      {"Velocity", RandomTensor(dims, DType::kFloat32, -1, 1, 2)},
      {"LearningRate", Scalar(lr, DType::kFloat32)}};
  std::vector<Tensor> grads = Grads(dims, DType::kFloat32, 1);
  std::vector<double> mp = ToDouble(state["Param"]), v = ToDouble(state["Velocity"]);
  before = cpu_threads::SplitCalls();
  RunInPlaceSteps("momentum", {{"mu", 0.9f}, {"use_nesterov", false}}, state, grads,
                  {{"ParamOut", "Param"}, {"VelocityOut", "Velocity"}}, [&](int k) {
                    std::vector<double> gk = ToDouble(grads[k]);
                    for (size_t i = 0; i < mp.size(); ++i) {
                      v[i] = mu * v[i] + gk[i];
                      mp[i] -= lr * v[i];
                    }
                    ExpectNear(state["Velocity"], v, "Velocity");
                    ExpectNear(state["Param"], mp, "Param");
                  });
  EXPECT_GT(cpu_threads::SplitCalls(), before) << "momentum ran in one piece";
  cpu_threads::SetBudget(1);
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
