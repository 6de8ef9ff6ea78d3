// GradAllReducePass as before/after program text (golden files), for 1 and 2 rings.
#include <gtest/gtest.h>

#include "fleet/distributed_strategy.h"
#include "fleet/role_maker.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "tests/util/golden.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/grad_allreduce_pass.h"

namespace keel {
namespace {

using testing::BuildTrainedMlp;
using testing::TwoOfFour;

TEST(GradAllReducePass, OneRingMatchesGolden) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  testing::ExpectGolden(main.ToText(), "grad_allreduce_before_main.txt");
  fleet::DistributedStrategy s;
  transpiler::GradAllReducePass().Apply(main, startup, s, TwoOfFour());
  testing::ExpectGolden(main.ToText(), "grad_allreduce_1ring_main.txt");
  testing::ExpectGolden(startup.ToText(), "grad_allreduce_1ring_startup.txt");
}

TEST(GradAllReducePass, TwoRingsAlternateGradients) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.nccl_comm_num = 2;
  transpiler::GradAllReducePass().Apply(main, startup, s, TwoOfFour());
  testing::ExpectGolden(main.ToText(), "grad_allreduce_2ring_main.txt");
  testing::ExpectGolden(startup.ToText(), "grad_allreduce_2ring_startup.txt");
  int rings[2] = {0, 0};
  for (auto& op : main.global_block().ops())
    if (op->type() == "c_allreduce_sum") ++rings[op->Attr<int>("ring_id")];
  EXPECT_EQ(rings[0], 2);
  EXPECT_EQ(rings[1], 2);
}

// fuse_all_reduce_ops with the default limits: one group of all four gradients, one coalesce_tensor
// before the loss-gradient fill and one all-reduce after the last gradient's writer.
TEST(GradAllReducePass, FusionMakesOneGroupWithinTheLimits) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.fuse_all_reduce_ops = true;
  transpiler::GradAllReducePass().Apply(main, startup, s, TwoOfFour());
  testing::ExpectGolden(main.ToText(), "grad_allreduce_fused_main.txt");
  testing::ExpectGolden(startup.ToText(), "grad_allreduce_1ring_startup.txt");  // unchanged
}

// Two tensors per group over two rings: two groups, alternating rings, each all-reduced right
// after its own last writer.
TEST(GradAllReducePass, FusionSplitsGroupsByCountAndSize) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.fuse_all_reduce_ops = true;
  s.fuse_grad_size_in_num = 2;
  s.nccl_comm_num = 2;
  transpiler::GradAllReducePass().Apply(main, startup, s, TwoOfFour());
  testing::ExpectGolden(main.ToText(), "grad_allreduce_fused_2groups_main.txt");

  // A size limit below every gradient: each is a group of its own.
  Program main2, startup2;
  BuildTrainedMlp(main2, startup2);
  s = fleet::DistributedStrategy();
  s.fuse_all_reduce_ops = true;
  s.fuse_grad_size_in_MB = 1e-6;
  transpiler::GradAllReducePass().Apply(main2, startup2, s, TwoOfFour());
  int coalesce = 0, allreduce = 0;
  for (auto& op : main2.global_block().ops()) {
    coalesce += op->type() == "coalesce_tensor";
    if (op->type() == "c_allreduce_sum") {
      ++allreduce;
      EXPECT_EQ(op->Input("X")[0].rfind("@FUSED_GRAD@", 0), 0u) << op->Input("X")[0];
    }
  }
  EXPECT_EQ(coalesce, 4);
  EXPECT_EQ(allreduce, 4);
}

// Hierarchical all-reduce over nodes of 2 ranks (rank 1 of 4: node 0, local index 1), fused, two
// rings: startup adds an intra-node and an inter-node ring per flat ring, each with its group;
// main reduce-scatters each padded group inside the node, all-reduces the part across nodes and
// all-gathers it back.
TEST(GradAllReducePass, HierarchicalMatchesGolden) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.use_hierarchical_allreduce = true;
  s.hierarchical_allreduce_inter_nranks = 2;
  s.fuse_all_reduce_ops = true;
  s.fuse_grad_size_in_num = 2;
  s.nccl_comm_num = 2;
  transpiler::GradAllReducePass().Apply(main, startup, s, TwoOfFour());
  testing::ExpectGolden(main.ToText(), "grad_allreduce_hierarchical_main.txt");
  testing::ExpectGolden(startup.ToText(), "grad_allreduce_hierarchical_startup.txt");
}

// layer_norm_grad writes two parameter gradients: their collectives follow it directly, in the
// order of its op_role_var, and the op that followed it still follows them.
TEST(GradAllReducePass, AnOpWritingTwoGradientsGetsBothRightAfterIt) {
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    Var x = layers::data("x", {-1, 4});
    Var h = layers::layer_norm(layers::fc(x, 6), 1);
    optimizer::SGD(0.1f).minimize(layers::mean(h), &startup);
  }
  Block& b = main.global_block();
  size_t ln = 0;
  while (b.op(ln)->type() != "layer_norm_grad") ++ln;
  const std::string next = b.op(ln + 1)->type();
  const auto vars = b.op(ln)->Attr<std::vector<std::string>>(kOpRoleVarAttr);
  ASSERT_EQ(vars.size(), 4u);
  transpiler::GradAllReducePass().Apply(main, startup, fleet::DistributedStrategy(), TwoOfFour());
  ln = 0;
  while (b.op(ln)->type() != "layer_norm_grad") ++ln;
  const char* want[] = {"c_sync_calc_stream", "c_allreduce_sum", "c_sync_calc_stream",
                        "c_allreduce_sum"};
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(b.op(ln + 1 + k)->type(), want[k]);
    EXPECT_EQ(b.op(ln + 1 + k)->Input("X")[0], vars[k < 2 ? 1 : 3]) << k;
  }
  EXPECT_EQ(b.op(ln + 5)->type(), next);
}

TEST(GradAllReducePass, NeedsBackward) {
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    layers::mean(layers::fc(layers::data("x", {-1, 4}), 2));
  }
  fleet::DistributedStrategy s;
  EXPECT_THROW(transpiler::GradAllReducePass().Apply(main, startup, s, TwoOfFour()), Error);
}

}  // namespace
}  // namespace keel
