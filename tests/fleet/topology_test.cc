// The hybrid topology (fleet/topology.h), the tensor-parallel strategy fields and their refusals,
// the DSL's sharded initialisation order, and TensorParallelPass's programs (golden text).
#include "fleet/topology.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "executor/executor.h"
#include "fleet/distributed_strategy.h"
#include "fleet/fleet.h"
#include "fleet/transpile.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/dsl/tensor_parallel.h"
#include "framework/error.h"
#include "framework/op/op_registry.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
#include "transpiler/grad_allreduce_pass.h"
#include "transpiler/tensor_parallel_pass.h"

namespace keel {
namespace fleet {
namespace {

using testing::ErrorOf;

std::string List(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return "{" + s + "}";
}

// World 8 = dp2 x pp2 x tp2, as Paddle's CommunicateTopology lays it out (tp fastest, then pp,
// then dp).
TEST(Topology, World8IsDp2Pp2Tp2InPaddlesOrder) {
  Topology t(8, 2, 2, 2);
  std::string table;
  for (int r = 0; r < 8; ++r) {
    const RankCoord c = t.Coord(r);
    table += "rank " + std::to_string(r) + ": dp " + std::to_string(c.dp) + " pp " +
             std::to_string(c.pp) + " tp " + std::to_string(c.tp) + " | tp " + List(t.TpGroup(r)) +
             " pp " + List(t.PpGroup(r)) + " dp " + List(t.DpGroup(r)) + " | " + t.TpGroupName(r) +
             " " + t.DpGroupName(r) + "\n";
  }
  EXPECT_EQ(table,
            "rank 0: dp 0 pp 0 tp 0 | tp {0,1} pp {0,2} dp {0,4} | tp:dp0.pp0 dp:pp0.tp0\n"
            "rank 1: dp 0 pp 0 tp 1 | tp {0,1} pp {1,3} dp {1,5} | tp:dp0.pp0 dp:pp0.tp1\n"
            "rank 2: dp 0 pp 1 tp 0 | tp {2,3} pp {0,2} dp {2,6} | tp:dp0.pp1 dp:pp1.tp0\n"
            "rank 3: dp 0 pp 1 tp 1 | tp {2,3} pp {1,3} dp {3,7} | tp:dp0.pp1 dp:pp1.tp1\n"
            "rank 4: dp 1 pp 0 tp 0 | tp {4,5} pp {4,6} dp {0,4} | tp:dp1.pp0 dp:pp0.tp0\n"
            "rank 5: dp 1 pp 0 tp 1 | tp {4,5} pp {5,7} dp {1,5} | tp:dp1.pp0 dp:pp0.tp1\n"
            "rank 6: dp 1 pp 1 tp 0 | tp {6,7} pp {4,6} dp {2,6} | tp:dp1.pp1 dp:pp1.tp0\n"
            "rank 7: dp 1 pp 1 tp 1 | tp {6,7} pp {5,7} dp {3,7} | tp:dp1.pp1 dp:pp1.tp1\n");
}

TEST(Topology, RankAndCoordAreInversesAndGroupsPartitionTheWorld) {
  for (auto [dp, pp, tp] : {std::tuple{1, 1, 1}, std::tuple{4, 1, 1}, std::tuple{1, 1, 4},
                            std::tuple{3, 1, 2}, std::tuple{2, 3, 2}, std::tuple{1, 2, 4}}) {
    Topology t(dp * pp * tp, dp, pp, tp);
    SCOPED_TRACE(t.ToString());
    std::vector<int> seen(t.world_size(), 0);
    for (int r = 0; r < t.world_size(); ++r) {
      EXPECT_EQ(t.Rank(t.Coord(r)), r);
      const std::vector<int> g = t.TpGroup(r);
      ASSERT_EQ(static_cast<int>(g.size()), tp);
      EXPECT_EQ(g[t.Coord(r).tp], r);  // its index in the group is its coordinate
      EXPECT_EQ(t.DpGroup(r)[t.Coord(r).dp], r);
      EXPECT_EQ(t.PpGroup(r)[t.Coord(r).pp], r);
      if (t.Coord(r).tp == 0)
        for (int m : g) ++seen[m];
    }
    for (int n : seen) EXPECT_EQ(n, 1);  // the tp groups partition the world
  }
  // Without tp or pp the data-parallel ring is the whole job's (group "").
  EXPECT_EQ(Topology(4, 4, 1, 1).DpGroupName(3), "");
}

TEST(Topology, BadDegreesAndRanksAreNamed) {
  EXPECT_NE(ErrorOf([] { Topology(8, 2, 1, 2); }).find("is not the world size 8"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { Topology(4, 4, 1, 0); }).find("tensor_parallel_degree=0"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { Topology(4, 0, 1, 4); }).find("dp_degree=0"), std::string::npos);
  EXPECT_NE(ErrorOf([] { Topology(4, 2, 1, 2).Coord(4); }).find("rank 4"), std::string::npos);
}

Role World(int world, int rank = 0) {
  Role r;
  r.world_size = world;
  r.rank = rank;
  r.local_world_size = world;
  r.local_rank = rank;
  return r;
}

DistributedStrategy Tp(int degree) {
  DistributedStrategy s;
  s.tensor_parallel = true;
  s.tensor_parallel_configs.tensor_parallel_degree = degree;
  return s;
}

TEST(TensorParallelStrategy, DataParallelFillsTheRest) {
  const Topology t = TopologyFor(Tp(2), World(6));
  EXPECT_EQ(t.dp_degree(), 3);
  EXPECT_EQ(t.tp_degree(), 2);
  // Rank 3 = dp 1, tp 1: its data-parallel ring holds ranks {1, 3, 5}, where it is index 1.
  const transpiler::RingOptions r = RingOptionsFor(Tp(2), World(6, 3));
  EXPECT_EQ(r.nranks, 3);
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.group, "dp:pp0.tp1");
  const TensorParallelConfig c = TensorParallelConfigFor(Tp(2), World(6, 3));
  EXPECT_EQ(c.degree, 2);
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.ring_id, transpiler::kTensorParallelRingId);
  // Without tensor parallelism: the whole job, as before.
  const transpiler::RingOptions plain = RingOptionsFor(DistributedStrategy(), World(6, 3));
  EXPECT_EQ(plain.nranks, 6);
  EXPECT_EQ(plain.rank, 3);
  EXPECT_EQ(plain.group, "");
}

TEST(TensorParallelStrategy, EveryRefusalNamesItsFields) {
  struct Case {
    DistributedStrategy s;
    int world;
    std::vector<std::string> says;
  };
  std::vector<Case> cases;
  cases.push_back({Tp(3), 4, {"tensor_parallel_degree=3", "does not divide world_size=4"}});
  cases.push_back({Tp(1), 4, {"tensor_parallel_degree=1", "must be >= 2"}});
  DistributedStrategy off;
  off.tensor_parallel_configs.tensor_parallel_degree = 2;
  cases.push_back({off, 4, {"tensor_parallel_degree=2", "tensor_parallel=false"}});
  DistributedStrategy s = Tp(2);
  s.use_local_sgd = true;
  cases.push_back({s, 4, {"tensor_parallel=true", "use_local_sgd=true"}});
  s = Tp(2);
  s.use_hierarchical_allreduce = true;
  cases.push_back({s, 4, {"tensor_parallel=true", "use_hierarchical_allreduce=true"}});
  // One replica: no data-parallel ring for sync_batch_norm (with replicas it syncs each shard
  // over the data-parallel ring of its tensor-parallel coordinate).
  s = Tp(2);
  s.sync_batch_norm = true;
  cases.push_back(
      {s,
       2,
       {"sync_batch_norm=true", "tensor_parallel_degree=2 on 2 workers", "one data-parallel"}});
  // ZeRO-1 shards over each tensor-parallel coordinate's replicas: none with the degree equal to
  // the world size.
  s = Tp(2);
  s.sharding = true;
  cases.push_back({s, 2, {"sharding=true", "tensor_parallel_degree=2", "one data-parallel"}});
  for (const Case& c : cases) {
    const std::string e = ErrorOf([&] { c.s.Validate(World(c.world)); });
    for (const std::string& w : c.says) EXPECT_NE(e.find(w), std::string::npos) << w << ": " << e;
  }
  EXPECT_EQ(ErrorOf([] { Tp(2).Validate(World(4)); }), "");
  EXPECT_EQ(ErrorOf([] { Tp(4).Validate(World(4)); }), "");
  // Gradient merge, AMP (with loss scaling too) and recompute work inside tensor-parallel groups.
  s = Tp(2);
  s.gradient_merge = true;
  s.gradient_merge_configs.k_steps = 2;
  s.amp = true;
  s.amp_configs.dtype = DType::kFloat16;
  s.recompute = true;
  EXPECT_EQ(ErrorOf([&] { s.Validate(World(4)); }), "");
  s = Tp(2);
  s.sharding = true;
  EXPECT_EQ(ErrorOf([&] { s.Validate(World(4)); }), "");
  s = Tp(2);
  s.sync_batch_norm = true;
  EXPECT_EQ(ErrorOf([&] { s.Validate(World(4)); }), "");
}

// A two-block Megatron MLP with a replicated layer norm-free head; `tp` ranks, this one `rank`.
void BuildTpModel(Program& main, Program& startup, int tp, int rank) {
  ProgramGuard g(main, startup);
  TensorParallelGuard guard({tp, rank, transpiler::kTensorParallelRingId});
  Var x = layers::data("x", {-1, 4});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 8, "tanh", 1, {}, {}, true, layers::Parallel::kColumn);
  h = layers::fc(h, 6, "tanh", 1, {}, {}, true, layers::Parallel::kRow);
  Var loss = layers::mean(layers::cross_entropy(layers::fc(h, 2, "softmax"), y));
  optimizer::SGD(0.1f).minimize(loss, &startup);
}

