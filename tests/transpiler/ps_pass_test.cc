// ParameterServerPass as program text (golden files): the trainer's and every server's programs for
// an MLP whose first weight is cut into blocks, with Adam on 2 servers and SGD on 1 (sync), SGD on
// 2 servers (async); Paddle's slice_variable rule; the refusals.
#include <gtest/gtest.h>

#include <string>

#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/tensor_layers.h"
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

// ids [-1, 4, 1] -> embedding [2048, 8] (is_sparse; is_distributed when asked) -> fc(2) ->
// softmax_with_cross_entropy -> mean, with Adam (lazy_mode) or SGD: the table is 16384 elements,
// two blocks on two servers.
void BuildSparse(Program& main, Program& startup, const std::string& opt_type, bool distributed) {
  ProgramGuard guard(main, startup);
  Var ids = layers::data("ids", {-1, 4, 1}, DType::kInt64);
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var emb =
      layers::embedding(ids, {2048, 8}, -1, ParamAttr("table", initializer::Uniform(-0.5f, 0.5f)),
                        DType::kFloat32, /*is_sparse=*/true, distributed);
  Var logits = layers::fc(layers::reshape(emb, {-1, 32}), 2);
  Var cost = layers::mean(layers::softmax_with_cross_entropy(logits, y));
  if (opt_type == "adam") {
    optimizer::Adam(0.01f, 0.9f, 0.999f, 1e-8f, /*lazy_mode=*/true).minimize(cost, &startup);
  } else {
    optimizer::SGD(0.1f).minimize(cost, &startup);
  }
}

// An is_sparse table under sync PS with lazy Adam: the trainer's send of the table's gradient
// says is_sparse (rows + values per row block); each server merges the trainers' row-sparse
// parts of its block (merge_sparse_grad: row by row in trainer order, 1/2) into RowGrads-fed
// vars, and lazy Adam updates those rows of its block.
TEST(ParameterServerPass, SparseTableTwoServersLazyAdamMatchGolden) {
  for (int index : {-1, 0, 1}) {
    Program main, startup;
    BuildSparse(main, startup, "adam", false);
    Transpile(main, startup, 2, 2, index);
    const std::string who = index < 0 ? "trainer" : "server" + std::to_string(index);
    testing::ExpectGolden(main.ToText(), "ps_sparse_2servers_adam_" + who + "_main.txt");
    testing::ExpectGolden(startup.ToText(), "ps_sparse_2servers_adam_" + who + "_startup.txt");
  }
}

// An is_distributed table under sync PS with SGD: the trainer holds no table (its lookups are
// distributed_lookup_table and its grad; the send is is_distributed, one part per server; no recv
// of the table, nothing initializes it); each server holds its shard in TableVars, its startup
// fills [0, 8] in the table initializer's place, and its table block merges the row gradients.
TEST(ParameterServerPass, DistributedTableTwoServersSgdMatchGolden) {
  for (int index : {-1, 0, 1}) {
    Program main, startup;
    BuildSparse(main, startup, "sgd", true);
    Transpile(main, startup, 2, 2, index);
    const std::string who = index < 0 ? "trainer" : "server" + std::to_string(index);
    testing::ExpectGolden(main.ToText(), "ps_distributed_2servers_sgd_" + who + "_main.txt");
    testing::ExpectGolden(startup.ToText(), "ps_distributed_2servers_sgd_" + who + "_startup.txt");
  }
}

// The distributed table's lazy Adam on the server: its moments are shard state (TableVars, a
// zero row each when a row is created), its beta powers ordinary state.
TEST(ParameterServerPass, DistributedTableOneServerLazyAdamMatchesGolden) {
  Program main, startup;
  BuildSparse(main, startup, "adam", true);
  Transpile(main, startup, 1, 2, 0, transpiler::PsMode::kAsync);
  testing::ExpectGolden(main.ToText(), "ps_distributed_async_1server_adam_server0_main.txt");
  testing::ExpectGolden(startup.ToText(), "ps_distributed_async_1server_adam_server0_startup.txt");
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
  // A distributed table in GEO mode.
  Program m4, s4;
  BuildSparse(m4, s4, "sgd", true);
  transpiler::PsOptions o;
  o.mode = transpiler::PsMode::kGeo;
  o.geo_k = 2;
  const std::string e4 = ErrorOf([&] { transpiler::ParameterServerPass(o).Apply(m4, s4); });
  EXPECT_NE(e4.find("distributed table table (is_distributed=true) in GEO mode is not built"),
            std::string::npos)
      << e4;
  // A trainer over its memory budget, naming the largest var and the setting: a 100000 x 8
  // table (3.05 MiB) against 1 MiB; as is_distributed the trainer holds no table and passes.
  for (bool distributed : {false, true}) {
    Program m, st;
    {
      ProgramGuard guard(m, st);
      Var ids = layers::data("ids", {-1, 1}, DType::kInt64);
      Var e = layers::embedding(ids, {100000, 8}, -1, ParamAttr("big"), DType::kFloat32, true,
                                distributed);
      optimizer::SGD(0.1f).minimize(layers::mean(e), &st);
    }
    transpiler::PsOptions ob;
    ob.nservers = 2;
    ob.ntrainers = 2;
    ob.worker_memory_mb = 1;
    const std::string eb = ErrorOf([&] { transpiler::ParameterServerPass(ob).Apply(m, st); });
    if (distributed) {
      EXPECT_EQ(eb, "");
    } else {
      EXPECT_NE(eb.find("over DistributedStrategy.ps_worker_memory_mb=1; the largest is big "
                        "[100000, 8]"),
                std::string::npos)
          << eb;
    }
  }
  // One table looked up as distributed and as not: refused naming it.
  Program m8, s8;
  {
    ProgramGuard guard(m8, s8);
    Var ids = layers::data("ids", {-1, 1}, DType::kInt64);
    Var a = layers::embedding(ids, {2048, 8}, -1, ParamAttr("t"), DType::kFloat32, true, true);
    Var b = layers::embedding(ids, {2048, 8}, -1, ParamAttr("t"), DType::kFloat32, true, false);
    optimizer::SGD(0.1f).minimize(layers::mean(layers::elementwise_add(a, b)), &s8);
  }
  const std::string e8 = ErrorOf([&] { Transpile(m8, s8, 2, 2, -1); });
  EXPECT_NE(e8.find("table t has 1 lookup_table ops with is_distributed=true and 1 without"),
            std::string::npos)
      << e8;
  // is_distributed without is_sparse.
  Program m9, s9;
  const std::string e9 = ErrorOf([&] {
    ProgramGuard guard(m9, s9);
    Var ids = layers::data("ids", {-1, 1}, DType::kInt64);
    layers::embedding(ids, {16, 8}, -1, {}, DType::kFloat32, false, true);
  });
  EXPECT_NE(e9.find("is_distributed=true needs is_sparse=true"), std::string::npos) << e9;
}

}  // namespace
}  // namespace keel
