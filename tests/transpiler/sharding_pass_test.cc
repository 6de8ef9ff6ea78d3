// ShardingPass (ZeRO-1) as program text (golden files) for the MLP with Adam on 2 and 3 ranks, the
// owner plan (contiguous, balanced by elements), what each rank keeps, and the refusals: the
// strategy's fields and combinations, and programs that read others' gradients after backward.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "fleet/distributed_strategy.h"
#include "fleet/transpile.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "tests/util/golden.h"
#include "transpiler/sharding_pass.h"

namespace keel {
namespace {

// x[-1, 4] -> fc(3, tanh) -> fc(2, softmax) -> cross_entropy(y) -> mean, minimized by Adam, or
// with clipping by global norm.
void BuildAdamMlp(Program& main, Program& startup, float clip = 0) {
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 4});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 3, "tanh");
  Var cost = layers::mean(layers::cross_entropy(layers::fc(h, 2, "softmax"), y));
  optimizer::Adam opt(0.01f);
  if (clip > 0) opt.set_grad_clip({clip});
  opt.minimize(cost, &startup);
}

transpiler::ShardingOptions Ranks(int n, int rank) {
  transpiler::ShardingOptions o;
  o.rings.nranks = n;
  o.rings.rank = rank;
  return o;
}

std::map<std::string, int> Count(const Block& b) {
  std::map<std::string, int> n;
  for (const auto& op : b.ops()) ++n[op->type()];
  return n;
}

std::set<std::string> Updated(const Block& b) {
  std::set<std::string> p;
  for (const auto& op : b.ops())
    if (op->type() == "adam") p.insert(op->Input("Param")[0]);
  return p;
}

TEST(ShardingPlan, OwnersAreContiguousAndBalancedByElements) {
  Program main, startup;
  BuildAdamMlp(main, startup);
  // fc_0.w_0 12, fc_0.b_0 3, fc_1.w_0 6, fc_1.b_0 2: 23 elements.
  transpiler::ShardingPlan two = transpiler::PlanSharding(main, 2);
  ASSERT_EQ(two.params.size(), 4u);
  EXPECT_EQ(two.params[0].name, "fc_0.w_0");
  EXPECT_EQ(two.params[0].owner, 0);
  EXPECT_EQ(two.params[1].owner, 1);  // its middle (13.5) lies past half of 23
  EXPECT_EQ(two.params[3].owner, 1);
  EXPECT_EQ(two.load, (std::vector<int64_t>{12, 11}));
  EXPECT_EQ(two.slice, 12);
  EXPECT_EQ(two.params[0].state,
            (std::vector<std::string>{"fc_0.w_0_moment1_0", "fc_0.w_0_moment2_0",
                                      "fc_0.w_0_beta1_pow_acc_0", "fc_0.w_0_beta2_pow_acc_0"}));
  transpiler::ShardingPlan three = transpiler::PlanSharding(main, 3);
  int last = 0;
  for (const auto& p : three.params) {
    EXPECT_GE(p.owner, last) << p.name;  // contiguous runs in declaration order
    last = p.owner;
  }
  EXPECT_EQ(three.load, (std::vector<int64_t>{12, 3, 8}));
  EXPECT_EQ(three.StateOwners().at("fc_1.b_0_moment2_0"), 2);
}

TEST(ShardingPass, MatchesGoldenOnTwoRanks) {
  for (int rank : {0, 1}) {
    Program main, startup;
    BuildAdamMlp(main, startup);
    transpiler::ShardingPass(Ranks(2, rank)).Apply(main, startup);
    const std::string r = std::to_string(rank);
    testing::ExpectGolden(main.ToText(), "sharding_2ranks_rank" + r + "_main.txt");
    testing::ExpectGolden(startup.ToText(), "sharding_2ranks_rank" + r + "_startup.txt");
    auto ops = Count(main.global_block());
    EXPECT_EQ(ops["c_reducescatter"], 1);
    EXPECT_EQ(ops["c_allreduce_sum"], 0);
    EXPECT_EQ(ops["c_broadcast"], 4);  // every parameter, from its owner
    EXPECT_EQ(ops["coalesce_tensor"], 1);
  }
  Program main0, startup0, main1, startup1;
  BuildAdamMlp(main0, startup0);
  BuildAdamMlp(main1, startup1);
  transpiler::ShardingPass(Ranks(2, 0)).Apply(main0, startup0);
  transpiler::ShardingPass(Ranks(2, 1)).Apply(main1, startup1);
  EXPECT_EQ(Updated(main0.global_block()), (std::set<std::string>{"fc_0.w_0"}));
  EXPECT_EQ(Updated(main1.global_block()),
            (std::set<std::string>{"fc_0.b_0", "fc_1.w_0", "fc_1.b_0"}));
  // Startup makes only the rank's own state; main still declares all of it (for checkpoints).
  EXPECT_NE(startup0.global_block().FindVar("fc_0.w_0_moment1_0"), nullptr);
  EXPECT_EQ(startup0.global_block().FindVar("fc_1.w_0_moment1_0"), nullptr);
  EXPECT_EQ(startup1.global_block().FindVar("fc_0.w_0_moment1_0"), nullptr);
  EXPECT_NE(main1.global_block().FindVar("fc_0.w_0_moment1_0"), nullptr);
  // Two biases, the rate and the 4 state vars of its one parameter.
  EXPECT_EQ(Count(startup0.global_block())["fill_constant"], 2 + 1 + 4);
}

