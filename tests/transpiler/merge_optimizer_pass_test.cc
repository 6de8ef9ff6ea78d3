// MergeOptimizerOpsPass: the optimizer ops of a fused gradient group become one merged op (one
// CUDA launch); the program text before and after (golden), the same parameters bit for bit after
// training with and without the merge, groups that must not merge, and the merged ops' checks.
#include "transpiler/merge_optimizer_pass.h"
#include "fleet/transpile.h"

#include <gtest/gtest.h>

#include "executor/executor.h"
#include "fleet/distributed_strategy.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "models/model_zoo.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/grad_allreduce_pass.h"

namespace keel {
namespace {

using testing::BuildTrainedMlp;
using testing::InsertFusedGradients;
using testing::TwoOfFour;

void Merge(Program& main, Program& startup) {
  transpiler::MergeOptimizerOpsPass().Apply(main, startup);
}

int Count(const Program& p, const std::string& type) {
  int n = 0;
  for (auto& op : p.global_block().ops()) n += op->type() == type;
  return n;
}

TEST(MergeOptimizerOpsPass, OneMergedOpPerFusedGroupMatchesGolden) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.fuse_all_reduce_ops = true;
  s.fuse_grad_size_in_num = 2;  // two groups of two gradients
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  Merge(main, startup);
  testing::ExpectGolden(main.ToText(), "merge_optimizer_2groups_main.txt");
  EXPECT_EQ(Count(main, "sgd"), 0);
  EXPECT_EQ(Count(main, "merged_sgd"), 2);
}

// With weight decay each update reads grad + coeff * param (<grad>@L2DECAY), not the fused
// gradient itself; the groups still merge.
TEST(MergeOptimizerOpsPass, WeightDecayedGroupsMergeMatchesGolden) {
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    Var x = layers::data("x", {-1, 4});
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    Var h = layers::fc(x, 3, "tanh");
    Var cost = layers::mean(layers::cross_entropy(layers::fc(h, 2, "softmax"), y));
    optimizer::Momentum opt(0.1f, 0.9f);
    opt.set_weight_decay(1e-4f);
    opt.minimize(cost, &startup);
  }
  fleet::DistributedStrategy s;
  s.fuse_all_reduce_ops = true;
  s.fuse_grad_size_in_num = 2;
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  Merge(main, startup);
  testing::ExpectGolden(main.ToText(), "merge_optimizer_weight_decay_main.txt");
  EXPECT_EQ(Count(main, "momentum"), 0);
  EXPECT_EQ(Count(main, "merged_momentum"), 2);
}

TEST(MergeOptimizerOpsPass, WithoutFusedGroupsNothingChanges) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  transpiler::GradAllReducePass(
      fleet::GradAllReduceOptionsFor(fleet::DistributedStrategy(), TwoOfFour()))
      .Apply(main, startup);
  const std::string before = main.ToText();
  Merge(main, startup);
  EXPECT_EQ(main.ToText(), before);
}

// Gradients made views of one buffer by a coalesce_tensor at the start of main (what the
// all-reduce pass does with fusion), for a model built by the zoo with `opt`.
struct FusedModel {
  models::TrainableModel m;
  FusedModel(const std::string& opt, bool merge) {
    models::ModelConfig cfg;
    cfg.name = "mlp";
    cfg.seed = 3;
    cfg.hidden = 16;
    cfg.batch_size = 8;
    cfg.make_optimizer = [opt](const std::string&, float) {
      LearningRate lr = lr_schedule::LinearWarmup(lr_schedule::Cosine(0.05f, 100), 3);
      std::unique_ptr<optimizer::Optimizer> o;
      if (opt == "sgd") o = std::make_unique<optimizer::SGD>(lr);
      if (opt == "momentum") o = std::make_unique<optimizer::Momentum>(lr, 0.9f, true);
      if (opt == "adam") o = std::make_unique<optimizer::Adam>(lr);
      if (opt == "adamw") o = std::make_unique<optimizer::AdamW>(lr, 0.1f);
      o->set_grad_clip(optimizer::GradientClipByGlobalNorm{0.5f});
      if (opt != "adamw") o->set_weight_decay(1e-3f);
      return o;
    };
    m = models::BuildModel(cfg);
    Block& b = m.main->global_block();
    std::vector<std::string> grads;
    std::vector<int64_t> numels;
    // The raw gradients, as the all-reduce pass fuses them (weight decay's updates read vars
    // derived from them).
    for (auto& op : b.ops())
      if (op->type() == opt) {
        const auto& rv = op->Attr<std::vector<std::string>>(kOpRoleVarAttr);
        grads.push_back(GradVarName(rv[0]));
        numels.push_back(b.MustFindVar(rv[0])->dims().numel());
      }
    InsertFusedGradients(b, grads, numels);
    if (merge) Merge(*m.main, *m.startup);
  }
};

