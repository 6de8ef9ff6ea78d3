// Recompute (append_backward with checkpoints): the program (golden), gradients and parameters
// bit-identical to plain backward over several steps (an MLP with dropout, whose replay reuses the
// forward's mask; ResNet-20 and the transformer with the checkpoints their builders mark), a lower
// allocator peak, and errors naming a bad checkpoint or a random op that cannot be replayed.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/runtime/allocator.h"
#include "models/model_zoo.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;
using testing::ExpectErrorContainsAll;

struct Mlp {
  Program main, startup;
  Var h1;
};

// x -> fc(16, relu) -> dropout -> [h1] -> fc(16, tanh) -> dropout -> fc(3) -> loss, Adam.
void BuildMlp(Mlp& m, bool recompute) {
  ProgramGuard guard(m.main, m.startup);
  m.main.set_random_seed(5);
  m.startup.set_random_seed(5);
  Var x = layers::data("x", {-1, 8});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var a = layers::dropout(layers::fc(x, 16, "relu"), 0.25f);
  m.h1 = layers::fc(a, 16, "tanh");
  Var b = layers::dropout(m.h1, 0.25f);
  Var loss = layers::mean(layers::softmax_with_cross_entropy(layers::fc(b, 3), y));
  optimizer::Adam opt(0.01f);
  if (recompute) opt.set_recompute({m.h1.name()});
  opt.minimize(loss);
}

FeedMap MlpBatch(int step) {
  Tensor x(DType::kFloat32, DDim({6, 8})), y(DType::kInt64, DDim({6, 1}));
  for (int i = 0; i < 48; ++i)
    x.data<float>()[i] = 0.05f * static_cast<float>((i * 13 + step * 7) % 23) - 0.5f;
  for (int i = 0; i < 6; ++i) y.data<int64_t>()[i] = (i + step) % 3;
  return {{"x", x}, {"y", y}};
}

// Every persistable of `main` in `exe`'s scope, as bytes.
std::vector<std::vector<char>> Persistables(const Program& main, Executor& exe) {
  std::vector<std::vector<char>> out;
  for (const VarDesc* v : main.global_block().AllVars()) {
    if (!v->persistable()) continue;
    const Tensor& t = exe.scope().FindVar(v->name())->tensor();
    const char* p = static_cast<const char*>(t.raw_data());
    out.emplace_back(p, p + t.numel() * SizeOf(t.dtype()));
  }
  return out;
}

TEST(Recompute, MlpWithDropoutProgramMatchesGolden) {
  Mlp m;
  BuildMlp(m, true);
  testing::ExpectGolden(m.main.ToText(), "recompute_mlp_train.txt");
  int replays = 0;
  for (const auto& op : m.main.global_block().ops())
    if (op->type() == "dropout" && op->HasInput("ReplayMask")) ++replays;
  EXPECT_EQ(replays, 1) << "the first segment's dropout replays its mask";
}

TEST(Recompute, MlpWithDropoutTrainsBitIdenticallyToPlainBackward) {
  Mlp plain, rc;
  BuildMlp(plain, false);
  BuildMlp(rc, true);
  Executor a, b;
  a.Run(plain.startup);
  b.Run(rc.startup);
  for (int s = 0; s < 5; ++s) {
    auto la = a.Run(plain.main, MlpBatch(s), {"mean.tmp_0"});
    auto lb = b.Run(rc.main, MlpBatch(s), {"mean.tmp_0"});
    ASSERT_EQ(la[0].data<float>()[0], lb[0].data<float>()[0]) << "step " << s;
  }
  EXPECT_TRUE(Persistables(plain.main, a) == Persistables(rc.main, b))
      << "parameters and Adam's moments differ after 5 steps";
}

// A built-in model with and without recompute (its builder marks the checkpoints): the same
// losses and parameters bit for bit, and the allocator's peak during a step.
struct ModelRun {
  std::vector<float> losses;
  std::vector<std::vector<char>> params;
  size_t peak = 0;
};

ModelRun RunModel(const std::string& name, bool recompute, int steps) {
  models::ModelConfig c;
  c.name = name;
  c.seed = 7;
  c.batch_size = name == "resnet" ? 16 : 64;
  if (recompute)
    c.minimize = [](Var loss, Program* startup, const optimizer::Optimizer& opt) {
      auto o = opt.Clone();
      o->set_recompute();
      o->minimize(loss, startup);
    };
  models::TrainableModel m = models::BuildModel(c);
  Executor exe;
  exe.Run(*m.startup);
  ModelRun r;
  for (int s = 0; s < steps; ++s) {
    FeedMap feed;
    m.next_batch(c.batch_size, &feed);
    if (s == steps - 1) CpuAllocatorResetPeak();
    r.losses.push_back(exe.Run(*m.main, feed, {m.loss})[0].data<float>()[0]);
    if (s == steps - 1) r.peak = CpuAllocatorStats().peak_in_use_bytes;
  }
  r.params = Persistables(*m.main, exe);
  return r;
}

void CheckModel(const std::string& name, double min_saving) {
  SCOPED_TRACE(name);
  const ModelRun plain = RunModel(name, false, 3);
  const ModelRun rc = RunModel(name, true, 3);
  EXPECT_EQ(plain.losses, rc.losses);
  EXPECT_TRUE(plain.params == rc.params) << "parameters differ after 3 steps";
  ASSERT_GT(plain.peak, 0u);
  const double saving = 1.0 - static_cast<double>(rc.peak) / static_cast<double>(plain.peak);
  std::printf("recompute %s: allocator peak %.2f MB -> %.2f MB (%.0f%% lower)\n", name.c_str(),
              plain.peak / 1e6, rc.peak / 1e6, 100 * saving);
  EXPECT_GE(saving, min_saving);
}

TEST(Recompute, ResnetKeepsItsBitsWithALowerPeak) { CheckModel("resnet", 0.4); }
TEST(Recompute, TransformerKeepsItsBitsWithALowerPeak) { CheckModel("transformer", 0.4); }

TEST(Recompute, ErrorsNameTheCheckpointOrTheRandomOp) {
  {
    Program main, startup;
    ProgramGuard guard(main, startup);
    Var x = layers::data("x", {-1, 4});
    Var loss = layers::mean(layers::fc(x, 2));
    optimizer::SGD opt(0.1f);
    opt.set_recompute({"no_such_var"});
    ExpectErrorContainsAll(ErrorOf([&] { opt.minimize(loss); }), {"recompute", "no_such_var"});
  }
  {
    Program main, startup;
    ProgramGuard guard(main, startup);
    Var x = layers::data("x", {-1, 4});
    Var loss = layers::mean(layers::fc(x, 2));
    optimizer::SGD opt(0.1f);
    opt.set_recompute();
    ExpectErrorContainsAll(ErrorOf([&] { opt.minimize(loss); }), {"recompute", "no checkpoint"});
  }
}

}  // namespace
}  // namespace keel
