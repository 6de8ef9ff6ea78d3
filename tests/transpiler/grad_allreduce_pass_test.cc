// GradAllReducePass as before/after program text (golden files), for 1 and 2 rings.
#include <gtest/gtest.h>

#include "fleet/distributed_strategy.h"
#include "fleet/role_maker.h"
#include "fleet/transpile.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/op/op_registry.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
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
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  testing::ExpectGolden(main.ToText(), "grad_allreduce_1ring_main.txt");
  testing::ExpectGolden(startup.ToText(), "grad_allreduce_1ring_startup.txt");
}

TEST(GradAllReducePass, TwoRingsAlternateGradients) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.nccl_comm_num = 2;
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
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
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
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
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  testing::ExpectGolden(main.ToText(), "grad_allreduce_fused_2groups_main.txt");

  // A size limit below every gradient: each is a group of its own.
  Program main2, startup2;
  BuildTrainedMlp(main2, startup2);
  s = fleet::DistributedStrategy();
  s.fuse_all_reduce_ops = true;
  s.fuse_grad_size_in_MB = 1e-6;
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main2, startup2);
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
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  testing::ExpectGolden(main.ToText(), "grad_allreduce_hierarchical_main.txt");
  testing::ExpectGolden(startup.ToText(), "grad_allreduce_hierarchical_startup.txt");
}

// Hierarchy needs two nodes: with all four ranks on one node it warns and the program is the flat
// one-ring program, as Paddle turns hierarchical all-reduce off on a single node.
TEST(GradAllReducePass, HierarchicalOnOneNodeWarnsAndUsesTheFlatRing) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.use_hierarchical_allreduce = true;  // inter_nranks 0: the role's local world, 4 of 4
  ::testing::internal::CaptureStderr();
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("use_hierarchical_allreduce: all 4 ranks are on one node"), std::string::npos)
      << log;
  testing::ExpectGolden(main.ToText(), "grad_allreduce_1ring_main.txt");
  testing::ExpectGolden(startup.ToText(), "grad_allreduce_1ring_startup.txt");
}

// The coalesce_tensor groups of a transpiled program, each as "a,b,c".
std::vector<std::string> FusedGroups(const Program& main) {
  std::vector<std::string> groups;
  for (auto& op : main.global_block().ops()) {
    if (op->type() != "coalesce_tensor") continue;
    std::string g;
    for (const std::string& n : op->Output("Output")) g += (g.empty() ? "" : ",") + n;
    groups.push_back(g);
  }
  return groups;
}

std::vector<std::string> PaddleGroups(double memory_mb, int groups_size, int layers = 3) {
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    Var h = layers::data("x", {-1, 4});
    for (int i = 0; i + 1 < layers; ++i) h = layers::fc(h, 5, "tanh");
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    optimizer::SGD(0.1f).minimize(
        layers::mean(layers::cross_entropy(layers::fc(h, 3, "softmax"), y)), &startup);
  }
  fleet::DistributedStrategy s;
  s.fuse_all_reduce_ops = true;
  s.paddle_fuse = {true, memory_mb, groups_size};
  s.Validate(TwoOfFour());
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  return FusedGroups(main);
}

// Paddle's fusion flags group as Paddle does: a layer's W and b together (by the parameter name
// before the first '.'), memory 0 = one group, memory > 0 merges layers until the size is reached
// or (groups_size > 1) the group holds more than groups_size gradients; 1 or -1: no count limit.
TEST(GradAllReducePass, PaddleFusionFlagsGroupAsPaddleDoes) {
  using G = std::vector<std::string>;
  const G per_layer = {"fc_2.b_0@GRAD,fc_2.w_0@GRAD", "fc_1.b_0@GRAD,fc_1.w_0@GRAD",
                       "fc_0.b_0@GRAD,fc_0.w_0@GRAD"};
  const G one = {
      "fc_2.b_0@GRAD,fc_2.w_0@GRAD,fc_1.b_0@GRAD,fc_1.w_0@GRAD,fc_0.b_0@GRAD,"
      "fc_0.w_0@GRAD"};
  EXPECT_EQ(PaddleGroups(-1, 1), per_layer);  // no memory size: a group per layer
  EXPECT_EQ(PaddleGroups(0, 1), one);         // memory 0: one group
  EXPECT_EQ(PaddleGroups(0, -1), one);
  EXPECT_EQ(PaddleGroups(1, 1), one);  // 1 MB holds every layer; groups_size 1: no limit
  EXPECT_EQ(PaddleGroups(1, -1), one);
  // groups_size 3: a group closes once it holds more than 3 gradients (two layers here).
  EXPECT_EQ(PaddleGroups(1, 3), (G{"fc_2.b_0@GRAD,fc_2.w_0@GRAD,fc_1.b_0@GRAD,fc_1.w_0@GRAD",
                                   "fc_0.b_0@GRAD,fc_0.w_0@GRAD"}));
  // A size below one layer: every layer alone, its W and b still together.
  EXPECT_EQ(PaddleGroups(1e-6, 1), per_layer);
  // keel's own fields with the same small limits would split W from b.
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.fuse_all_reduce_ops = true;
  s.fuse_grad_size_in_MB = 1e-6;
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  EXPECT_EQ(FusedGroups(main).size(), 4u);
}

// The program of Paddle's default fusion flags (a group per layer) as text.
TEST(GradAllReducePass, PaddleFusionPerLayerMatchesGolden) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.fuse_all_reduce_ops = true;
  s.paddle_fuse = {true, -1, 1};
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  testing::ExpectGolden(main.ToText(), "grad_allreduce_paddle_per_layer_main.txt");
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
  transpiler::GradAllReducePass(
      fleet::GradAllReduceOptionsFor(fleet::DistributedStrategy(), TwoOfFour()))
      .Apply(main, startup);
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