// The merged update runs the per-parameter kernel for each parameter: training with and without
// the merge ends in the same parameters, bit for bit, for every optimizer (decay, clip and a
// schedule included).
TEST(MergeOptimizerOpsPass, TrainingGivesTheSameParametersBitForBit) {
  for (const char* opt : {"sgd", "momentum", "adam", "adamw"}) {
    SCOPED_TRACE(opt);
    FusedModel plain(opt, false), merged(opt, true);
    EXPECT_GT(Count(*plain.m.main, opt), 1);
    EXPECT_EQ(Count(*merged.m.main, opt), 0);
    EXPECT_EQ(Count(*merged.m.main, std::string("merged_") + opt), 1);
    Executor a, b;
    a.Run(*plain.m.startup);
    b.Run(*merged.m.startup);
    for (int step = 0; step < 5; ++step) {
      FeedMap fa, fb;
      plain.m.next_batch(8, &fa);
      merged.m.next_batch(8, &fb);
      const double la = a.Run(*plain.m.main, fa, {plain.m.loss})[0].item<double>();
      const double lb = b.Run(*merged.m.main, fb, {merged.m.loss})[0].item<double>();
      EXPECT_EQ(la, lb) << "step " << step;
    }
    for (VarDesc* v : plain.m.main->global_block().AllVars()) {
      if (!v->persistable()) continue;
      const Tensor& ta = a.scope().FindVar(v->name())->tensor();
      const Tensor& tb = b.scope().FindVar(v->name())->tensor();
      EXPECT_EQ(testing::ToDouble(ta), testing::ToDouble(tb)) << v->name();
    }
  }
}

// An op between two updates that reads what the first one wrote keeps them apart.
TEST(MergeOptimizerOpsPass, AnOpReadingAnEarlierUpdateKeepsTheGroupApart) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.fuse_all_reduce_ops = true;
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  Block& b = main.global_block();
  size_t first_sgd = 0;
  while (b.op(first_sgd)->type() != "sgd") ++first_sgd;
  const std::string param = b.op(first_sgd)->Output("ParamOut")[0];
  b.Var("peek")->set_dtype(DType::kFloat32);
  auto peek = std::make_unique<OpDesc>("scale");
  peek->SetInput("X", {param});
  peek->SetOutput("Out", {"peek"});
  peek->SetAttr("scale", 1.0f);
  b.InsertOp(first_sgd + 1, std::move(peek));
  Merge(main, startup);
  EXPECT_EQ(Count(main, "merged_sgd"), 0);
  EXPECT_EQ(Count(main, "sgd"), 4);
}

TEST(MergedOptimizerOps, ListsMustMatchInLengthAndShape) {
  testing::OpCase c;
  c.name = "merged_sgd";
  c.type = "merged_sgd";
  c.inputs = {{"Param",
               {testing::RandomTensor({2, 3}, DType::kFloat32),
                testing::RandomTensor({4}, DType::kFloat32)}},
              {"Grad", {testing::RandomTensor({2, 3}, DType::kFloat32)}},
              {"LearningRate", {testing::RandomTensor({1}, DType::kFloat32)}}};
  c.outputs = {{"ParamOut", 2}};
  testing::ExpectErrorContainsAll(testing::ForwardError(c),
                                  {"merged_sgd", "Grad lists 1 vars for 2 Params"});
  c.inputs[1].second.push_back(testing::RandomTensor({5}, DType::kFloat32));
  testing::ExpectErrorContainsAll(testing::ForwardError(c),
                                  {"merged_sgd", "Grad[1]", "[5]", "must match Param[1]", "[4]"});
}

}  // namespace
}  // namespace keel
