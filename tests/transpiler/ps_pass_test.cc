// ParameterServerPass as program text (golden files): the trainer's and every server's programs for
// an MLP whose first weight is cut into blocks, with Adam on 2 servers and SGD on 1 (sync), SGD on
// 2 servers (async); Paddle's slice_variable rule; the refusals.
#include <gtest/gtest.h>

#include <string>

#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "tests/util/golden.h"
#include "transpiler/ps_pass.h"

namespace keel {
namespace {

// x[-1, 64] -> fc(256, tanh) -> fc(10) -> softmax_with_cross_entropy(y) -> mean: fc_0.w_0 holds
// 16384 elements, two of Paddle's minimum blocks (8192).
void BuildMlp(Program& main, Program& startup, const std::string& opt_type, float clip = 0) {
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 64});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 256, "tanh");
  Var cost = layers::mean(layers::softmax_with_cross_entropy(layers::fc(h, 10), y));
  std::unique_ptr<optimizer::Optimizer> opt;
  if (opt_type == "adam") {
    opt = optimizer::Adam(0.01f).Clone();
  } else {
    opt = optimizer::SGD(0.1f).Clone();
  }
  if (clip > 0) opt->set_grad_clip({clip});
  opt->minimize(cost, &startup);
}

void Transpile(Program& main, Program& startup, int nservers, int ntrainers, int index,
               transpiler::PsMode mode = transpiler::PsMode::kSync) {
  transpiler::PsOptions o;
  o.mode = mode;
  o.nservers = nservers;
  o.ntrainers = ntrainers;
  o.server_index = index;
  transpiler::ParameterServerPass(o).Apply(main, startup);
}

TEST(ParameterServerPass, SliceRowsFollowsPaddlesSliceVariable) {
  using transpiler::SliceRows;
  // Fewer elements than two minimum blocks: one block whatever the servers.
  EXPECT_EQ(SliceRows({64, 10}, 2), (std::vector<int64_t>{64}));
  EXPECT_EQ(SliceRows({256}, 3), (std::vector<int64_t>{256}));
  // 16384 elements over 2 servers: two blocks of 8192 (128 rows of 64).
  EXPECT_EQ(SliceRows({256, 64}, 2), (std::vector<int64_t>{128, 128}));
  // 784 x 128 over 3 servers: ceil(100352 / 3) = 33451 elements, rounded up to whole rows (262),
  // the last block holding the rest (260 rows).
  EXPECT_EQ(SliceRows({784, 128}, 3), (std::vector<int64_t>{262, 262, 260}));
  // At most numel / 8192 blocks: 20000 elements on 8 servers make 2 blocks.
  EXPECT_EQ(SliceRows({1000, 20}, 8), (std::vector<int64_t>{500, 500}));
  // 1-D: elements are rows.
  EXPECT_EQ(SliceRows({20000}, 2), (std::vector<int64_t>{10000, 10000}));
}

TEST(ParameterServerPass, PlanDealsBlocksRoundRobin) {
  Program main, startup;
  BuildMlp(main, startup, "adam");
  const transpiler::PsPlan plan = transpiler::PlanParameterServer(main, 2);
  ASSERT_EQ(plan.params.size(), 4u);
  ASSERT_EQ(plan.blocks.size(), 5u);
  // fc_0.w_0 in two blocks, then fc_0.b_0, fc_1.w_0, fc_1.b_0 whole; servers 0, 1, 0, 1, 0.
  EXPECT_EQ(plan.blocks[0].name, "fc_0.w_0.block0");
  EXPECT_EQ(plan.blocks[1].name, "fc_0.w_0.block1");
  EXPECT_EQ(plan.blocks[1].grad_name, "fc_0.w_0@GRAD.block1");
  EXPECT_EQ(plan.blocks[1].row0, 32);
  EXPECT_EQ(plan.blocks[2].name, "fc_0.b_0");
  for (size_t k = 0; k < plan.blocks.size(); ++k)
    EXPECT_EQ(plan.blocks[k].server, static_cast<int>(k % 2));
  // Adam's state: two moments, two beta powers per parameter.
  EXPECT_EQ(plan.params[0].state.size(), 4u);
  EXPECT_EQ(plan.lr_vars, (std::vector<std::string>{"learning_rate_0"}));
}

