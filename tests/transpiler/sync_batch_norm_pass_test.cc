// SyncBatchNormPass: the training-mode batch norms of a small conv net (and their grads) become
// sync_batch_norm on ring 0 while an is_test one stays (golden text); ResNet-20's every batch norm
// is rewritten; a second application changes nothing; the DSL's sync flag makes the same op;
// DistributedStrategy::sync_batch_norm reaches the program through fleet's Transpile on one worker
// and on several, and is refused beside LocalSGD and on GPUs naming the fields.
#include "transpiler/sync_batch_norm_pass.h"

#include <gtest/gtest.h>

#include "fleet/distributed_strategy.h"
#include "fleet/transpile.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "models/model_zoo.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
#include "tests/util/transpiler_fixtures.h"

namespace keel {
namespace {

// x[-1, 2, 4, 4] -> conv2d(3, 3x3) -> batch_norm(relu) -> batch_norm(is_test) -> fc(3) ->
// softmax cross-entropy -> mean, minimized by SGD(0.1). `sync`: the first batch norm through the
// DSL's sync flag.
void BuildConvBn(Program& main, Program& startup, bool sync = false) {
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 2, 4, 4});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::conv2d(x, 3, 3, 1, 1, 1, 1, "", {}, {}, false);
  h = layers::batch_norm(h, "relu", false, 0.9f, 1e-5f, {}, {}, false, sync);
  h = layers::batch_norm(h, "", /*is_test=*/true);
  Var cost = layers::mean(layers::softmax_with_cross_entropy(layers::fc(h, 3), y));
  optimizer::SGD(0.1f).minimize(cost, &startup);
}

int Count(const Program& p, const std::string& type) {
  int n = 0;
  for (int b = 0; b < p.num_blocks(); ++b)
    for (auto& op : p.block(b).ops()) n += op->type() == type;
  return n;
}

TEST(SyncBatchNormPass, RewritesTrainingBatchNormsOfAConvNetMatchesGolden) {
  Program main, startup;
  BuildConvBn(main, startup);
  const std::string startup_before = startup.ToText();
  transpiler::SyncBatchNormPass().Apply(main, startup);
  testing::ExpectGolden(main.ToText(), "sync_batch_norm_convbn_main.txt");
  EXPECT_EQ(Count(main, "sync_batch_norm"), 1);
  EXPECT_EQ(Count(main, "sync_batch_norm_grad"), 1);
  EXPECT_EQ(Count(main, "batch_norm"), 1);  // the is_test one and its grad stay
  EXPECT_EQ(Count(main, "batch_norm_grad"), 1);
  EXPECT_EQ(startup.ToText(), startup_before);
  const std::string once = main.ToText();
  transpiler::SyncBatchNormPass().Apply(main, startup);
  EXPECT_EQ(main.ToText(), once);
}

TEST(SyncBatchNormPass, RingIdComesFromTheOptions) {
  Program main, startup;
  BuildConvBn(main, startup);
  transpiler::SyncBatchNormPass(transpiler::SyncBatchNormOptions{3}).Apply(main, startup);
  for (auto& op : main.global_block().ops()) {
    if (op->type().rfind("sync_batch_norm", 0) == 0) {
      EXPECT_EQ(op->Attr<int>("ring_id"), 3);
    }
  }
}

TEST(SyncBatchNormPass, DslSyncFlagMakesTheSameProgram) {
  Program a, sa, b, sb;
  BuildConvBn(a, sa);
  transpiler::SyncBatchNormPass().Apply(a, sa);
  BuildConvBn(b, sb, /*sync=*/true);
  EXPECT_EQ(b.ToText(), a.ToText());
}

TEST(SyncBatchNormPass, RewritesEveryBatchNormOfResnet20) {
  models::ModelConfig cfg;
  cfg.name = "resnet";
  cfg.seed = 1;
  cfg.programs_only = true;
  models::TrainableModel m = models::BuildModel(cfg);
  const int bn = Count(*m.main, "batch_norm"), grads = Count(*m.main, "batch_norm_grad");
  ASSERT_GT(bn, 0);
  EXPECT_EQ(grads, bn);
  transpiler::SyncBatchNormPass().Apply(*m.main, *m.startup);
  EXPECT_EQ(Count(*m.main, "sync_batch_norm"), bn);
  EXPECT_EQ(Count(*m.main, "sync_batch_norm_grad"), grads);
  EXPECT_EQ(Count(*m.main, "batch_norm") + Count(*m.main, "batch_norm_grad"), 0);
  std::printf("ResNet-20: %d batch norms and %d grads rewritten\n", bn, grads);
}

// fleet's Transpile (what minimize and keel inspect --strategy run): the switch rewrites on one
// worker (no ring) and on four, where ring 0 (the pass's ring) is made by the data-parallel pass.
TEST(SyncBatchNormPass, StrategySwitchRewritesThroughFleetTranspile) {
  for (int world : {1, 4}) {
    SCOPED_TRACE(world);
    Program main, startup;
    BuildConvBn(main, startup);
    fleet::DistributedStrategy s;
    s.sync_batch_norm = true;
    fleet::Role role = testing::TwoOfFour();
    role.world_size = role.local_world_size = world;
    role.rank = role.local_rank = 0;
    s.Validate(role);
    fleet::Transpile(main, startup, s, role);
    EXPECT_EQ(Count(main, "sync_batch_norm"), 1);
    EXPECT_EQ(Count(main, "sync_batch_norm_grad"), 1);
    bool ring0 = false;
    for (auto& op : startup.global_block().ops())
      ring0 |= op->type() == "c_comm_init" && op->Attr<int>("ring_id") == 0;
    EXPECT_EQ(ring0, world > 1);
  }
  Program main, startup;
  BuildConvBn(main, startup);
  fleet::Transpile(main, startup, fleet::DistributedStrategy(), testing::TwoOfFour());
  EXPECT_EQ(Count(main, "sync_batch_norm"), 0) << "off by default";
}

TEST(SyncBatchNormPass, StrategyRefusesLocalSgdNamingTheFieldsAndTakesGpus) {
  fleet::DistributedStrategy s;
  s.sync_batch_norm = true;
  s.use_local_sgd = true;
  testing::ExpectErrorContainsAll(testing::ErrorOf([&] { s.Validate(testing::TwoOfFour()); }),
                                  {"sync_batch_norm=true", "use_local_sgd=true"});
  s.use_local_sgd = false;
  fleet::Role gpu = testing::TwoOfFour();
  gpu.selected_gpus = {1};
  EXPECT_EQ(testing::ErrorOf([&] { s.Validate(gpu); }), "");  // it has CUDA kernels
  EXPECT_EQ(testing::ErrorOf([&] { s.Validate(testing::TwoOfFour()); }), "");
  EXPECT_NE(s.ToString().find("sync_batch_norm=true"), std::string::npos);
}

}  // namespace
}  // namespace keel