// Sharded parameters are cut from their full initial value at the end of startup, so every
// initializer keeps the index (and the derived seed) it has in the TP=1 program.
TEST(TensorParallelDsl, InitializersKeepTheirTp1Indices) {
  Program m1, s1, m2, s2;
  BuildTpModel(m1, s1, 1, 0);
  BuildTpModel(m2, s2, 2, 1);
  const Block& a = s1.global_block();
  const Block& b = s2.global_block();
  size_t inits = 0;
  while (inits < b.num_ops() && b.op(inits)->type() != "c_split") ++inits;
  ASSERT_LE(inits, a.num_ops());
  for (size_t i = 0; i < inits; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(b.op(i)->type(), a.op(i)->type());
    std::string out = b.op(i)->Output("Out")[0];
    const size_t at = out.find(kTpFullSuffix);
    if (at != std::string::npos) out = out.substr(0, at);
    EXPECT_EQ(out, a.op(i)->Output("Out")[0]);
  }
  // fc_0.w_0, fc_0.b_0 (column) and fc_1.w_0 (row) are cut: this rank's columns / rows.
  std::string cuts;
  for (size_t i = inits; i < b.num_ops() && b.op(i)->type() == "c_split"; ++i)
    cuts += b.op(i)->Output("Out")[0] + " axis " + std::to_string(b.op(i)->Attr<int>("axis")) +
            " " + b.MustFindVar(b.op(i)->Output("Out")[0])->dims().str() + "; ";
  EXPECT_EQ(cuts, "fc_0.w_0 axis 1 [4, 4]; fc_0.b_0 axis 0 [4]; fc_1.w_0 axis 0 [4, 6]; ");
}