TEST(ParameterServerPass, TwoServersAdamMatchGolden) {
  for (int index : {-1, 0, 1}) {
    Program main, startup;
    BuildMlp(main, startup, "adam");
    Transpile(main, startup, 2, 2, index);
    const std::string who = index < 0 ? "trainer" : "server" + std::to_string(index);
    testing::ExpectGolden(main.ToText(), "ps_2servers_adam_" + who + "_main.txt");
    testing::ExpectGolden(startup.ToText(), "ps_2servers_adam_" + who + "_startup.txt");
  }
}

TEST(ParameterServerPass, OneServerSgdMatchesGolden) {
  for (int index : {-1, 0}) {
    Program main, startup;
    BuildMlp(main, startup, "sgd");
    Transpile(main, startup, 1, 2, index);
    const std::string who = index < 0 ? "trainer" : "server0";
    testing::ExpectGolden(main.ToText(), "ps_1server_sgd_" + who + "_main.txt");
    testing::ExpectGolden(startup.ToText(), "ps_1server_sgd_" + who + "_startup.txt");
  }
}

// Async: the trainer's programs are sync's but for mode=1 on send and recv; each server's optimize
// blocks apply one trainer's gradient as it is (no sum over trainers, no 1/2 scale),
// listen_and_serv having one Grads per block and mode=1.
TEST(ParameterServerPass, TwoServersSgdAsyncMatchGolden) {
  for (int index : {-1, 0, 1}) {
    Program main, startup;
    BuildMlp(main, startup, "sgd");
    Transpile(main, startup, 2, 2, index, transpiler::PsMode::kAsync);
    const std::string who = index < 0 ? "trainer" : "server" + std::to_string(index);
    testing::ExpectGolden(main.ToText(), "ps_async_2servers_sgd_" + who + "_main.txt");
    testing::ExpectGolden(startup.ToText(), "ps_async_2servers_sgd_" + who + "_startup.txt");
  }
}

// GEO every 4 steps with Adam: the trainer keeps forward, backward, Adam and its state, adds a
// <param>@GEO_OLD snapshot per parameter and one geo_communicate at the end; its startup receives
// the parameters and copies them into the snapshots. A server holds its blocks only (no Adam
// state, no learning rate) and adds a trainer's <block>@GEO_DELTA as it comes (mode=2).
TEST(ParameterServerPass, TwoServersAdamGeoMatchGolden) {
  for (int index : {-1, 0, 1}) {
    Program main, startup;
    BuildMlp(main, startup, "adam");
    transpiler::PsOptions o;
    o.mode = transpiler::PsMode::kGeo;
    o.geo_k = 4;
    o.nservers = 2;
    o.ntrainers = 2;
    o.server_index = index;
    transpiler::ParameterServerPass(o).Apply(main, startup);
    const std::string who = index < 0 ? "trainer" : "server" + std::to_string(index);
    testing::ExpectGolden(main.ToText(), "ps_geo_2servers_adam_" + who + "_main.txt");
    testing::ExpectGolden(startup.ToText(), "ps_geo_2servers_adam_" + who + "_startup.txt");
  }
  // GEO without k: refused naming it.
  Program main, startup;
  BuildMlp(main, startup, "sgd");
  transpiler::PsOptions o;
  o.mode = transpiler::PsMode::kGeo;
  try {
    transpiler::ParameterServerPass(o).Apply(main, startup);
    ADD_FAILURE() << "GEO with geo_k=0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GEO needs geo_k >= 1"), std::string::npos) << e.what();
  }
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParameterServerPass, RefusesWhatIsNotBuilt) {
  // Clipping by global norm spans every parameter: not built.
  Program main, startup;
  BuildMlp(main, startup, "sgd", /*clip=*/1.0f);
  const std::string e = ErrorOf([&] { Transpile(main, startup, 2, 2, -1); });
  EXPECT_NE(e.find("clip_by_global_norm"), std::string::npos) << e;
  // More servers than blocks: a server would hold nothing.
  Program m2, s2;
  BuildMlp(m2, s2, "sgd");
  const std::string e2 = ErrorOf([&] { Transpile(m2, s2, 6, 2, 5); });
  EXPECT_NE(e2.find("server 5 of 6 holds no parameter block"), std::string::npos) << e2;
  // Before minimize: nothing to update.
  Program m3, s3;
  const std::string e3 = ErrorOf([&] { Transpile(m3, s3, 1, 1, -1); });
  EXPECT_NE(e3.find("updates no parameter"), std::string::npos) << e3;
}

}  // namespace
}  // namespace keel