// With a group size from the ring model (group_bytes, 32 here): the two gradients of fc_1 (8 + 24
// bytes) close the first group, fc_0's make the second. fc_1's mul_grad is split so that its
// weight gradient is written first: the first group's all-reduce sits between that op and the
// one writing the input gradient the rest of backward needs, so it overlaps that computation.
TEST(GradAllReducePass, RingModelGroupsLeaveWhileBackwardRuns) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.fuse_all_reduce_ops = true;
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour(), 32))
      .Apply(main, startup);
  testing::ExpectGolden(main.ToText(), "grad_allreduce_ring_model_main.txt");
  const Block& b = main.global_block();
  size_t first_allreduce = 0, input_grad = 0;
  for (size_t i = 0; i < b.num_ops(); ++i) {
    const OpDesc& op = *b.op(i);
    if (op.type() == "c_allreduce_sum" && first_allreduce == 0) first_allreduce = i;
    if (op.type() == "mul_grad" && op.Output("X@GRAD")[0] == "tanh.tmp_0@GRAD") input_grad = i;
  }
  EXPECT_GT(first_allreduce, 0u);
  EXPECT_LT(first_allreduce, input_grad) << main.ToText();
  // The split writer keeps the weight gradient and its op_role_var; its twin writes only the
  // input gradient.
  const OpDesc& weight = *b.op(input_grad - 3);
  EXPECT_EQ(weight.type(), "mul_grad");
  EXPECT_EQ(weight.Output("Y@GRAD")[0], "fc_1.w_0@GRAD");
  EXPECT_EQ(weight.Output("X@GRAD")[0], kEmptyVarName);
  EXPECT_TRUE(weight.HasAttr(kOpRoleVarAttr));
  EXPECT_EQ(b.op(input_grad)->Output("Y@GRAD")[0], kEmptyVarName);
  EXPECT_FALSE(b.op(input_grad)->HasAttr(kOpRoleVarAttr));

  // Without the ring model (group_bytes 0) the default limits make one group, as before.
  Program main2, startup2;
  BuildTrainedMlp(main2, startup2);
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main2, startup2);
  EXPECT_EQ(FusedGroups(main2).size(), 1u);
  // fuse_by_ring_model=false ignores a measured size.
  Program main3, startup3;
  BuildTrainedMlp(main3, startup3);
  s.fuse_by_ring_model = false;
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour(), 32))
      .Apply(main3, startup3);
  EXPECT_EQ(FusedGroups(main3).size(), 1u);
}

// The ops that declare ComputesOutputsApart give each output the same bits whether it is computed
// alone or with the others (what lets the data-parallel pass split them).
TEST(OutputsApart, EachOutputAloneHasTheSameBits) {
  using testing::OpCase;
  using testing::RandomTensor;
  std::vector<OpCase> cases;
  const DType f = DType::kFloat32;
  cases.push_back({"mul_grad",
                   "mul_grad",
                   {{"X", {RandomTensor(DDim({5, 7}), f, -1, 1, 1)}},
                    {"Y", {RandomTensor(DDim({7, 3}), f, -1, 1, 2)}},
                    {"Out", {RandomTensor(DDim({5, 3}), f, -1, 1, 3)}},
                    {"Out@GRAD", {RandomTensor(DDim({5, 3}), f, -1, 1, 4)}}},
                   {{"X@GRAD", 1}, {"Y@GRAD", 1}},
                   {{"x_num_col_dims", 1}, {"y_num_col_dims", 1}},
                   {}});
  cases.push_back({"matmul_grad",
                   "matmul_grad",
                   {{"X", {RandomTensor(DDim({2, 5, 7}), f, -1, 1, 5)}},
                    {"Y", {RandomTensor(DDim({3, 7}), f, -1, 1, 6)}},
                    {"Out", {RandomTensor(DDim({2, 5, 3}), f, -1, 1, 7)}},
                    {"Out@GRAD", {RandomTensor(DDim({2, 5, 3}), f, -1, 1, 8)}}},
                   {{"X@GRAD", 1}, {"Y@GRAD", 1}},
                   {{"transpose_Y", true}},
                   {}});
  cases.push_back({"conv2d_grad",
                   "conv2d_grad",
                   {{"Input", {RandomTensor(DDim({2, 3, 6, 6}), f, -1, 1, 9)}},
                    {"Filter", {RandomTensor(DDim({4, 3, 3, 3}), f, -1, 1, 10)}},
                    {"Output", {RandomTensor(DDim({2, 4, 6, 6}), f, -1, 1, 11)}},
                    {"Output@GRAD", {RandomTensor(DDim({2, 4, 6, 6}), f, -1, 1, 12)}}},
                   {{"Input@GRAD", 1}, {"Filter@GRAD", 1}},
                   {{"paddings", std::vector<int>{1, 1}}},
                   {}});
  for (const OpCase& both : cases) {
    SCOPED_TRACE(both.name);
    ASSERT_TRUE(OpRegistry::Traits(both.type).outputs_apart);
    auto all = testing::RunForward(both);
    for (const auto& [slot, n] : both.outputs) {
      OpCase alone = both;
      alone.outputs = {{slot, n}};
      auto one = testing::RunForward(alone);
      ASSERT_EQ(one.count(slot), 1u);
      EXPECT_TRUE(testing::SameBits(one.at(slot), all.at(slot))) << slot;
    }
  }
}

TEST(GradAllReducePass, NeedsBackward) {
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    layers::mean(layers::fc(layers::data("x", {-1, 4}), 2));
  }
  fleet::DistributedStrategy s;
  EXPECT_THROW(transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
                   .Apply(main, startup),
               Error);
}

}  // namespace
}  // namespace keel
