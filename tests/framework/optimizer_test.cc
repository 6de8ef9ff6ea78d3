// optimizer:: and lr_schedule:: in programs: every optimizer trains a small regression, the
// accumulators are named, persistable and initialized as Paddle does, schedules give the rate
// documented in ops/lr_schedule_ops.cc at the chosen steps and resume from a checkpoint, and
// global-norm clipping scales the gradients to the clip norm.
#include "framework/dsl/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "executor/executor_io.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/lr_schedule.h"
#include "framework/io/checkpoint.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"
#include "tests/util/subprocess.h"

namespace keel {
namespace {

using testing::ErrorOf;
using testing::ToDouble;

// y = x . w_true + 0.5 over a fixed batch; loss = mean((fc(x) - y)^2).
struct Regression {
  Program main, startup;
  Var loss;
  FeedMap feed;
};

std::unique_ptr<Regression> BuildRegression(
    const std::function<void(Var loss, Program* startup)>& minimize) {
  auto r = std::make_unique<Regression>();
  r->main.set_random_seed(5);
  r->startup.set_random_seed(5);
  ProgramGuard guard(r->main, r->startup);
  Var x = layers::data("x", {-1, 4});
  Var y = layers::data("y", {-1, 1});
  Var diff = layers::elementwise_sub(layers::fc(layers::fc(x, 8, "tanh"), 1), y);
  r->loss = layers::mean(layers::elementwise_mul(diff, diff));
  minimize(r->loss, &r->startup);
  Tensor xs = testing::RandomTensor({32, 4}, DType::kFloat32, -1, 1, 17);
  Tensor ys(DType::kFloat32, {32, 1});
  const float w_true[4] = {0.5f, -1.0f, 2.0f, 0.25f};
  for (int i = 0; i < 32; ++i) {
    float s = 0.5f;
    for (int j = 0; j < 4; ++j) s += xs.data<float>()[i * 4 + j] * w_true[j];
    ys.data<float>()[i] = s;
  }
  r->feed = {{"x", xs}, {"y", ys}};
  return r;
}

// Builds the regression minimized by `opt`.
std::unique_ptr<Regression> BuildWith(optimizer::Optimizer& opt) {
  return BuildRegression([&](Var loss, Program* startup) { opt.minimize(loss, startup); });
}

float RunLoss(Executor& exe, Regression& r) {
  return exe.Run(r.main, r.feed, {r.loss})[0].item<float>();
}

const Tensor& ScopeTensor(Executor& exe, const std::string& name) {
  Variable* v = exe.scope().FindVar(name);
  KEEL_ENFORCE(v != nullptr, "no var ", name, " in the scope");
  return v->tensor();
}

// ----------------------------------------------------------------------------------- training

TEST(Optimizers, EachLowersTheLossOfASmallRegression) {
  struct Case {
    std::string name;
    std::function<std::unique_ptr<optimizer::Optimizer>()> make;
  };
  const Case cases[] = {
      {"sgd", [] { return std::make_unique<optimizer::SGD>(0.1f); }},
      {"momentum", [] { return std::make_unique<optimizer::Momentum>(0.05f, 0.9f); }},
      {"nesterov", [] { return std::make_unique<optimizer::Momentum>(0.05f, 0.9f, true); }},
      {"adam", [] { return std::make_unique<optimizer::Adam>(0.02f); }},
      {"adamw", [] { return std::make_unique<optimizer::AdamW>(0.02f, 0.01f); }},
      {"sgd cosine",
       [] { return std::make_unique<optimizer::SGD>(lr_schedule::Cosine(0.1f, 40)); }},
      {"adam warmup clipped",
       [] {
         auto opt = std::make_unique<optimizer::Adam>(
             lr_schedule::LinearWarmup(lr_schedule::Piecewise({20}, {0.02f, 0.01f}), 5));
         opt->set_grad_clip({1.0f});
         return opt;
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto opt = c.make();
    auto r = BuildWith(*opt);
    Executor exe;
    exe.Run(r->startup);
    const float first = RunLoss(exe, *r);
    float last = first;
    for (int step = 1; step < 40; ++step) last = RunLoss(exe, *r);
    EXPECT_TRUE(std::isfinite(last));
    EXPECT_LT(last, 0.3f * first) << "first loss " << first << ", after 40 steps " << last;
  }
}

// ------------------------------------------------------------------------------- accumulators

TEST(Optimizers, AccumulatorsArePersistableNamedAndInitializedAsPaddle) {
  optimizer::Adam adam(0.01f, 0.9f, 0.999f);
  auto r = BuildWith(adam);
  for (const char* what : {"moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc"}) {
    std::string name = std::string("fc_0.w_0_") + what + "_0";
    SCOPED_TRACE(name);
    for (Program* p : {&r->main, &r->startup}) {
      VarDesc* v = p->global_block().FindVar(name);
      ASSERT_NE(v, nullptr);
      EXPECT_TRUE(v->persistable());
    }
  }
  EXPECT_EQ(r->main.global_block().FindVar("fc_0.w_0_moment1_0")->dims(), DDim({4, 8}));
  EXPECT_EQ(r->main.global_block().FindVar("fc_0.b_0_beta2_pow_acc_0")->dims(), DDim({1}));
  Executor exe;
  exe.Run(r->startup);
  EXPECT_EQ(ToDouble(ScopeTensor(exe, "fc_0.w_0_moment1_0")), std::vector<double>(32, 0.0));
  EXPECT_FLOAT_EQ(ScopeTensor(exe, "fc_0.w_0_beta1_pow_acc_0").item<float>(), 0.9f);
  EXPECT_FLOAT_EQ(ScopeTensor(exe, "fc_0.w_0_beta2_pow_acc_0").item<float>(), 0.999f);
  RunLoss(exe, *r);
  RunLoss(exe, *r);
  // The op advances the powers: beta^(t+1) after step t.
  EXPECT_NEAR(ScopeTensor(exe, "fc_0.w_0_beta1_pow_acc_0").item<float>(), 0.729f, 1e-6);

  optimizer::Momentum momentum(0.01f, 0.9f);
  auto m = BuildWith(momentum);
  VarDesc* v = m->startup.global_block().FindVar("fc_1.w_0_velocity_0");
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(v->persistable());
  EXPECT_EQ(v->dims(), DDim({8, 1}));
}

TEST(Optimizers, UpdateOpsCarryRoleAndParamGrad) {
  optimizer::AdamW adamw(0.01f, 0.05f);
  auto r = BuildWith(adamw);
  int updates = 0;
  for (auto& op : r->main.global_block().ops()) {
    if (op->type() != "adamw") continue;
    ++updates;
    EXPECT_EQ(op->Attr<int>(kOpRoleAttr), static_cast<int>(OpRole::kOptimize));
    const auto& pg = op->Attr<std::vector<std::string>>(kOpRoleVarAttr);
    ASSERT_EQ(pg.size(), 2u);
    EXPECT_EQ(op->Input("Param")[0], pg[0]);
    EXPECT_EQ(op->Output("ParamOut")[0], pg[0]);
    EXPECT_EQ(op->Input("Grad")[0], pg[1]);
    EXPECT_FLOAT_EQ(op->Attr<float>("coeff"), 0.05f);
  }
  EXPECT_EQ(updates, 4);
}

// fleet::distributed_optimizer copies the optimizer: the copy builds the same program.
TEST(Optimizers, CloneKeepsTypeAndBuildsTheSameProgram) {
  optimizer::Momentum momentum(lr_schedule::Cosine(0.1f, 100), 0.8f, true);
  momentum.set_grad_clip({2.0f});
  optimizer::SGD sgd(0.1f);
  optimizer::Adam adam(0.01f, 0.8f, 0.99f, 1e-6f);
  optimizer::AdamW adamw(lr_schedule::Piecewise({3}, {0.1f, 0.01f}), 0.02f);
  for (optimizer::Optimizer* opt :
       std::vector<optimizer::Optimizer*>{&sgd, &momentum, &adam, &adamw}) {
    SCOPED_TRACE(opt->type());
    std::unique_ptr<optimizer::Optimizer> copy = opt->Clone();
    EXPECT_EQ(copy->type(), opt->type());
    auto a = BuildWith(*opt);
    auto b = BuildWith(*copy);
    EXPECT_EQ(a->main.ToText(), b->main.ToText());
    EXPECT_EQ(a->startup.ToText(), b->startup.ToText());
  }
}

// ---------------------------------------------------------------------------------- schedules

// Runs r `steps` times; returns the learning rate each run used.
std::vector<double> LearningRates(Regression& r, const std::string& lr_var, int steps) {
  Executor exe;
  exe.Run(r.startup);
  std::vector<double> lrs;
  for (int i = 0; i < steps; ++i) lrs.push_back(ToDouble(exe.Run(r.main, r.feed, {lr_var})[0])[0]);
  return lrs;
}

TEST(LrSchedules, PiecewiseGivesTheDocumentedRates) {
  optimizer::SGD sgd(lr_schedule::Piecewise({3, 6}, {0.3f, 0.2f, 0.1f}));
  auto r = BuildWith(sgd);
  std::vector<double> lr = LearningRates(*r, sgd.learning_rate_var(), 8);
  // step 0, 1, boundary - 1, boundary, second boundary, after
  EXPECT_NEAR(lr[0], 0.3, 1e-7);
  EXPECT_NEAR(lr[1], 0.3, 1e-7);
  EXPECT_NEAR(lr[2], 0.3, 1e-7);
  EXPECT_NEAR(lr[3], 0.2, 1e-7);
  EXPECT_NEAR(lr[5], 0.2, 1e-7);
  EXPECT_NEAR(lr[6], 0.1, 1e-7);
  EXPECT_NEAR(lr[7], 0.1, 1e-7);
}

TEST(LrSchedules, WarmupThenCosineGivesTheDocumentedRates) {
  // Warm-up from 0 to cosine(4) over steps 0..3; cosine from 0.1 to 0.01 over 10 steps.
  optimizer::Momentum opt(lr_schedule::LinearWarmup(lr_schedule::Cosine(0.1f, 10, 0.01f), 4), 0.9f);
  auto r = BuildWith(opt);
  std::vector<double> lr = LearningRates(*r, opt.learning_rate_var(), 13);
  const double at4 = 0.01 + 0.09 * (1 + std::cos(M_PI * 0.4)) / 2;  // 0.0689057...
  EXPECT_NEAR(at4, 0.068905765, 1e-8);
  EXPECT_NEAR(lr[0], 0.0, 1e-8);          // start_lr
  EXPECT_NEAR(lr[1], at4 / 4, 1e-8);      // 0.0172264
  EXPECT_NEAR(lr[3], 3 * at4 / 4, 1e-8);  // last warm-up step
  EXPECT_NEAR(lr[4], at4, 1e-8);          // warm-up end: the schedule's value
  EXPECT_NEAR(lr[5], 0.01 + 0.09 * (1 + std::cos(M_PI * 0.5)) / 2, 1e-8);  // 0.055
  EXPECT_NEAR(lr[10], 0.01, 1e-8);                                         // total_steps
  EXPECT_NEAR(lr[12], 0.01, 1e-8);                                         // stays at min_lr
}

TEST(LrSchedules, WarmupToAnExplicitEndFromAConstant) {
  optimizer::SGD opt(lr_schedule::LinearWarmup(0.05f, 2, 0.01f, 0.03f));
  auto r = BuildWith(opt);
  std::vector<double> lr = LearningRates(*r, opt.learning_rate_var(), 4);
  EXPECT_NEAR(lr[0], 0.01, 1e-8);
  EXPECT_NEAR(lr[1], 0.02, 1e-8);
  EXPECT_NEAR(lr[2], 0.05, 1e-8);
  EXPECT_NEAR(lr[3], 0.05, 1e-8);
}

TEST(LrSchedules, CounterAndScheduleOpsOpenTheOptimizerSection) {
  optimizer::SGD sgd(lr_schedule::Cosine(0.1f, 10));
  auto r = BuildWith(sgd);
  const Block& b = r->main.global_block();
  size_t first_opt = b.num_ops();
  for (size_t i = 0; i < b.num_ops(); ++i)
    if (b.op(i)->HasAttr(kOpRoleAttr) &&
        b.op(i)->Attr<int>(kOpRoleAttr) == static_cast<int>(OpRole::kOptimize)) {
      first_opt = i;
      break;
    }
  ASSERT_LT(first_opt + 1, b.num_ops());
  EXPECT_EQ(b.op(first_opt)->type(), "increment");
  EXPECT_EQ(b.op(first_opt)->Input("X")[0], lr_schedule::kCounterName);
  EXPECT_EQ(b.op(first_opt)->Output("Out")[0], lr_schedule::kCounterName);
  EXPECT_EQ(b.op(first_opt + 1)->type(), "lr_schedule");
  EXPECT_EQ(b.op(first_opt + 1)->Attr<int>(kOpRoleAttr), static_cast<int>(OpRole::kOptimize));
  EXPECT_EQ(b.op(first_opt + 1)->Output("LearningRate")[0], sgd.learning_rate_var());
  EXPECT_FALSE(b.op(first_opt + 1)->HasAttr(kOpRoleVarAttr));
  for (const Program* p : {&r->main, &r->startup}) {
    VarDesc* c = p->global_block().FindVar(lr_schedule::kCounterName);
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(c->persistable());
    EXPECT_EQ(c->dims(), DDim({1}));
  }
}

TEST(LrSchedules, CheckpointedCounterResumesTheSchedule) {
  std::string dir = testing::MakeTempDir();
  optimizer::SGD sgd(lr_schedule::Piecewise({4}, {0.3f, 0.1f}));
  auto r = BuildWith(sgd);
  const std::string lr = sgd.learning_rate_var();
  {
    Executor exe;
    exe.Run(r->startup);
    for (int step = 0; step < 4; ++step)
      EXPECT_NEAR(ToDouble(exe.Run(r->main, r->feed, {lr})[0])[0], 0.3, 1e-7) << step;
    EXPECT_EQ(ScopeTensor(exe, lr_schedule::kCounterName).item<float>(), 3.0f);
    save_persistables(exe, dir, r->main);
  }
  Executor fresh;
  fresh.Run(r->startup);
  EXPECT_EQ(ScopeTensor(fresh, lr_schedule::kCounterName).item<float>(), -1.0f);
  load_persistables(fresh, dir, r->main);
  EXPECT_EQ(ScopeTensor(fresh, lr_schedule::kCounterName).item<float>(), 3.0f);
  // The fifth step overall is step 4: the second piece.
  EXPECT_NEAR(ToDouble(fresh.Run(r->main, r->feed, {lr})[0])[0], 0.1, 1e-7);
  EXPECT_EQ(ScopeTensor(fresh, lr_schedule::kCounterName).item<float>(), 4.0f);
  testing::RunCommand("rm -rf " + dir);
}

TEST(LrSchedules, BadSchedulesFailWhereWritten) {
  EXPECT_NE(ErrorOf([] {
              lr_schedule::Piecewise({1, 2}, {0.1f});
            }).find("2 boundaries"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { lr_schedule::Cosine(0.1f, 0); }).find("total_steps"), std::string::npos);
  EXPECT_NE(ErrorOf([] {
              lr_schedule::LinearWarmup(lr_schedule::LinearWarmup(0.1f, 2), 3);
            }).find("already warms up"),
            std::string::npos);
  optimizer::SGD sgd(lr_schedule::Cosine(0.1f, 10));
  EXPECT_NE(ErrorOf([&] { sgd.learning_rate(); }).find("cosine"), std::string::npos);
  EXPECT_FLOAT_EQ(optimizer::SGD(0.25f).learning_rate(), 0.25f);
}

// ------------------------------------------------------------------------------------ clipping

TEST(GradientClip, GlobalNormScalesTheGradientsToTheClipNorm) {
  const float clip = 0.05f;
  std::unique_ptr<Program> backward_only;
  std::vector<ParamGrad> pgs;
  optimizer::SGD sgd(0.1f);
  sgd.set_grad_clip({clip});
  auto r = BuildRegression([&](Var loss, Program* startup) {
    pgs = sgd.backward(loss);
    backward_only = loss.block()->program()->Clone();
    sgd.apply_gradients(pgs, startup);
  });
  std::vector<std::string> grads;
  for (auto& pg : pgs) grads.push_back(pg.second);
  Executor exe;
  exe.Run(r->startup);
  // The same parameters: the backward-only program updates nothing.
  std::vector<Tensor> raw = exe.Run(*backward_only, r->feed, grads);
  std::vector<std::string> fetch = grads;
  fetch.push_back("global_grad_norm_0");
  std::vector<Tensor> clipped = exe.Run(r->main, r->feed, fetch);

  double raw_sq = 0, clipped_sq = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    for (double g : ToDouble(raw[i])) raw_sq += g * g;
    for (double g : ToDouble(clipped[i])) clipped_sq += g * g;
  }
  const double norm = std::sqrt(raw_sq);
  ASSERT_GT(norm, 2 * clip) << "the test needs gradients above the clip norm";
  EXPECT_NEAR(ToDouble(clipped.back())[0], norm, 1e-5 * norm);
  EXPECT_NEAR(std::sqrt(clipped_sq), clip, 1e-5);
  for (size_t i = 0; i < grads.size(); ++i) {
    std::vector<double> a = ToDouble(raw[i]), b = ToDouble(clipped[i]);
    for (size_t k = 0; k < a.size(); ++k)
      EXPECT_NEAR(b[k], a[k] * clip / norm, 1e-6) << grads[i] << " at " << k;
  }
}

TEST(GradientClip, OneOpBeforeTheUpdatesAndBadNormsRefused) {
  optimizer::Adam adam(0.01f);
  adam.set_grad_clip({1.0f});
  auto r = BuildWith(adam);
  const Block& b = r->main.global_block();
  int clip_at = -1, first_update = -1;
  for (size_t i = 0; i < b.num_ops(); ++i) {
    if (b.op(i)->type() == "clip_by_global_norm") clip_at = static_cast<int>(i);
    if (b.op(i)->type() == "adam" && first_update < 0) first_update = static_cast<int>(i);
  }
  ASSERT_GE(clip_at, 0);
  EXPECT_LT(clip_at, first_update);
  EXPECT_EQ(b.op(clip_at)->Input("X"), b.op(clip_at)->Output("Out"));
  EXPECT_EQ(b.op(clip_at)->Input("X").size(), 4u);
  EXPECT_NE(ErrorOf([&] { adam.set_grad_clip({0.0f}); }).find("clip_norm"), std::string::npos);
}

// ------------------------------------------------------------------------------- weight decay

TEST(WeightDecay, L2DecayUpdatesWithGradPlusCoeffTimesParam) {
  // One SGD step with decay: param' = param - lr * (grad + coeff * param), the raw gradient
  // left as backward wrote it.
  const float lr = 0.1f, coeff = 0.5f;
  std::unique_ptr<Program> backward_only;
  std::vector<ParamGrad> pgs;
  optimizer::SGD sgd(lr);
  sgd.set_weight_decay(coeff);
  auto r = BuildRegression([&](Var loss, Program* startup) {
    pgs = sgd.backward(loss);
    backward_only = loss.block()->program()->Clone();
    sgd.apply_gradients(pgs, startup);
  });
  Executor exe;
  exe.Run(r->startup);
  std::vector<std::string> names;
  for (auto& pg : pgs) names.push_back(pg.first);
  for (auto& pg : pgs) names.push_back(pg.second);
  std::vector<Tensor> before = exe.Run(*backward_only, r->feed, names);
  exe.Run(r->main, r->feed, {});
  for (size_t i = 0; i < pgs.size(); ++i) {
    std::vector<double> p = ToDouble(before[i]), g = ToDouble(before[pgs.size() + i]);
    std::vector<double> after = ToDouble(ScopeTensor(exe, pgs[i].first));
    for (size_t k = 0; k < p.size(); ++k)
      EXPECT_NEAR(after[k], p[k] - lr * (g[k] + coeff * p[k]), 1e-6) << pgs[i].first << " " << k;
  }
  EXPECT_NE(ErrorOf([&] { sgd.set_weight_decay(-1.0f); }).find("weight decay"), std::string::npos);
}

TEST(WeightDecay, AppendedAfterTheClipAndKeepsTheRawGradient) {
  optimizer::Momentum m(0.1f, 0.9f);
  m.set_grad_clip({1.0f});
  m.set_weight_decay(0.01f);
  auto r = BuildWith(m);
  const Block& b = r->main.global_block();
  int clip_at = -1, first_sum = -1, first_update = -1;
  for (size_t i = 0; i < b.num_ops(); ++i) {
    const std::string& t = b.op(i)->type();
    if (t == "clip_by_global_norm") clip_at = static_cast<int>(i);
    if (t == "sum" && first_sum < 0 &&
        b.op(i)->Output("Out")[0].find("@L2DECAY") != std::string::npos)
      first_sum = static_cast<int>(i);
    if (t == "momentum" && first_update < 0) first_update = static_cast<int>(i);
  }
  ASSERT_GE(clip_at, 0);
  ASSERT_GE(first_sum, 0);
  EXPECT_LT(clip_at, first_sum);
  EXPECT_LT(first_sum, first_update);
  const OpDesc* update = b.op(first_update);
  EXPECT_NE(update->Input("Grad")[0].find("@GRAD@L2DECAY"), std::string::npos);
  EXPECT_EQ(update->Attr<int>(kOpRoleAttr), static_cast<int>(OpRole::kOptimize));
}

}  // namespace
}  // namespace keel