TEST(TensorParallelDsl, LayersRefuseWhatCannotSplit) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var x = layers::data("x", {-1, 4});
  EXPECT_NE(ErrorOf([&] { layers::c_identity(x); }).find("no tensor-parallel group"),
            std::string::npos);
  TensorParallelGuard guard({2, 0, transpiler::kTensorParallelRingId});
  EXPECT_NE(ErrorOf([&] {
              layers::fc(x, 5, "", 1, {}, {}, true, layers::Parallel::kColumn);
            }).find("size 5 does not divide by the tensor-parallel degree 2"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              layers::vocab_parallel_embedding(x, {7, 4});
            }).find("vocab 7 does not divide by the tensor-parallel degree 2"),
            std::string::npos);
  Var image = layers::data("image", {-1, 4, 6, 6});
  EXPECT_NE(ErrorOf([&] {
              layers::conv2d(image, 5, 3, 1, 1, 1, 1, "", {}, {}, true, layers::Parallel::kColumn);
            }).find("num_filters 5 does not divide by the tensor-parallel degree 2"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              layers::conv2d(image, 4, 3, 1, 1, 1, 2, "", {}, {}, true, layers::Parallel::kRow);
            }).find("a tensor-parallel convolution (parallel=Row) takes groups=1, got 2"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              layers::batch_norm(image, "", false, 0.9f, 1e-5f, {}, {}, false, /*sync=*/true,
                                 /*channels_sharded=*/true);
            }).find("sync and channels_sharded together are not built"),
            std::string::npos);
}

