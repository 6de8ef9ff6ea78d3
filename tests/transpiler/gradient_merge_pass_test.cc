// GradientMergePass as program text (golden files) alone, with the data-parallel pass after it and
// with mixed precision; where every piece lands; and its refusals (and those of the passes that
// cannot follow it).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "fleet/distributed_strategy.h"
#include "fleet/role_maker.h"
#include "fleet/transpile.h"
#include "framework/dsl/amp.h"
#include "framework/dsl/gradient_merge.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/grad_allreduce_pass.h"
#include "transpiler/gradient_merge_pass.h"
#include "transpiler/local_sgd_pass.h"

namespace keel {
namespace {

using testing::BuildTrainedMlp;
using testing::TwoOfFour;

transpiler::GradientMergeOptions K(int k, bool avg = true) {
  transpiler::GradientMergeOptions o;
  o.k_steps = k;
  o.avg = avg;
  return o;
}

std::map<std::string, int> Count(const Block& b) {
  std::map<std::string, int> n;
  for (const auto& op : b.ops()) ++n[op->type()];
  return n;
}

const char* kGrads[] = {"fc_0.w_0@GRAD", "fc_0.b_0@GRAD", "fc_1.w_0@GRAD", "fc_1.b_0@GRAD"};

TEST(GradientMergePass, MatchesGoldenAndMovesTheOptimizerIntoTheMergeStep) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  transpiler::GradientMergePass(K(4)).Apply(main, startup);
  testing::ExpectGolden(main.ToText(), "gradient_merge_main.txt");
  testing::ExpectGolden(startup.ToText(), "gradient_merge_startup.txt");
  ASSERT_EQ(main.num_blocks(), 2);
  auto b0 = Count(main.global_block()), b1 = Count(main.block(1));
  EXPECT_EQ(b0["sgd"], 0);
  EXPECT_EQ(b0["sum"], 4);  // one accumulation per gradient
  EXPECT_EQ(b0["conditional_block"], 1);
  EXPECT_EQ(b1["sgd"], 4);
  EXPECT_EQ(b1["scale"], 4);  // avg: 1/k
  EXPECT_EQ(b1["fill_zeros_like"], 4);
  for (const auto& op : main.block(1).ops()) {
    if (op->type() == "sgd") {
      EXPECT_NE(op->Input("Grad")[0].find("@GRAD_MERGED"), std::string::npos) << op->ToText();
    }
  }
  for (const char* g : kGrads) {
    const VarDesc* m = startup.global_block().FindVar(std::string(g) + "@GRAD_MERGED");
    ASSERT_NE(m, nullptr) << g;
    EXPECT_TRUE(m->persistable());
  }
  auto gm = transpiler::FindGradientMerge(main);
  ASSERT_TRUE(gm.has_value());
  EXPECT_EQ(gm->block, 1);
  ASSERT_EQ(gm->merged.size(), 4u);
  EXPECT_EQ(gm->merged[0].second, "fc_1.b_0@GRAD@GRAD_MERGED");  // backward order
}

TEST(GradientMergePass, WithoutAvgTheMergedSumIsNotScaled) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  transpiler::GradientMergePass(K(3, false)).Apply(main, startup);
  EXPECT_EQ(Count(main.block(1))["scale"], 0);
}

// The data-parallel pass after gradient merge all-reduces the merged buffers first thing in the
// merge step (before the avg scale and the updates), on alternating rings, and nothing per run.
TEST(GradientMergePass, DataParallelAfterItAllReducesTheMergedBuffersOncePerMergeStep) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.gradient_merge = true;
  s.gradient_merge_configs.k_steps = 4;
  s.nccl_comm_num = 2;
  s.Validate(TwoOfFour());
  fleet::Transpile(main, startup, s, TwoOfFour());
  testing::ExpectGolden(main.ToText(), "gradient_merge_dp_main.txt");
  testing::ExpectGolden(startup.ToText(), "gradient_merge_dp_startup.txt");
  auto b0 = Count(main.global_block());
  EXPECT_EQ(b0["c_allreduce_sum"], 0);
  EXPECT_EQ(b0["c_sync_comm_stream"], 0);
  EXPECT_EQ(b0["scale"], 1);  // the loss gradient's 1/nranks
  const Block& sub = main.block(1);
  int rings[2] = {0, 0}, first_other = -1;
  for (size_t i = 0; i < sub.num_ops(); ++i) {
    const OpDesc& op = *sub.op(i);
    if (op.type() == "c_allreduce_sum") {
      ++rings[op.Attr<int>("ring_id")];
      EXPECT_NE(op.Input("X")[0].find("@GRAD_MERGED"), std::string::npos);
      EXPECT_EQ(first_other, -1) << "an all-reduce after op #" << first_other;
    } else if (op.type().rfind("c_", 0) != 0 && first_other < 0) {
      first_other = static_cast<int>(i);
    }
  }
  EXPECT_EQ(rings[0], 2);
  EXPECT_EQ(rings[1], 2);
  EXPECT_EQ(Count(sub)["c_sync_comm_stream"], 2);
}

