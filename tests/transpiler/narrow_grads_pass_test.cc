// NarrowGradsPass: fp16_allreduce in bfloat16 without its casts. Golden programs after the
// data-parallel pass (the fused fc's gradients in a bfloat16 buffer all-reduced as it is, the
// layer norm's float32 ones cast around theirs as before); training bit for bit equal to the
// program that rounds each of those gradients through a cast and back (what fp16_allreduce's
// casts do to it), for SGD, Momentum, Nesterov, Adam and AdamW; what the pass leaves alone; and
// fleet running it for bfloat16 on CPU ranks only.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "fleet/distributed_strategy.h"
#include "fleet/transpile.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/error.h"
#include "framework/op/op_registry.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/fuse_gemm_epilogue_pass.h"
#include "transpiler/grad_allreduce_pass.h"
#include "transpiler/narrow_grads_pass.h"

namespace keel {
namespace {

struct Model {
  Program main, startup;
  Var loss;
};

// x[-1, 6] -> fc(8, relu) -> layer_norm -> fc(3) -> softmax_with_cross_entropy -> mean, minimized
// by `opt`; with `fuse`, each fc's mul and bias add as one fused_gemm_epilogue.
void Build(Model& m, optimizer::Optimizer& opt, bool fuse = true) {
  m.loss = testing::MinimizedAmpMlp(m.main, m.startup, opt);
  if (fuse) transpiler::FuseGemmEpiloguePass().Apply(m.main, m.startup);
}

std::vector<std::string> Narrowed(Model& m) {
  transpiler::NarrowGradsPass pass;
  pass.Apply(m.main, m.startup);
  return pass.narrowed();
}

int Count(const Program& p, const std::string& type) {
  int n = 0;
  for (auto& op : p.global_block().ops()) n += op->type() == type;
  return n;
}

const std::vector<std::string> kFcGrads = {"fc_1.b_0@GRAD", "fc_1.w_0@GRAD", "fc_0.b_0@GRAD",
                                           "fc_0.w_0@GRAD"};

// Fused gemm epilogues, then the pass, then the fused data-parallel all-reduce in bfloat16: the
// four fc gradients are bfloat16 where fused_gemm_epilogue_grad writes them, in one bfloat16
// buffer all-reduced with no cast; the layer norm's gradients (layer_norm_grad does not narrow)
// keep float32 and fp16_allreduce's casts around their buffer; the updates of the narrowed ones
// read them as they are and stay unmerged.
TEST(NarrowGrads, MlpDataParallelProgramMatchesGolden) {
  Model m;
  optimizer::SGD sgd(0.1f);
  Build(m, sgd);
  EXPECT_EQ(Narrowed(m), kFcGrads);
  fleet::DistributedStrategy s;
  s.fp16_allreduce = true;
  s.fp16_allreduce_configs.dtype = DType::kBFloat16;
  s.fuse_all_reduce_ops = true;
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, testing::TwoOfFour()))
      .Apply(m.main, m.startup);
  testing::ExpectGolden(m.main.ToText(), "narrow_grads_bf16_mlp_main.txt");
  const Block& b = m.main.global_block();
  for (const std::string& g : kFcGrads) EXPECT_EQ(b.MustFindVar(g)->dtype(), DType::kBFloat16) << g;
  EXPECT_EQ(b.MustFindVar("layer_norm_0.w_0@GRAD")->dtype(), DType::kFloat32);
  EXPECT_EQ(Count(m.main, "c_allreduce_sum"), 2);
  EXPECT_EQ(Count(m.main, "cast"), 2);  // the layer norm's buffer's, there and back
  for (auto& op : b.ops()) {
    if (op->type() == "cast") {
      EXPECT_EQ(b.MustFindVar(op->Input("X")[0])->shape(), std::vector<int64_t>{16})
          << op->ToText();
    }
  }
}

// Without the fused epilogue: mul_grad narrows each weight gradient, elementwise_add_grad each
// bias gradient.
TEST(NarrowGrads, UnfusedLayersNarrowThroughTheMulAndAddGradients) {
  Model m;
  optimizer::SGD sgd(0.1f);
  Build(m, sgd, /*fuse=*/false);
  EXPECT_EQ(Narrowed(m), kFcGrads);
}

// The reference: after the writer of each gradient the pass narrows, a cast to bfloat16 and back,
// as fp16_allreduce's casts round it on one rank.
void RoundThroughCasts(Model& m, const std::vector<std::string>& grads) {
  Block& b = m.main.global_block();
  for (const std::string& g : grads) {
    size_t writer = b.num_ops();
    for (size_t i = 0; i < b.num_ops(); ++i)
      for (const std::string& out : b.op(i)->OutputArgumentNames())
        if (out == g) writer = i;
    ASSERT_LT(writer, b.num_ops()) << g;
    const std::string low = g + ".round";
    VarDesc* v = b.Var(low);
    v->set_dtype(DType::kBFloat16);
    v->set_shape(b.MustFindVar(g)->shape());
    auto cast = [&](size_t at, const std::string& x, const std::string& out, DType from, DType to) {
      OpDesc* op = b.InsertOp(at, "cast");
      op->SetInput("X", {x});
      op->SetOutput("Out", {out});
      op->SetAttr("in_dtype", static_cast<int>(from));
      op->SetAttr("out_dtype", static_cast<int>(to));
      op->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kBackward));
      InferShapeAtBuild(op, &b);
    };
    cast(writer + 1, g, low, DType::kFloat32, DType::kBFloat16);
    cast(writer + 2, low, g, DType::kBFloat16, DType::kFloat32);
  }
}