// Convolutions split by channels: Column cuts W's output channels (and b), c_identity first; Row
// cuts its input channels, all-reduces the partial sums and adds the whole b; a sharded batch
// norm cuts its scale, bias and moving statistics. Shapes are this rank's (of 2).
TEST(TensorParallelDsl, ConvolutionsAndBatchNormsSplitByChannels) {
  Program main, startup;
  ProgramGuard g(main, startup);
  TensorParallelGuard guard({2, 1, transpiler::kTensorParallelRingId});
  Var image = layers::data("image", {-1, 4, 6, 6});
  Var h = layers::conv2d(image, 8, 3, 1, 1, 1, 1, "", {}, {}, true, layers::Parallel::kColumn);
  EXPECT_EQ(h.shape().str(), "[-1, 4, 6, 6]");
  h = layers::batch_norm(h, "relu", false, 0.9f, 1e-5f, {}, {}, false, false, true);
  h = layers::conv2d(h, 6, 3, 1, 1, 1, 1, "", {}, {}, true, layers::Parallel::kRow);
  EXPECT_EQ(h.shape().str(), "[-1, 6, 6, 6]");
  std::string ops;
  for (const auto& op : main.global_block().ops()) ops += op->type() + " ";
  EXPECT_EQ(ops,
            "c_identity conv2d elementwise_add batch_norm relu conv2d mp_allreduce_sum "
            "elementwise_add ");
  const Block& sb = startup.global_block();
  std::string cuts;
  for (const auto& op : sb.ops())
    if (op->type() == "c_split")
      cuts += op->Output("Out")[0] + " axis " + std::to_string(op->Attr<int>("axis")) + " " +
              sb.MustFindVar(op->Output("Out")[0])->dims().str() + "; ";
  EXPECT_EQ(cuts,
            "conv2d_0.w_0 axis 0 [4, 4, 3, 3]; conv2d_0.b_0 axis 0 [4]; batch_norm_0.w_0 axis 0 "
            "[4]; batch_norm_0.b_0 axis 0 [4]; batch_norm_0.w_1 axis 0 [4]; batch_norm_0.w_2 axis "
            "0 [4]; conv2d_1.w_0 axis 1 [6, 4, 3, 3]; ");
  EXPECT_EQ(sb.MustFindVar("conv2d_1.b_0")->dims().str(), "[6]");
}

// Rank 3 of 4 = dp 1 x tp 1 (tp2 x dp2): the data-parallel ring of its tp coordinate, then the
// tensor-parallel ring with the replicated parameters broadcast in the group.
TEST(TensorParallelPass, StartupGolden) {
  Program main, startup;
  BuildTpModel(main, startup, 2, 1);
  const Role role = World(4, 3);
  Transpile(main, startup, Tp(2), role);
  testing::ExpectGolden(startup.ToText(), "tensor_parallel_tp2dp2_startup.txt");
  testing::ExpectGolden(main.ToText(), "tensor_parallel_tp2dp2_main.txt");
}

TEST(TensorParallelPass, RefusesAModelBuiltForAnotherDegree) {
  Program main, startup;
  BuildTpModel(main, startup, 2, 0);
  transpiler::TensorParallelOptions o;
  o.degree = 4;
  const std::string e = ErrorOf([&] { transpiler::TensorParallelPass(o).Apply(main, startup); });
  EXPECT_NE(e.find("nranks=2 but tensor_parallel_degree=4"), std::string::npos) << e;
}

// A program with an op that shards the model (OpTraits::shards_model: the tensor-parallel ops)
// that fleet's minimize did not make is refused by fleet's checkpoint calls: without the layout
// minimize records, rank 0 could not gather the other ranks' shards (with it, they are:
// TensorParallel.ACheckpointJoinsTheShardsAndResumesExactly). The same program without it saves.
TEST(TensorParallelCheckpoints, AProgramWithAModelShardingOpIsRefusedNamingIt) {
  for (const char* type : {"c_identity", "mp_allreduce_sum", "c_split", "c_concat", "c_embedding"})
    EXPECT_TRUE(OpRegistry::Traits(type).shards_model) << type;
  EXPECT_FALSE(OpRegistry::Traits("c_allreduce_sum").shards_model);
  Program main, startup;
  {
    ProgramGuard g(main, startup);
    layers::fc(layers::data("x", {-1, 4}), 2);
  }
  Executor exe(CPUPlace());
  exe.Run(startup);
  const std::string dir = ::testing::TempDir() + "/tp_ckpt";
  EXPECT_EQ(testing::ErrorOf([&] { fleet::save_persistables(exe, dir, &main); }), "");
  Block& b = main.global_block();
  OpDesc* op = b.AppendOp("c_identity");
  op->SetInput("X", {b.AllVars().front()->name()});
  op->SetOutput("Out", {b.AllVars().front()->name()});
  testing::ExpectErrorContainsAll(
      testing::ErrorOf([&] { fleet::save_persistables(exe, dir + "2", &main); }),
      {"checkpoint", "model-parallel (op c_identity", "minimize did not make it"});
  testing::ExpectErrorContainsAll(
      testing::ErrorOf([&] { fleet::load_persistables(exe, dir, &main); }),
      {"checkpoint", "model-parallel (op c_identity", "minimize did not make it"});
  testing::ExpectErrorContainsAll(
      testing::ErrorOf([&] { fleet::save_inference_model(exe, dir + "3", {"x"}, {}, &main); }),
      {"fleet::save_inference_model", "model-parallel (op c_identity", "minimize did not make it"});
}

}  // namespace
}  // namespace fleet
}  // namespace keel