// With loss scaling the overflow check and the scale update move into the merge step and read
// the merged (still scaled) gradients: one decision per k runs.
TEST(GradientMergePass, LossScalingDecidesInTheMergeStep) {
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    Var x = layers::data("x", {-1, 4});
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    Var h = layers::fc(x, 3, "tanh");
    Var cost = layers::mean(layers::cross_entropy(layers::fc(h, 2, "softmax"), y));
    amp::AmpConfig c;
    c.dtype = DType::kFloat16;
    c.check_kernels = false;
    gradient_merge::GradientMergeConfig g;
    g.k_steps = 2;
    auto opt = gradient_merge::decorate(amp::decorate(optimizer::Momentum(0.1f, 0.9f), c), g);
    opt.minimize(cost, &startup);
    ASSERT_NE(opt.amp_optimizer(), nullptr);
  }
  testing::ExpectGolden(main.ToText(), "gradient_merge_amp_fp16_main.txt");
  auto b0 = Count(main.global_block()), b1 = Count(main.block(1));
  EXPECT_EQ(b0["check_finite_and_unscale"], 0);
  EXPECT_EQ(b0["update_loss_scaling"], 0);
  EXPECT_EQ(b1["check_finite_and_unscale"], 1);
  EXPECT_EQ(b1["update_loss_scaling"], 1);
  for (const auto& op : main.block(1).ops()) {
    if (op->type() != "check_finite_and_unscale") continue;
    for (const std::string& x : op->Input("X")) {
      EXPECT_NE(x.find("@GRAD_MERGED"), std::string::npos) << x;
    }
  }
}

TEST(GradientMergePass, RefusesWhatItCannotRewrite) {
  {
    Program main, startup;
    BuildTrainedMlp(main, startup);
    testing::ExpectErrorContainsAll(
        testing::ErrorOf([&] { transpiler::GradientMergePass(K(0)).Apply(main, startup); }),
        {"gradient_merge", "k_steps must be >= 1, got 0"});
  }
  {  // twice
    Program main, startup;
    BuildTrainedMlp(main, startup);
    transpiler::GradientMergePass(K(2)).Apply(main, startup);
    testing::ExpectErrorContainsAll(
        testing::ErrorOf([&] { transpiler::GradientMergePass(K(2)).Apply(main, startup); }),
        {"gradient_merge", "sub-block"});
  }
  {  // after the data-parallel pass
    Program main, startup;
    BuildTrainedMlp(main, startup);
    transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor({}, TwoOfFour()))
        .Apply(main, startup);
    testing::ExpectErrorContainsAll(
        testing::ErrorOf([&] { transpiler::GradientMergePass(K(2)).Apply(main, startup); }),
        {"gradient_merge", "c_allreduce_sum", "collective", "before GradAllReducePass"});
  }
  {  // no optimizer
    Program main, startup;
    {
      ProgramGuard guard(main, startup);
      layers::fc(layers::data("x", {-1, 4}), 3);
    }
    testing::ExpectErrorContainsAll(
        testing::ErrorOf([&] { transpiler::GradientMergePass(K(2)).Apply(main, startup); }),
        {"gradient_merge", "no optimizer ops"});
  }
}

// The passes that cannot act on a merged program say so, naming gradient merge.
TEST(GradientMergePass, LocalSgdFusionAndHierarchyAfterItAreRefused) {
  auto merged = [](Program& main, Program& startup) {
    BuildTrainedMlp(main, startup);
    transpiler::GradientMergePass(K(2)).Apply(main, startup);
  };
  {
    Program main, startup;
    merged(main, startup);
    fleet::DistributedStrategy s;
    s.use_local_sgd = true;
    testing::ExpectErrorContainsAll(
        testing::ErrorOf([&] {
          transpiler::LocalSGDPass(fleet::LocalSGDOptionsFor(s, TwoOfFour())).Apply(main, startup);
        }),
        {"local_sgd", "gradient merge"});
  }
  for (bool fuse : {true, false}) {
    Program main, startup;
    merged(main, startup);
    transpiler::GradAllReduceOptions o;
    o.rings.nranks = 4;
    o.fuse = fuse;
    o.hierarchical = !fuse;
    o.ranks_per_node = 2;
    testing::ExpectErrorContainsAll(
        testing::ErrorOf([&] { transpiler::GradAllReducePass(o).Apply(main, startup); }),
        {"grad_allreduce", "gradient merge",
         fuse ? "fuse_all_reduce_ops" : "use_hierarchical_allreduce"});
  }
}

}  // namespace
}  // namespace keel
