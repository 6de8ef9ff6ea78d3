// DistributedStrategy::amp and ::recompute through fleet's minimize: the forward rewrite and loss
// scaling reach the program fleet returns (one worker; the transpiled all-reduce sits before the
// overflow check, tested in the pass goldens), and amp_configs is refused while amp is off.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "fleet/fleet.h"
#include "fleet/transpile.h"
#include "framework/dsl/amp.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/program_guard.h"
#include "models/mlp/mlp_model.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

std::map<std::string, int> CountOps(const Program& p) {
  std::map<std::string, int> n;
  for (const auto& op : p.global_block().ops()) ++n[op->type()];
  return n;
}

TEST(FleetAmp, MinimizeRewritesTheForwardAndScalesTheLoss) {
  fleet::reset();
  fleet::init(fleet::UserDefinedRoleMaker(0, 1));
  Program main, startup;
  ProgramGuard g(main, startup);
  Var loss = models::mlp(layers::data("x", {-1, 32}), layers::data("y", {-1, 1}, DType::kInt64), 4);
  fleet::DistributedStrategy s;
  s.amp = true;
  s.amp_configs.dtype = DType::kFloat16;
  s.amp_configs.check_kernels = false;
  auto opt = fleet::distributed_optimizer(optimizer::Momentum(0.1f, 0.9f), s);
  opt.minimize(loss, &startup);
  auto n = CountOps(main);
  // x, 3 weights and 3 biases to float16, the logits back to float32; the overflow flag to
  // float32 for the skipped-steps counter.
  EXPECT_EQ(n["cast"], 9) << main.ToText();
  EXPECT_EQ(n["check_finite_and_unscale"], 1);
  EXPECT_EQ(n["update_loss_scaling"], 1);
  ASSERT_NE(opt.amp_optimizer(), nullptr);
  EXPECT_EQ(opt.amp_optimizer()->loss_scaling_var(), "loss_scaling_0");
  EXPECT_EQ(opt.amp_optimizer()->skipped_steps_var(), "num_skipped_steps_0");
  // What the Trainer logs, found from the program alone.
  const amp::LossScalingVars found = amp::FindLossScalingVars(main);
  EXPECT_EQ(found.loss_scaling, "loss_scaling_0");
  EXPECT_EQ(found.found_inf, "find_infinite_0");
  EXPECT_EQ(found.skipped_steps, "num_skipped_steps_0");
  EXPECT_TRUE(startup.global_block().FindVar("num_skipped_steps_0") != nullptr);
  for (const auto& op : main.global_block().ops()) {
    if (op->type() == "momentum") {
      EXPECT_EQ(op->Input("SkipUpdate")[0], "find_infinite_0");
    }
  }
  EXPECT_NE(opt.learning_rate_var(), "");
  fleet::reset();
}

// Transpiled for two ranks, the overflow check reads the all-reduced gradients: it comes after
// the ring's c_sync_comm_stream, and every rank sees the same flag (no flag all-reduce needed).
TEST(FleetAmp, TheOverflowCheckReadsAllReducedGradients) {
  Program main, startup;
  {
    ProgramGuard g(main, startup);
    Var loss =
        models::mlp(layers::data("x", {-1, 32}), layers::data("y", {-1, 1}, DType::kInt64), 4);
    amp::AmpConfig c;
    c.dtype = DType::kFloat16;
    c.check_kernels = false;
    amp::decorate(optimizer::SGD(0.1f), c).minimize(loss, &startup);
  }
  fleet::DistributedStrategy s;
  fleet::Role role;
  role.world_size = 2;
  role.rank = 1;
  fleet::TranspileCollective(main, startup, s, role);
  int sync = -1, check = -1, last_allreduce = -1;
  const Block& b = main.global_block();
  for (size_t i = 0; i < b.num_ops(); ++i) {
    const std::string& t = b.op(i)->type();
    if (t == "c_sync_comm_stream" && sync < 0) sync = static_cast<int>(i);
    if (t == "check_finite_and_unscale") check = static_cast<int>(i);
    if (t == "c_allreduce_sum") last_allreduce = static_cast<int>(i);
  }
  ASSERT_GE(sync, 0) << main.ToText();
  EXPECT_LT(last_allreduce, sync);
  EXPECT_LT(sync, check) << main.ToText();
}

TEST(FleetRecompute, MinimizeReplaysTheMarkedSegments) {
  fleet::reset();
  fleet::init(fleet::UserDefinedRoleMaker(0, 1));
  Program main, startup;
  ProgramGuard g(main, startup);
  Var x = layers::data("x", {-1, 8});
  Var h = layers::fc(layers::fc(x, 16, "relu"), 16, "tanh");
  recompute_checkpoint(h);
  Var loss = layers::mean(layers::fc(h, 2));
  fleet::DistributedStrategy s;
  s.recompute = true;
  fleet::distributed_optimizer(optimizer::SGD(0.1f), s).minimize(loss, &startup);
  EXPECT_NE(main.ToText().find("@RECOMPUTE"), std::string::npos) << main.ToText();
  fleet::reset();
}

TEST(FleetAmp, ConfigsWhileAmpIsOffAreRefusedNamingTheField) {
  fleet::DistributedStrategy s;
  s.amp_configs.dtype = DType::kFloat16;
  ExpectErrorContainsAll(ErrorOf([&] { s.Validate(fleet::Role()); }),
                         {"amp_configs.dtype=float16", "amp=false"});
  fleet::DistributedStrategy l;
  l.amp = true;
  l.amp_configs.dtype = DType::kFloat16;
  l.use_local_sgd = true;
  ExpectErrorContainsAll(ErrorOf([&] { l.Validate(fleet::Role()); }),
                         {"amp=true", "use_local_sgd=true"});
  l.amp_configs.dtype = DType::kBFloat16;  // no loss scaling: LocalSGD is fine
  EXPECT_EQ(ErrorOf([&] { l.Validate(fleet::Role()); }), "");
}

}  // namespace
}  // namespace keel::testing
