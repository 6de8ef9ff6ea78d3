// Training with gradient merge on one device: k runs on batches of b rows equal one step on the
// k * b rows (SGD, Momentum, Adam, with clipping and a learning-rate schedule that counts
// optimizer steps), to float rounding, with the largest relative difference printed; k = 1 is
// the plain program bit for bit; a checkpoint taken in the middle of an accumulation resumes
// bit for bit; with loss scaling the scale moves once per merge step and an overflow in any run
// of an accumulation skips that whole step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "executor/executor_io.h"
#include "framework/dsl/amp.h"
#include "framework/dsl/gradient_merge.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/lr_schedule.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "tests/util/subprocess.h"
#include "transpiler/gradient_merge_pass.h"

namespace keel {
namespace {

struct Recipe {
  const char* opt = "sgd";  // sgd | momentum | adam
  bool clip = false;        // global-norm clipping (tight enough to act)
  bool schedule = false;    // piecewise: the rate / 5 from optimizer step 2 on
  bool decay = false;       // L2 weight decay
};

std::unique_ptr<optimizer::Optimizer> MakeOptimizer(const Recipe& s) {
  const float base = std::string(s.opt) == "adam" ? 0.01f : 0.5f;
  LearningRate lr = base;
  if (s.schedule) lr = lr_schedule::Piecewise({2}, {base, base / 5});
  std::unique_ptr<optimizer::Optimizer> opt;
  if (std::string(s.opt) == "momentum") {
    opt = std::make_unique<optimizer::Momentum>(lr, 0.9f);
  } else if (std::string(s.opt) == "adam") {
    opt = std::make_unique<optimizer::Adam>(lr);
  } else {
    opt = std::make_unique<optimizer::SGD>(lr);
  }
  if (s.clip) opt->set_grad_clip({0.05f});
  if (s.decay) opt->set_weight_decay(0.01f);
  return opt;
}

struct Mlp {
  Program main, startup;
  std::unique_ptr<gradient_merge::GradientMergeOptimizer> gm;
};

Var Loss() {
  Var x = layers::data("x", {-1, 6});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 16, "tanh");
  return layers::mean(layers::softmax_with_cross_entropy(layers::fc(h, 3), y));
}

// k == 0: no gradient merge.
void Build(Mlp& m, const Recipe& s, int k, bool avg = true) {
  ProgramGuard guard(m.main, m.startup);
  m.startup.set_random_seed(5);
  Var loss = Loss();
  if (k == 0) {
    MakeOptimizer(s)->minimize(loss);
    return;
  }
  gradient_merge::GradientMergeConfig c;
  c.k_steps = k;
  c.avg = avg;
  m.gm = std::make_unique<gradient_merge::GradientMergeOptimizer>(*MakeOptimizer(s), c);
  m.gm->minimize(loss);
}

// Rows [first, first + n) of big step `step`'s batch; `inf_at` >= 0 puts an inf in that row.
FeedMap Rows(int step, int first, int n, int inf_at = -1) {
  Tensor x(DType::kFloat32, DDim({n, 6})), y(DType::kInt64, DDim({n, 1}));
  for (int r = 0; r < n; ++r) {
    const int row = first + r;
    for (int c = 0; c < 6; ++c)
      x.data<float>()[r * 6 + c] =
          0.2f * static_cast<float>((row * 7 + c * 5 + step * 3) % 13) - 1.1f;
    y.data<int64_t>()[r] = (row * 5 + step) % 3;
    if (row == inf_at) x.data<float>()[r * 6] = std::numeric_limits<float>::infinity();
  }
  return {{"x", x}, {"y", y}};
}

const Tensor& Value(Executor& exe, const std::string& name) {
  const Variable* v = exe.scope().FindVar(name);
  EXPECT_NE(v, nullptr) << name;
  return v->tensor();
}

struct Diff {
  double rel = 0, abs = 0;
};

// Over every parameter: the largest |a - b| / max(|a|, |b|) (elements above 1e-3) and |a - b|.
Diff Compare(const Program& program, Executor& a, Executor& b) {
  Diff d;
  for (const VarDesc* v : program.global_block().AllVars()) {
    if (!v->is_parameter()) continue;
    const Tensor& ta = Value(a, v->name());
    const Tensor& tb = Value(b, v->name());
    for (int64_t i = 0; i < ta.numel(); ++i) {
      const double x = ta.data<float>()[i], y = tb.data<float>()[i];
      const double m = std::max(std::abs(x), std::abs(y));
      d.abs = std::max(d.abs, std::abs(x - y));
      if (m > 1e-3) d.rel = std::max(d.rel, std::abs(x - y) / m);
    }
  }
  return d;
}

constexpr int kK = 4, kB = 6, kBigSteps = 5;

// Trains `gm` with k runs of b rows and `plain` with one run of k * b rows per big step.
Diff TrainBoth(Mlp& gm, Mlp& plain, Executor& a, Executor& b) {
  a.Run(gm.startup);
  b.Run(plain.startup);
  for (int s = 0; s < kBigSteps; ++s) {
    for (int r = 0; r < kK; ++r) a.Run(gm.main, Rows(s, r * kB, kB));
    b.Run(plain.main, Rows(s, 0, kK * kB));
  }
  return Compare(plain.main, a, b);
}

TEST(GradientMergeTraining, KRunsOfBatchBEqualOneStepOfBatchKB) {
  for (Recipe s : {Recipe{"sgd"}, Recipe{"momentum"}, Recipe{"adam"}, Recipe{"sgd", true, true},
                   Recipe{"momentum", false, true}, Recipe{"adam", true, true},
                   Recipe{"momentum", false, false, true}}) {
    const std::string what = std::string(s.opt) + (s.clip ? " +clip" : "") +
                             (s.schedule ? " +schedule" : "") + (s.decay ? " +weight decay" : "");
    SCOPED_TRACE(what);
    Mlp gm, plain;
    Build(gm, s, kK);
    Build(plain, s, 0);
    Executor a, b;
    const Diff d = TrainBoth(gm, plain, a, b);
    std::printf(
        "gradient merge k=%d b=%d vs one step of %d rows, %d steps, %s: max relative "
        "difference %.3g, max abs difference %.3g\n",
        kK, kB, kK * kB, kBigSteps, what.c_str(), d.rel, d.abs);
    RecordProperty("max_rel_diff_" + std::string(s.opt) + (s.clip ? "_clip" : "") +
                       (s.schedule ? "_schedule" : "") + (s.decay ? "_decay" : ""),
                   std::to_string(d.rel));
    // Float rounding: the sums run in another order (about 1e-5 on the smallest elements).
    EXPECT_LT(d.rel, 1e-4);
    EXPECT_LT(d.abs, 1e-6);
    // Every run is accounted for: the counter is back at 0 after whole accumulations, and a
    // schedule counted one step per merge (it starts at -1).
    EXPECT_EQ(Value(a, transpiler::kGradientMergeStepVar).data<int64_t>()[0], 0);
    if (s.schedule) {
      EXPECT_EQ(Value(a, lr_schedule::kCounterName).data<float>()[0], kBigSteps - 1.0f);
      EXPECT_EQ(Value(b, lr_schedule::kCounterName).data<float>()[0], kBigSteps - 1.0f);
    }
  }
}

// The comparison can fail: the sum of the k gradients (avg=false) is k times the step.
TEST(GradientMergeTraining, WithoutAvgTheStepIsKTimesLarger) {
  Mlp gm, plain;
  Build(gm, Recipe{"sgd"}, kK, /*avg=*/false);
  Build(plain, Recipe{"sgd"}, 0);
  Executor a, b;
  EXPECT_GT(TrainBoth(gm, plain, a, b).rel, 1e-2);
}

TEST(GradientMergeTraining, KOneIsThePlainProgramBitForBit) {
  for (const char* opt : {"sgd", "momentum", "adam"}) {
    SCOPED_TRACE(opt);
    Mlp gm, plain;
    Build(gm, Recipe{opt, true, true}, 1);
    Build(plain, Recipe{opt, true, true}, 0);
    Executor a, b;
    a.Run(gm.startup);
    b.Run(plain.startup);
    for (int s = 0; s < 6; ++s) {
      a.Run(gm.main, Rows(s, 0, kB));
      b.Run(plain.main, Rows(s, 0, kB));
    }
    const Diff d = Compare(plain.main, a, b);
    EXPECT_EQ(d.abs, 0.0);
  }
}

// Every persistable of `program` as bytes (the counter and the merge buffers included).
std::map<std::string, std::vector<char>> Persistables(const Program& program, Executor& exe) {
  std::map<std::string, std::vector<char>> out;
  for (const VarDesc* v : program.global_block().AllVars()) {
    if (!v->persistable()) continue;
    const Tensor t = Value(exe, v->name()).Clone(CPUPlace());
    const char* p = static_cast<const char*>(t.raw_data());
    out[v->name()] = std::vector<char>(p, p + t.nbytes());
  }
  return out;
}

// Saved after k + 1 runs (one run into the second accumulation), loaded into a fresh executor
// and continued: every persistable ends bit for bit as in the uninterrupted run. Without the
// saved buffers (zeroed after the load) it does not.
TEST(GradientMergeTraining, ACheckpointMidAccumulationResumesBitForBit) {
  constexpr int k = 3, total = 10;
  Mlp m;
  Build(m, Recipe{"adam", true, true}, k);
  Executor whole;
  whole.Run(m.startup);
  for (int r = 0; r < total; ++r) whole.Run(m.main, Rows(r, 0, kB));
  const auto want = Persistables(m.main, whole);

  const std::string dir = testing::MakeTempDir();
  Executor first;
  first.Run(m.startup);
  for (int r = 0; r < k + 1; ++r) first.Run(m.main, Rows(r, 0, kB));
  EXPECT_EQ(transpiler::GradientMergeRunsAccumulated(first.scope()), 1);
  const Tensor& buf = Value(first, "fc_0.w_0@GRAD@GRAD_MERGED");
  float norm = 0;
  for (int64_t i = 0; i < buf.numel(); ++i) norm += std::abs(buf.data<float>()[i]);
  EXPECT_GT(norm, 0.0f) << "the checkpoint must hold a partial accumulation";
  save_persistables(first, dir, m.main);

  for (bool drop_buffers : {false, true}) {
    SCOPED_TRACE(drop_buffers ? "buffers zeroed after the load" : "as loaded");
    Executor resumed;
    resumed.Run(m.startup);
    load_persistables(resumed, dir, m.main);
    EXPECT_EQ(transpiler::GradientMergeRunsAccumulated(resumed.scope()), 1);
    if (drop_buffers)
      for (const VarDesc* v : m.main.global_block().AllVars())
        if (v->name().find(transpiler::kGradientMergeSuffix) != std::string::npos) {
          Tensor* t = resumed.scope().FindVar(v->name())->mutable_tensor();
          std::memset(t->raw_data(), 0, t->nbytes());
        }
    for (int r = k + 1; r < total; ++r) resumed.Run(m.main, Rows(r, 0, kB));
    const auto got = Persistables(m.main, resumed);
    ASSERT_EQ(got.size(), want.size());
    bool same = true;
    for (const auto& [name, bytes] : want) {
      const bool eq = got.at(name) == bytes;
      same = same && eq;
      if (!drop_buffers) {
        EXPECT_TRUE(eq) << name << " differs from the uninterrupted run";
      }
    }
    if (drop_buffers) {
      EXPECT_FALSE(same) << "losing the partial sums must change the result";
    }
  }
  testing::RunCommand("rm -rf " + dir);
}

// Loss scaling under gradient merge: the scale moves once per merge step (after
// incr_every_n_steps finite merge steps, not runs), and an overflow in one run of an
// accumulation skips the whole merge step: parameters and accumulators unchanged, the scale
// halved, the buffers emptied.
TEST(GradientMergeTraining, LossScalingDecidesOncePerMergeStepOnTheMergedGradient) {
  constexpr int k = 3;
  for (const char* name : {"sgd", "adam"}) {
    SCOPED_TRACE(name);
    Mlp m;
    amp::AmpConfig c;
    c.dtype = DType::kFloat16;  // loss scaling on; kernels this CPU lacks stay float32
    c.init_loss_scaling = 1024.0f;
    c.incr_every_n_steps = 2;
    {
      ProgramGuard guard(m.main, m.startup);
      m.startup.set_random_seed(5);
      Var loss = Loss();
      gradient_merge::GradientMergeConfig g;
      g.k_steps = k;
      m.gm = std::make_unique<gradient_merge::GradientMergeOptimizer>(
          amp::decorate(*MakeOptimizer(Recipe{name}), c), g);
      m.gm->minimize(loss);
    }
    const amp::MixedPrecisionOptimizer& a = *m.gm->amp_optimizer();
    Executor exe;
    exe.Run(m.startup);
    auto scale = [&] { return Value(exe, a.loss_scaling_var()).data<float>()[0]; };
    auto skipped = [&] { return Value(exe, a.skipped_steps_var()).data<float>()[0]; };
    auto cycle = [&](int step) {
      for (int r = 0; r < k; ++r) exe.Run(m.main, Rows(step, r * kB, kB));
    };
    cycle(0);
    EXPECT_EQ(scale(), 1024.0f);
    cycle(1);  // the 2nd finite merge step: the scale grows (per run it would be 8192)
    EXPECT_EQ(scale(), 2048.0f);

    // The state a skipped merge step must leave as it is.
    auto training_state = [&] {
      auto all = Persistables(m.main, exe);
      for (auto it = all.begin(); it != all.end();) {
        const std::string& n = it->first;
        const bool scaling = n == a.loss_scaling_var() || n == a.good_steps_var() ||
                             n == a.bad_steps_var() || n == a.skipped_steps_var();
        const bool merging = n == transpiler::kGradientMergeStepVar ||
                             n.find(transpiler::kGradientMergeSuffix) != std::string::npos;
        it = scaling || merging ? all.erase(it) : std::next(it);
      }
      return all;
    };
    const auto before = training_state();
    exe.Run(m.main, Rows(2, 0, kB));
    exe.Run(m.main, Rows(2, kB, kB, kB));  // an inf in this run's first row
    EXPECT_EQ(scale(), 2048.0f) << "no decision before the merge step";
    EXPECT_EQ(skipped(), 0.0f) << "a run that is not a merge step skips nothing";
    exe.Run(m.main, Rows(2, 2 * kB, kB));  // the merge step: skipped
    EXPECT_TRUE(training_state() == before) << "a skipped merge step changed the training state";
    EXPECT_EQ(scale(), 1024.0f);
    EXPECT_EQ(skipped(), 1.0f) << "one skipped merge step";
    EXPECT_EQ(transpiler::GradientMergeRunsAccumulated(exe.scope()), 0);
    const Tensor& buf = Value(exe, "fc_0.w_0@GRAD@GRAD_MERGED");
    for (int64_t i = 0; i < buf.numel(); ++i) ASSERT_EQ(buf.data<float>()[i], 0.0f) << i;

    cycle(3);  // finite again: trains
    EXPECT_FALSE(training_state() == before);
    EXPECT_EQ(skipped(), 1.0f);
  }
}

}  // namespace
}  // namespace keel
