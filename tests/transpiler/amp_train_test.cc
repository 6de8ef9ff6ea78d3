// Training under amp::decorate with loss scaling: an overflow injected at one step skips exactly
// that step (every parameter and accumulator bit-identical to the step before), halves the scale
// and resets the counters, counts one skipped step; the next finite step trains again; the scale
// grows after incr_every_n_steps finite steps.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/amp.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/op/op_registry.h"

namespace keel {
namespace {

struct AmpMlp {
  Program main, startup;
  std::unique_ptr<amp::MixedPrecisionOptimizer> opt;
};

void Build(AmpMlp& m, const optimizer::Optimizer& inner, amp::AmpConfig c) {
  ProgramGuard guard(m.main, m.startup);
  m.main.set_random_seed(3);
  m.startup.set_random_seed(3);
  Var x = layers::data("x", {-1, 4});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 8, "relu");
  Var loss = layers::mean(layers::softmax_with_cross_entropy(layers::fc(h, 3), y));
  m.opt = std::make_unique<amp::MixedPrecisionOptimizer>(inner, std::move(c));
  m.opt->minimize(loss);
}

FeedMap Batch(int step, bool overflow) {
  Tensor x(DType::kFloat32, DDim({4, 4})), y(DType::kInt64, DDim({4, 1}));
  for (int i = 0; i < 16; ++i) x.data<float>()[i] = 0.1f * static_cast<float>((i * 7 + step) % 11);
  for (int i = 0; i < 4; ++i) y.data<int64_t>()[i] = (i + step) % 3;
  if (overflow) x.data<float>()[5] = std::numeric_limits<float>::infinity();
  return {{"x", x}, {"y", y}};
}

// Every persistable of main but the loss-scaling state, by name, as bytes.
std::map<std::string, std::vector<char>> Snapshot(const Program& main, Executor& exe,
                                                  const amp::MixedPrecisionOptimizer& opt) {
  std::map<std::string, std::vector<char>> out;
  for (const VarDesc* v : main.global_block().AllVars()) {
    if (!v->persistable()) continue;
    if (v->name() == opt.loss_scaling_var() || v->name() == opt.good_steps_var() ||
        v->name() == opt.bad_steps_var() || v->name() == opt.skipped_steps_var())
      continue;
    const Tensor& t = exe.scope().FindVar(v->name())->tensor();
    const char* p = static_cast<const char*>(t.raw_data());
    out[v->name()] = std::vector<char>(p, p + t.numel() * SizeOf(t.dtype()));
  }
  return out;
}

float ScalarF(Executor& exe, const std::string& name) {
  return exe.scope().FindVar(name)->tensor().data<float>()[0];
}
int ScalarI(Executor& exe, const std::string& name) {
  return exe.scope().FindVar(name)->tensor().data<int32_t>()[0];
}

void CheckOverflowSkipsOneStep(const optimizer::Optimizer& inner) {
  SCOPED_TRACE(inner.type());
  amp::AmpConfig c;
  c.dtype = DType::kFloat16;  // loss scaling on; kernels this CPU lacks stay float32
  c.init_loss_scaling = 1024.0f;
  c.incr_every_n_steps = 3;
  AmpMlp m;
  Build(m, inner, c);
  Executor exe;
  exe.Run(m.startup);
  exe.Run(m.main, Batch(0, false));
  EXPECT_EQ(ScalarF(exe, m.opt->loss_scaling_var()), 1024.0f);
  EXPECT_EQ(ScalarI(exe, m.opt->good_steps_var()), 1);
  EXPECT_EQ(ScalarF(exe, m.opt->skipped_steps_var()), 0.0f);
  const auto before = Snapshot(m.main, exe, *m.opt);

  exe.Run(m.main, Batch(1, true));  // overflow: skipped
  const auto after_skip = Snapshot(m.main, exe, *m.opt);
  ASSERT_EQ(before.size(), after_skip.size());
  for (const auto& [name, bytes] : before)
    EXPECT_TRUE(bytes == after_skip.at(name)) << name << " changed on a skipped step";
  EXPECT_EQ(ScalarF(exe, m.opt->loss_scaling_var()), 512.0f);
  EXPECT_EQ(ScalarI(exe, m.opt->good_steps_var()), 0);
  EXPECT_EQ(ScalarI(exe, m.opt->bad_steps_var()), 0);
  EXPECT_EQ(ScalarF(exe, m.opt->skipped_steps_var()), 1.0f);

  exe.Run(m.main, Batch(2, false));  // finite: trains
  const auto after_step = Snapshot(m.main, exe, *m.opt);
  bool changed = false;
  for (const auto& [name, bytes] : before) changed |= bytes != after_step.at(name);
  EXPECT_TRUE(changed) << "a finite step after the skip must train";
  exe.Run(m.main, Batch(3, false));
  exe.Run(m.main, Batch(4, false));  // the 3rd finite step in a row: the scale grows
  EXPECT_EQ(ScalarF(exe, m.opt->loss_scaling_var()), 1024.0f);
  EXPECT_EQ(ScalarI(exe, m.opt->good_steps_var()), 0);
  EXPECT_EQ(ScalarF(exe, m.opt->skipped_steps_var()), 1.0f);  // finite steps add nothing
}

TEST(AmpTraining, AnInjectedOverflowSkipsExactlyThatStep) {
  CheckOverflowSkipsOneStep(optimizer::SGD(0.1f));
  CheckOverflowSkipsOneStep(optimizer::Momentum(0.1f, 0.9f));
  CheckOverflowSkipsOneStep(optimizer::Adam(0.01f));
}

// Loss scaling by a power of two and unscaling give the float32 gradients exactly: parameters
// after training equal those of the plain optimizer bit for bit (no op runs low on this CPU's
// float16, so only the scaling differs).
TEST(AmpTraining, PowerOfTwoScalingKeepsFloat32Bits) {
  if (OpRegistry::HasKernel("mul", Place::Kind::kCPU, DType::kFloat16))
    GTEST_SKIP() << "this build runs mul in float16 on the CPU";
  amp::AmpConfig c;
  c.dtype = DType::kFloat16;
  AmpMlp m;
  Build(m, optimizer::SGD(0.1f), c);
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    main.set_random_seed(3);
    startup.set_random_seed(3);
    Var x = layers::data("x", {-1, 4});
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    Var h = layers::fc(x, 8, "relu");
    optimizer::SGD(0.1f).minimize(
        layers::mean(layers::softmax_with_cross_entropy(layers::fc(h, 3), y)));
  }
  Executor a, b;
  a.Run(m.startup);
  b.Run(startup);
  for (int s = 0; s < 4; ++s) {
    a.Run(m.main, Batch(s, false));
    b.Run(main, Batch(s, false));
  }
  for (const VarDesc* v : main.global_block().AllVars()) {
    if (!v->is_parameter()) continue;
    const Tensor& ta = a.scope().FindVar(v->name())->tensor();
    const Tensor& tb = b.scope().FindVar(v->name())->tensor();
    EXPECT_EQ(std::memcmp(ta.raw_data(), tb.raw_data(), ta.numel() * 4), 0) << v->name();
  }
}

}  // namespace
}  // namespace keel
