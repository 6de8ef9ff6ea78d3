// FuseGradAccumulationPass: gradient merge's sums done by the gradients' ops. The golden program
// (the fc gradients' ops write the merge buffers with accumulate_into, the layer norm's keep their
// sums); training bit for bit equal to the program with the sums over two merge cycles for SGD,
// Momentum, Nesterov, Adam and AdamW, fc fused and not; what the pass leaves alone; a buffer that
// holds nothing to add into is an error naming the op and the var.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "executor/executor.h"
#include "fleet/distributed_strategy.h"
#include "fleet/fleet.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/fuse_gemm_epilogue_pass.h"
#include "transpiler/fuse_grad_accumulation_pass.h"
#include "transpiler/gradient_merge_pass.h"

namespace keel {
namespace {

struct Model {
  Program main, startup;
  Var loss;
};

// x[-1, 6] -> fc(8, relu) -> layer_norm -> fc(3) -> softmax_with_cross_entropy -> mean, minimized
// by `opt`, gradients merged over 4 runs (avg); with `fuse`, each fc one fused_gemm_epilogue.
void Build(Model& m, optimizer::Optimizer& opt, bool fuse = true) {
  m.loss = testing::MinimizedAmpMlp(m.main, m.startup, opt);
  transpiler::GradientMergeOptions o;
  o.k_steps = 4;
  transpiler::GradientMergePass(o).Apply(m.main, m.startup);
  if (fuse) transpiler::FuseGemmEpiloguePass().Apply(m.main, m.startup);
}

std::vector<std::string> Fused(Model& m) {
  transpiler::FuseGradAccumulationPass pass;
  pass.Apply(m.main, m.startup);
  return pass.fused();
}

int Count(const Program& p, const std::string& type) {
  int n = 0;
  for (auto& op : p.global_block().ops()) n += op->type() == type;
  return n;
}

TEST(FuseGradAccumulation, MlpProgramMatchesGolden) {
  Model m;
  optimizer::SGD sgd(0.1f);
  Build(m, sgd);
  EXPECT_EQ(Fused(m),
            (std::vector<std::string>{"fc_1.b_0@GRAD@GRAD_MERGED", "fc_1.w_0@GRAD@GRAD_MERGED",
                                      "fc_0.b_0@GRAD@GRAD_MERGED", "fc_0.w_0@GRAD@GRAD_MERGED"}));
  testing::ExpectGolden(m.main.ToText(), "fuse_grad_accumulation_mlp_main.txt");
  EXPECT_EQ(Count(m.main, "sum"), 2);  // the layer norm's scale and bias
  const Block& b = m.main.global_block();
  EXPECT_EQ(b.FindVar("fc_0.w_0@GRAD"), nullptr);
  for (auto& op : b.ops()) {
    if (op->type() == "fused_gemm_epilogue_grad") {
      EXPECT_EQ(op->Attr<std::vector<std::string>>("accumulate_into").size(), 2u) << op->ToText();
    }
  }
  // Applied again it finds nothing.
  EXPECT_TRUE(Fused(m).empty());
}

// Unfused layers: mul_grad adds the weight gradients into their buffers; the bias gradients come
// from elementwise_add_grad, which cannot, and keep their sums.
TEST(FuseGradAccumulation, UnfusedLayersFuseTheirWeightGradientsOnly) {
  Model m;
  optimizer::SGD sgd(0.1f);
  Build(m, sgd, /*fuse=*/false);
  EXPECT_EQ(Fused(m),
            (std::vector<std::string>{"fc_1.w_0@GRAD@GRAD_MERGED", "fc_0.w_0@GRAD@GRAD_MERGED"}));
  EXPECT_EQ(Count(m.main, "sum"), 4);
}

// With and without the pass: 8 runs (two merge steps), the same losses and persistables, bit for
// bit, for every optimizer: each gradient is rounded to float32 and then added, as the sums add
// it. Fails when the GEMM adds inside its own sums (beta 1), which rounds otherwise.
TEST(FuseGradAccumulation, TrainsBitForBitAsTheSumsDo) {
  for (bool fuse : {true, false}) {
    for (const auto& [name, make] : testing::TrainingOptimizers()) {
      SCOPED_TRACE(name + (fuse ? " fused epilogue" : " mul and add"));
      Model sums, fused;
      auto o1 = make(), o2 = make();
      Build(sums, *o1, fuse);
      Build(fused, *o2, fuse);
      ASSERT_FALSE(Fused(fused).empty());
      Executor a, b;
      a.Run(sums.startup);
      b.Run(fused.startup);
      double worst = 0;
      for (int step = 0; step < 8; ++step) {
        const float la =
            a.Run(sums.main, testing::AmpMlpBatch(step), {sums.loss.name()})[0].item<float>();
        const float lb =
            b.Run(fused.main, testing::AmpMlpBatch(step), {fused.loss.name()})[0].item<float>();
        worst = std::max(worst, std::abs(static_cast<double>(la) - lb) / std::abs(la));
        EXPECT_EQ(la, lb) << "step " << step;
      }
      for (const VarDesc* v : sums.main.global_block().AllVars()) {
        if (!v->persistable() || v->dtype() != DType::kFloat32) continue;
        const Tensor& x = a.scope().FindVar(v->name())->tensor();
        const Tensor& y = b.scope().FindVar(v->name())->tensor();
        ASSERT_EQ(x.numel(), y.numel()) << v->name();
        for (int64_t i = 0; i < x.numel(); ++i) {
          const double d = std::abs(static_cast<double>(x.data<float>()[i]) - y.data<float>()[i]);
          worst = std::max(worst,
                           d / std::max(1e-3, std::abs(static_cast<double>(x.data<float>()[i]))));
        }
      }
      EXPECT_EQ(worst, 0.0);
    }
  }
}

// FuseGemmEpiloguePass after this pass leaves a mul_grad that adds into its buffer whole (fusing it
// would take the add's attributes and overwrite the buffer): training stays the sums', bit for bit.
TEST(FuseGradAccumulation, TheEpilogueFusionAfterItLeavesAccumulatingOpsWhole) {
  Model sums, fused;
  optimizer::SGD s1(0.1f), s2(0.1f);
  Build(sums, s1, /*fuse=*/false);
  Build(fused, s2, /*fuse=*/false);
  ASSERT_EQ(Fused(fused).size(), 2u);
  transpiler::FuseGemmEpiloguePass().Apply(fused.main, fused.startup);
  EXPECT_EQ(Count(fused.main, "mul_grad"), 2);
  Executor a, b;
  a.Run(sums.startup);
  b.Run(fused.startup);
  for (int step = 0; step < 8; ++step) {
    const float la =
        a.Run(sums.main, testing::AmpMlpBatch(step), {sums.loss.name()})[0].item<float>();
    const float lb =
        b.Run(fused.main, testing::AmpMlpBatch(step), {fused.loss.name()})[0].item<float>();
    EXPECT_EQ(la, lb) << "step " << step;
  }
}

// A grad op without the attribute (a program loaded from a file saved before it existed) runs and
// overwrites its output, as it always did.
TEST(FuseGradAccumulation, AnOpWithoutTheAttributeOverwritesItsOutput) {
  Model m;
  optimizer::SGD sgd(0.1f);
  Build(m, sgd);
  for (auto& op : m.main.global_block().ops()) op->RemoveAttr("accumulate_into");
  Executor exe;
  exe.Run(m.startup);
  EXPECT_EQ(testing::ErrorOf([&] { exe.Run(m.main, testing::AmpMlpBatch(0)); }), "");
}

// Through fleet (one worker, gradient merge): the (parameter, gradient) pairs minimize returns
// name vars of the program, the merge buffers for the fused gradients.
TEST(FuseGradAccumulation, FleetsPairsNameTheBuffersOfFusedGradients) {
  Program main, startup;
  std::vector<std::pair<std::string, std::string>> pairs;
  {
    ProgramGuard guard(main, startup);
    Var loss = testing::AmpMlpLoss();
    fleet::init();
    fleet::DistributedStrategy s;
    s.gradient_merge = true;
    s.gradient_merge_configs.k_steps = 2;
    s.fuse_gemm_epilogue = true;
    for (const auto& pg :
         fleet::distributed_optimizer(optimizer::SGD(0.1f), s).minimize(loss, &startup))
      pairs.emplace_back(pg.first, pg.second);
  }
  ASSERT_EQ(pairs.size(), 6u);
  int buffers = 0;
  for (const auto& [param, grad] : pairs) {
    EXPECT_NE(fleet::main_program().global_block().FindVar(grad), nullptr) << param << " " << grad;
    const std::string suffix = "@GRAD_MERGED";
    buffers += grad.size() > suffix.size() &&
               grad.compare(grad.size() - suffix.size(), suffix.size(), suffix) == 0;
  }
  EXPECT_EQ(buffers, 4);  // the fc layers'; the layer norm's keep their gradients
}

// A merge buffer that holds nothing (cleared after startup): the op names itself and the var.
TEST(FuseGradAccumulation, ABufferWithNothingToAddIntoIsAnErrorNamingIt) {
  Model m;
  optimizer::SGD sgd(0.1f);
  Build(m, sgd);
  ASSERT_FALSE(Fused(m).empty());
  Executor exe;
  exe.Run(m.startup);
  exe.scope().FindVar("fc_0.w_0@GRAD@GRAD_MERGED")->mutable_tensor()->clear();
  const std::string e =
      testing::ErrorOf([&] { exe.Run(m.main, testing::AmpMlpBatch(0), {m.loss.name()}); });
  testing::ExpectErrorContainsAll(
      e, {"fused_gemm_epilogue_grad", "'fc_0.w_0@GRAD@GRAD_MERGED'", "accumulate_into", "nothing"});
}

}  // namespace
}  // namespace keel