// With the pass and with the casts: the same losses and persistables, bit for bit, over 6 steps.
// Fails when a narrowing kernel rounds otherwise than the cast, or an update reads the 16-bit
// gradient otherwise than widened exactly.
TEST(NarrowGrads, TrainsBitForBitAsRoundingEachGradientThroughCasts) {
  const auto opts = testing::TrainingOptimizers();
  for (bool fuse : {true, false}) {
    for (const auto& [name, make] : opts) {
      SCOPED_TRACE(name + (fuse ? " fused epilogue" : " mul and add"));
      Model cast, narrow;
      Build(cast, *make(), fuse);
      Build(narrow, *make(), fuse);
      const std::vector<std::string> grads = Narrowed(narrow);
      ASSERT_FALSE(grads.empty());
      RoundThroughCasts(cast, grads);
      Executor a, b;
      a.Run(cast.startup);
      b.Run(narrow.startup);
      bool moved = false;
      for (int step = 0; step < 6; ++step) {
        const Tensor la = a.Run(cast.main, testing::AmpMlpBatch(step), {cast.loss.name()})[0];
        const Tensor lb = b.Run(narrow.main, testing::AmpMlpBatch(step), {narrow.loss.name()})[0];
        ASSERT_EQ(std::memcmp(la.raw_data(), lb.raw_data(), sizeof(float)), 0)
            << "step " << step << ": " << la.item<float>() << " vs " << lb.item<float>();
        moved = moved || step > 0;
      }
      const auto x = testing::PersistableBytes(cast.main, a),
                 y = testing::PersistableBytes(narrow.main, b);
      EXPECT_EQ(x.size(), y.size());
      for (const auto& [var, bytes] : x) EXPECT_TRUE(bytes == y.at(var)) << var;
      EXPECT_TRUE(moved);
    }
  }
}

TEST(NarrowGrads, LeavesAloneGradientsOtherOpsRead) {
  {
    SCOPED_TRACE("global-norm clip reads every gradient");
    Model m;
    optimizer::SGD sgd(0.1f);
    sgd.set_grad_clip({1.0f});
    Build(m, sgd);
    EXPECT_TRUE(Narrowed(m).empty());
  }
  {
    SCOPED_TRACE("L2 weight decay reads every gradient");
    Model m;
    optimizer::Momentum mom(0.1f, 0.9f);
    mom.set_weight_decay(1e-4f);
    Build(m, mom);
    EXPECT_TRUE(Narrowed(m).empty());
  }
  {
    SCOPED_TRACE("after the all-reduce pass: the collectives read the gradients");
    Model m;
    optimizer::SGD sgd(0.1f);
    Build(m, sgd);
    fleet::DistributedStrategy s;
    transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, testing::TwoOfFour()))
        .Apply(m.main, m.startup);
    EXPECT_TRUE(Narrowed(m).empty());
  }
  {
    SCOPED_TRACE("float16 keeps its casts");
    Model m;
    optimizer::SGD sgd(0.1f);
    Build(m, sgd);
    const std::string e = testing::ErrorOf(
        [&] { transpiler::NarrowGradsPass(DType::kFloat16).Apply(m.main, m.startup); });
    EXPECT_NE(e.find("narrow_grads"), std::string::npos) << e;
    EXPECT_NE(e.find("float16"), std::string::npos) << e;
  }
}

// fleet narrows for fp16_allreduce in bfloat16 on CPU ranks of plain data parallelism: no cast is
// left around the fc's all-reduce. float16, and GPU ranks, keep the casts.
TEST(NarrowGrads, FleetNarrowsBFloat16OnCpuRanksOnly) {
  struct Case {
    const char* what;
    DType dtype;
    bool gpu;
    bool narrowed;
  } cases[] = {{"bfloat16 on CPU", DType::kBFloat16, false, true},
               {"float16 on CPU", DType::kFloat16, false, false},
               {"bfloat16 on GPU", DType::kBFloat16, true, false}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    Model m;
    optimizer::SGD sgd(0.1f);
    Build(m, sgd, /*fuse=*/false);
    fleet::DistributedStrategy s;
    s.fp16_allreduce = true;
    s.fp16_allreduce_configs.dtype = k.dtype;
    fleet::Role role = testing::TwoOfFour();
    if (k.gpu) role.selected_gpus = {0, 1};
    fleet::Transpile(m.main, m.startup, s, role);
    EXPECT_EQ(m.main.global_block().MustFindVar("fc_0.w_0@GRAD")->dtype(),
              k.narrowed ? DType::kBFloat16 : DType::kFloat32);
  }
}

}  // namespace
}  // namespace keel