TEST(ShardingPass, MatchesGoldenOnThreeRanks) {
  for (int rank : {0, 1, 2}) {
    Program main, startup;
    BuildAdamMlp(main, startup);
    transpiler::ShardingPass(Ranks(3, rank)).Apply(main, startup);
    const std::string r = std::to_string(rank);
    testing::ExpectGolden(main.ToText(), "sharding_3ranks_rank" + r + "_main.txt");
    testing::ExpectGolden(startup.ToText(), "sharding_3ranks_rank" + r + "_startup.txt");
    // Slices of 12: rank 1's 3 elements and rank 2's 8 are padded.
    EXPECT_EQ(main.global_block().MustFindVar("@SHARDING_GRAD@")->shape(),
              (std::vector<int64_t>{36}));
    EXPECT_EQ(main.global_block().FindVar("@SHARDING_PAD@0"), nullptr);
    EXPECT_EQ(main.global_block().MustFindVar("@SHARDING_PAD@1")->shape(),
              (std::vector<int64_t>{9}));
  }
}

// Global-norm clipping: each rank's norm, all-gathered, and a clip of the owned gradients by the
// norm of all of them.
TEST(ShardingPass, ClipsOwnedGradientsByTheNormOverEveryRank) {
  for (int rank : {0, 1}) {
    Program main, startup;
    BuildAdamMlp(main, startup, /*clip=*/1.0f);
    transpiler::ShardingPass(Ranks(2, rank)).Apply(main, startup);
    testing::ExpectGolden(main.ToText(), "sharding_clip_rank" + std::to_string(rank) + "_main.txt");
    auto ops = Count(main.global_block());
    EXPECT_EQ(ops["c_allgather"], 1);
    EXPECT_EQ(ops["clip_by_global_norm"], 2);  // the local norm, then the clip
  }
}

TEST(ShardingPass, RefusesAnOpThatReadsOthersGradientsAfterBackward) {
  Program main, startup;
  BuildAdamMlp(main, startup);
  OpDesc* peek = main.global_block().AppendOp("scale");
  peek->SetInput("X", {"fc_1.w_0@GRAD"});
  peek->SetOutput("Out", {"peek"});
  main.global_block().Var("peek");
  try {
    transpiler::ShardingPass(Ranks(2, 0)).Apply(main, startup);
    FAIL() << "an op reading another owner's gradient was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("sharding: op scale reads 'fc_1.w_0@GRAD' after backward"), std::string::npos)
        << m;
  }
}

TEST(ShardingStrategy, FieldsAreValidatedAndRefusedCombinationsNameBoth) {
  fleet::Role role;
  role.world_size = 2;
  role.local_world_size = 2;
  auto refused = [&](const fleet::DistributedStrategy& s, const std::string& want) {
    try {
      s.Validate(role);
      ADD_FAILURE() << "accepted: " << s.ToString();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  fleet::DistributedStrategy ok;
  ok.sharding = true;
  ok.Validate(role);
  ok.sharding_configs.sharding_degree = 2;
  ok.Validate(role);
  EXPECT_NE(ok.ToString().find("sharding=true, sharding_configs={stage=1, sharding_degree=2}"),
            std::string::npos);

  fleet::DistributedStrategy s;
  s.sharding_configs.stage = 2;
  refused(s, "sharding_configs.stage=2 is set but DistributedStrategy.sharding=false");
  s = {};
  s.sharding_configs.sharding_degree = 2;
  refused(s, "sharding_configs.sharding_degree=2 is set but DistributedStrategy.sharding=false");
  s = {};
  s.sharding = true;
  s.sharding_configs.stage = 3;
  refused(s, "sharding_configs.stage=3 is not built");
  s.sharding_configs.stage = 2;
  refused(s, "sharding_configs.stage=2 is not built");
  s = {};
  s.sharding = true;
  s.sharding_configs.sharding_degree = 3;
  refused(s, "sharding_configs.sharding_degree=3 must be 0 or the world size (2)");
  const std::string both = "sharding=true does not combine with DistributedStrategy.";
  s = {};
  s.sharding = true;
  s.use_local_sgd = true;
  refused(s, both + "use_local_sgd=true");
  s = {};
  s.sharding = true;
  s.gradient_merge = true;
  refused(s, both + "gradient_merge=true");
  s = {};
  s.sharding = true;
  s.use_hierarchical_allreduce = true;
  refused(s, both + "use_hierarchical_allreduce=true");
  s = {};
  s.sharding = true;
  s.fuse_all_reduce_ops = true;
  refused(s, both + "fuse_all_reduce_ops=true");
  s = {};
  s.sharding = true;
  s.nccl_comm_num = 2;
  refused(s, both + "nccl_comm_num=2");
  s = {};
  s.sharding = true;
  s.amp = true;
  s.amp_configs.dtype = DType::kFloat16;  // loss scaling: the overflow flag is all-reduced
  s.Validate(role);
}

// Through fleet's pipeline: with sharding, no all-reduce and no merged optimizer ops.
TEST(ShardingPass, FleetTranspileUsesItInsteadOfTheAllReduce) {
  Program main, startup;
  BuildAdamMlp(main, startup);
  fleet::DistributedStrategy s;
  s.sharding = true;
  fleet::Role role;
  role.world_size = 2;
  role.local_world_size = 2;
  role.rank = 1;
  fleet::Transpile(main, startup, s, role);
  auto ops = Count(main.global_block());
  EXPECT_EQ(ops["c_allreduce_sum"], 0);
  EXPECT_EQ(ops["c_reducescatter"], 1);
  EXPECT_EQ(ops["adam"], 3);
}

}  // namespace
}  // namespace keel
