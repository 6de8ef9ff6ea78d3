// The CUDA executor's cross-stream event plan (executor/event_plan.h), checked on CPU: which op
// records an event and which stream waits for it, on hand-made graphs and on the transpiled
// two-ring MLP, where the rings must wait only at c_sync_calc_stream and compute only where the
// optimizer reads all-reduced gradients, so the all-reduce overlaps the rest of backward.
#include "executor/event_plan.h"

#include <gtest/gtest.h>

#include "executor/executor.h"
#include "fleet/distributed_strategy.h"
#include "fleet/transpile.h"
#include "framework/dsl/program_guard.h"
#include "framework/op/op_registry.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/grad_allreduce_pass.h"

namespace keel {
namespace {

using Access = DependencyGraph::OpAccess;
using V = std::vector<int>;

TEST(EventPlan, ACrossStreamEdgeGetsOneEventAndSameStreamEdgesNone) {
  DependencyGraph g({Access{{}, {"a"}},      // 0 compute: a =
                     Access{{"a"}, {"a"}},   // 1 ring 0: all-reduce a
                     Access{{"a"}, {"b"}},   // 2 compute: b = f(a)
                     Access{{"b"}, {"c"}}},  // 3 compute: c = f(b)
                    {});
  EventPlan p = PlanEvents(g, {0, 1, 0, 0});
  EXPECT_EQ(p.waits[1], (V{0}));    // the ring waits for a's writer
  EXPECT_EQ(p.waits[2], (V{1}));    // compute waits for the all-reduce
  EXPECT_TRUE(p.waits[3].empty());  // same stream: ordered already
  EXPECT_EQ(p.record_after, (std::vector<char>{1, 1, 0, 0}));
  EXPECT_EQ(p.final_waits, (V{1}));
}

TEST(EventPlan, ARingEventCoversTheRingsEarlierOpsAndIsInherited) {
  DependencyGraph g({Access{{}, {"a"}},          // 0 compute
                     Access{{"a"}, {"a"}},       // 1 ring 0
                     Access{{}, {"c"}},          // 2 ring 0
                     Access{{"a", "c"}, {"d"}},  // 3 compute: waits for 2, which covers 1
                     Access{{"d"}, {"a"}}},      // 4 compute after 3 (and 1): inherits
                    {});
  EventPlan p = PlanEvents(g, {0, 1, 1, 0, 0});
  EXPECT_EQ(p.waits[3], (V{2}));
  EXPECT_TRUE(p.waits[4].empty());
  EXPECT_EQ(p.record_after[1], 0);
  EXPECT_EQ(p.final_waits, (V{2}));
}

// Compute ops are enqueued in the order they become ready, not in program order, so each compute
// op a ring waits for gets its own event even when a later one exists.
TEST(EventPlan, EveryComputePredecessorOfARingOpIsWaitedFor) {
  DependencyGraph g({Access{{}, {"a"}},           // 0 compute
                     Access{{}, {"b"}},           // 1 compute, independent of 0
                     Access{{"a", "b"}, {"a"}}},  // 2 ring 0
                    {});
  EventPlan p = PlanEvents(g, {0, 0, 1});
  EXPECT_EQ(p.waits[2], (V{0, 1}));
}

TEST(EventPlan, TwoRingMlpWaitsOnlyAtTheSyncOpsAndTheOptimizer) {
  Program main, startup;
  testing::BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.nccl_comm_num = 2;
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, testing::TwoOfFour()))
      .Apply(main, startup);
  Executor exe;
  DependencyGraph& g = exe.DependencyGraphForTesting(main);
  const auto& ops = main.global_block().ops();
  std::vector<int> lanes;
  for (auto& op : ops)
    lanes.push_back(OpRegistry::Traits(op->type()).on_ring ? op->Attr<int>("ring_id") + 1 : 0);
  EventPlan p = PlanEvents(g, lanes);
  int first_sync_comm = -1, allreduces = 0, sgds = 0;
  std::vector<int> last_of_ring(2, -1);
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::string& t = ops[i]->type();
    SCOPED_TRACE("op #" + std::to_string(i) + " " + t);
    if (lanes[i] > 0) last_of_ring[lanes[i] - 1] = static_cast<int>(i);
    if (t == "c_sync_comm_stream" && first_sync_comm < 0) first_sync_comm = static_cast<int>(i);
    if (t == "c_allreduce_sum") {
      ++allreduces;
      // The ring waits for its gradient at the c_sync_calc_stream just before, and for nothing
      // else.
      ASSERT_EQ(ops[i - 1]->type(), "c_sync_calc_stream");
      EXPECT_EQ(p.waits[i], (V{static_cast<int>(i) - 1}));
      EXPECT_TRUE(p.record_after[i - 1]);
    } else if (lanes[i] == 0 && first_sync_comm < 0) {
      EXPECT_TRUE(p.waits[i].empty()) << "backward waits for an all-reduce";
    }
    if (t == "sgd") {
      ++sgds;
      ASSERT_FALSE(p.waits[i].empty()) << "an optimizer op reads a gradient before its all-reduce";
      for (int w : p.waits[i]) EXPECT_GT(lanes[w], 0);
    }
  }
  EXPECT_EQ(allreduces, 4);
  EXPECT_EQ(sgds, 4);
  EXPECT_EQ(p.final_waits, (V{last_of_ring[0], last_of_ring[1]}));
}

// A collective with use_calc_stream runs in order with compute: every earlier op before it, every
// later op after it (no overlap), where by default it only follows its input's writer.
TEST(EventPlan, UseCalcStreamMakesACollectiveOrderedWithCompute) {
  for (bool calc : {false, true}) {
    SCOPED_TRACE(calc ? "use_calc_stream" : "ring stream");
    Program prog;
    Block& block = prog.global_block();
    for (const char* n : {"a", "b", "c", "d"}) block.Var(n)->set_shape({4});
    AppendOp(block, "fill_constant", {}, {{"Out", {"a"}}},
             {{"shape", std::vector<int64_t>{4}}, {"value", 1.0f}});
    AppendOp(block, "fill_constant", {}, {{"Out", {"b"}}},
             {{"shape", std::vector<int64_t>{4}}, {"value", 2.0f}});
    AppendOp(block, "c_allreduce_sum", {{"X", {"a"}}}, {{"Out", {"a"}}},
             {{"ring_id", 0}, {"use_calc_stream", calc}});
    AppendOp(block, "scale", {{"X", {"b"}}}, {{"Out", {"c"}}}, {{"scale", 2.0f}});
    Executor exe;
    DependencyGraph& g = exe.DependencyGraphForTesting(prog);
    EXPECT_TRUE(g.HasEdge(0, 2));
    EXPECT_EQ(g.HasEdge(1, 2), calc) << "an unrelated earlier op";
    EXPECT_EQ(g.HasEdge(2, 3), calc) << "an unrelated later op";
  }
}

}  // namespace
}  // namespace keel
