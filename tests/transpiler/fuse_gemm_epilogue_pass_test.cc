// FuseGemmEpiloguePass: a small MLP's layers become fused_gemm_epilogue and its grad (golden
// text); training the zoo's MLP and transformer (Adam, clipping, a schedule) with and without the
// pass gives the same losses and parameters bit for bit; a product something else reads, a
// non-bias add and a backward that does not match are left alone; a second application changes
// nothing; DistributedStrategy::fuse_gemm_epilogue reaches the program through fleet's Transpile.
#include "transpiler/fuse_gemm_epilogue_pass.h"

#include <gtest/gtest.h>

#include "executor/executor.h"
#include "fleet/distributed_strategy.h"
#include "fleet/transpile.h"
#include "framework/dsl/amp.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/lr_schedule.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "models/model_zoo.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
#include "tests/util/transpiler_fixtures.h"

namespace keel {
namespace {

int Count(const Program& p, const std::string& type) {
  int n = 0;
  for (int b = 0; b < p.num_blocks(); ++b)
    for (auto& op : p.block(b).ops()) n += op->type() == type;
  return n;
}

void Fuse(Program& main, Program& startup) {
  transpiler::FuseGemmEpiloguePass().Apply(main, startup);
}

TEST(FuseGemmEpiloguePass, FusesEachLayerOfAnMlpMatchesGolden) {
  Program main, startup;
  testing::BuildTrainedMlp(main, startup);
  const std::string startup_before = startup.ToText();
  ASSERT_EQ(Count(main, "mul"), 2);
  Fuse(main, startup);
  testing::ExpectGolden(main.ToText(), "fuse_gemm_epilogue_mlp_main.txt");
  EXPECT_EQ(Count(main, "fused_gemm_epilogue"), 2);
  EXPECT_EQ(Count(main, "fused_gemm_epilogue_grad"), 2);
  for (const char* gone : {"mul", "mul_grad", "elementwise_add", "elementwise_add_grad"})
    EXPECT_EQ(Count(main, gone), 0) << gone;
  EXPECT_EQ(main.global_block().FindVar("fc_0.tmp_0"), nullptr);  // the unfused product
  EXPECT_EQ(startup.ToText(), startup_before);
  const std::string once = main.ToText();
  Fuse(main, startup);
  EXPECT_EQ(main.ToText(), once);
}

// x[-1, 4] -> mul -> t; t + b; and `extra` reading t besides the add (what a row-parallel layer's
// all-reduce does) or a second add of t: nothing fuses.
TEST(FuseGemmEpiloguePass, AProductReadByAnotherOpIsLeftAlone) {
  for (const char* extra : {"scale", "elementwise_add"}) {
    SCOPED_TRACE(extra);
    Program main, startup;
    {
      ProgramGuard guard(main, startup);
      Var x = layers::data("x", {-1, 4});
      Var w = layers::create_parameter({4, 3}, DType::kFloat32, "l", "w", {},
                                       initializer::Constant(0.5f));
      Var b =
          layers::create_parameter({3}, DType::kFloat32, "l", "b", {}, initializer::Constant(0.5f));
      Var t = layers::matmul(x, w);  // keel's matmul: not fused either
      Var m = layers::mul(x, w);
      Var s = layers::elementwise_add(m, b, 1);
      Var other =
          std::string(extra) == "scale" ? layers::scale(m, 2.0f) : layers::elementwise_add(m, b, 1);
      layers::mean(layers::elementwise_add(layers::elementwise_add(s, other), t));
    }
    const std::string before = main.ToText();
    Fuse(main, startup);
    EXPECT_EQ(main.ToText(), before);
  }
}

// A bias of another shape than the weight's columns, or added at another axis, is no bias add.
TEST(FuseGemmEpiloguePass, AnAddThatIsNotTheBiasAddIsLeftAlone) {
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    Var x = layers::data("x", {-1, 4});
    Var w = layers::create_parameter({4, 3}, DType::kFloat32, "l", "w", {},
                                     initializer::Constant(0.5f));
    Var y = layers::data("y", {-1, 3});
    layers::mean(layers::elementwise_add(layers::mul(x, w), y));  // [N, 3] + [N, 3]
  }
  const std::string before = main.ToText();
  Fuse(main, startup);
  EXPECT_EQ(main.ToText(), before);
}

// The zoo's mlp or transformer, seeded, Adam with clipping and a warm-up schedule; `amp`: under
// bfloat16 O1 (AMP's cast of each bias lies between the mul and its add).
models::TrainableModel Model(const std::string& name, bool fuse, bool amp = false) {
  models::ModelConfig cfg;
  cfg.name = name;
  cfg.seed = 5;
  cfg.hidden = 24;
  cfg.batch_size = 8;
  cfg.transformer.vocab = 20;
  cfg.transformer.d_model = 16;
  cfg.transformer.d_ff = 32;
  cfg.make_optimizer = [](const std::string&, float) {
    auto o = std::make_unique<optimizer::Adam>(
        lr_schedule::LinearWarmup(lr_schedule::Cosine(0.01f, 100), 2));
    o->set_grad_clip(optimizer::GradientClipByGlobalNorm{0.5f});
    return std::unique_ptr<optimizer::Optimizer>(std::move(o));
  };
  if (amp)
    cfg.minimize = [](Var loss, Program* startup, const optimizer::Optimizer& opt) {
      amp::decorate(opt).minimize(loss, startup);
    };
  models::TrainableModel m = models::BuildModel(cfg);
  if (fuse) Fuse(*m.main, *m.startup);
  return m;
}

TEST(FuseGemmEpiloguePass, TrainingGivesTheSameParametersBitForBit) {
  for (const char* name : {"mlp", "transformer", "mlp_amp_bf16"}) {
    SCOPED_TRACE(name);
    const bool amp = std::string(name) == "mlp_amp_bf16";
    const std::string model = amp ? "mlp" : name;
    models::TrainableModel plain = Model(model, false, amp), fused = Model(model, true, amp);
    EXPECT_EQ(Count(*plain.main, "fused_gemm_epilogue"), 0);
    EXPECT_GE(Count(*fused.main, "fused_gemm_epilogue_grad"), 3);
    EXPECT_EQ(Count(*fused.main, "elementwise_add_grad") + Count(*fused.main, "mul_grad") +
                  2 * Count(*fused.main, "fused_gemm_epilogue_grad"),
              Count(*plain.main, "elementwise_add_grad") + Count(*plain.main, "mul_grad"));
    Executor a, b;
    a.Run(*plain.startup);
    b.Run(*fused.startup);
    for (int step = 0; step < 5; ++step) {
      FeedMap fa, fb;
      plain.next_batch(8, &fa);
      fused.next_batch(8, &fb);
      const double la = a.Run(*plain.main, fa, {plain.loss})[0].item<double>();
      const double lb = b.Run(*fused.main, fb, {fused.loss})[0].item<double>();
      EXPECT_EQ(la, lb) << "step " << step;
    }
    int compared = 0;
    for (VarDesc* v : plain.main->global_block().AllVars()) {
      if (!v->persistable()) continue;
      const Tensor& ta = a.scope().FindVar(v->name())->tensor();
      const Tensor& tb = b.scope().FindVar(v->name())->tensor();
      EXPECT_TRUE(testing::SameBits({ta}, {tb})) << v->name();
      ++compared;
    }
    EXPECT_GT(compared, 4);
  }
}

// With fuse_gemm_epilogue, fleet's Transpile fuses on one worker (and keeps the layers apart
// without it, Paddle's default).
TEST(FuseGemmEpiloguePass, StrategySwitchReachesTheProgramThroughFleet) {
  for (bool on : {false, true}) {
    Program main, startup;
    testing::BuildTrainedMlp(main, startup);
    fleet::DistributedStrategy s;
    EXPECT_FALSE(s.fuse_gemm_epilogue);
    s.fuse_gemm_epilogue = on;
    fleet::Role role;
    fleet::Transpile(main, startup, s, role);
    EXPECT_EQ(Count(main, "fused_gemm_epilogue"), on ? 2 : 0);
    EXPECT_EQ(Count(main, "mul"), on ? 0 : 2);
  }
}

}  // namespace
}  // namespace keel
