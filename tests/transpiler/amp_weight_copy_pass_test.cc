// AmpWeightCopyPass: AMP O1's weight casts kept from step to step, written by the updates.
// Golden programs; training bit for bit equal to the O1 program that casts at every step (SGD,
// Momentum, Adam, AdamW; bfloat16 and float16) with every copy its weight rounded; what the pass
// leaves alone (clips, weight decay, loss scaling, a weight a black op also reads, gradient merge,
// LocalSGD, sharding); data-parallel startup making the copy after rank 0's broadcast.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "fleet/distributed_strategy.h"
#include "fleet/transpile.h"
#include "framework/dsl/amp.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/runtime/float16.h"
#include "tests/util/golden.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/amp_weight_copy_pass.h"
#include "transpiler/grad_allreduce_pass.h"

namespace keel {
namespace {

struct Model {
  Program main, startup;
  Var loss;
};

// x[-1, 6] -> fc(8, relu) -> layer_norm -> fc(3) -> softmax_with_cross_entropy -> mean, AMP O1
// (`c`) with `inner`. `black_reader`: the loss also adds mean(fc_1.w_0), which reads the weight
// in float32 beside its cast.
void Build(Model& m, const optimizer::Optimizer& inner, const amp::AmpConfig& c,
           bool black_reader = false) {
  ProgramGuard guard(m.main, m.startup);
  m.main.set_random_seed(5);
  m.startup.set_random_seed(5);
  m.loss = testing::AmpMlpLoss();
  if (black_reader) {
    Var w(&m.main.global_block(), "fc_1.w_0");
    m.loss = layers::elementwise_add(m.loss, layers::mean(w));
  }
  amp::MixedPrecisionOptimizer(inner, c).minimize(m.loss);
}

amp::AmpConfig O1(DType dtype = DType::kBFloat16) {
  amp::AmpConfig c;
  c.dtype = dtype;
  c.level = "O1";
  c.use_dynamic_loss_scaling = false;  // float16 too: no loss scaling (it reads every gradient)
  return c;
}

std::vector<std::string> Copied(Model& m) {
  transpiler::AmpWeightCopyPass pass;
  pass.Apply(m.main, m.startup);
  return pass.copied();
}

bool AnyMaster(const Program& p) {
  for (int b = 0; b < p.num_blocks(); ++b)
    for (auto& op : p.block(b).ops())
      if (!op->Input("MasterParam").empty()) return true;
  return false;
}

TEST(AmpWeightCopy, MlpSgdProgramsMatchGolden) {
  Model m;
  Build(m, optimizer::SGD(0.1f), O1());
  EXPECT_EQ(Copied(m), (std::vector<std::string>{"fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"}));
  testing::ExpectGolden(m.main.ToText(), "amp_weight_copy_bf16_mlp_train.txt");
  testing::ExpectGolden(m.startup.ToText(), "amp_weight_copy_bf16_mlp_startup.txt");
  const Block& b = m.main.global_block();
  for (const char* w : {"fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"}) {
    const std::string c = std::string(w) + ".cast_bf16";
    EXPECT_TRUE(b.MustFindVar(c)->persistable()) << c;
    EXPECT_EQ(b.MustFindVar(w)->dtype(), DType::kFloat32) << w;
    EXPECT_TRUE(b.MustFindVar(w)->is_parameter()) << w;
    EXPECT_EQ(b.FindVar(std::string(w) + "@GRAD"), nullptr) << w;
  }
  // No cast of a weight, no cast_grad: the layer norm's parameters, read in float32, keep their
  // plain updates.
  for (auto& op : b.ops()) {
    if (op->type() == "cast") {
      EXPECT_EQ(op->Input("X")[0].find(".w_0"), std::string::npos);
    }
    if (op->type() == "cast_grad") {
      EXPECT_EQ(op->Output("X@GRAD")[0].find(".w_0"), std::string::npos) << op->ToText();
    }
    if (op->type() == "sgd" && op->Input("Param")[0].rfind("layer_norm", 0) == 0) {
      EXPECT_TRUE(op->Input("MasterParam").empty()) << op->ToText();
    }
  }
  // What fleet reads back from the rewritten program, and the casts an inference export restores.
  const std::vector<transpiler::WeightCopy> found = transpiler::FindWeightCopies(m.main);
  ASSERT_EQ(found.size(), 4u);
  EXPECT_EQ(found[0].weight, "fc_0.w_0");
  EXPECT_EQ(found[0].copy, "fc_0.w_0.cast_bf16");
  EXPECT_EQ(found[0].grad, "fc_0.w_0.cast_bf16@GRAD");
  std::unique_ptr<Program> restored = m.main.Clone();
  transpiler::RestoreWeightCasts(*restored);
  const Block& rb = restored->global_block();
  EXPECT_FALSE(rb.MustFindVar("fc_0.w_0.cast_bf16")->persistable());
  ASSERT_EQ(rb.op(0)->type(), "cast");
  EXPECT_EQ(rb.op(0)->Input("X")[0], "x");  // the input's cast stays first
  EXPECT_EQ(rb.op(1)->type(), "cast");
  EXPECT_EQ(rb.op(1)->Input("X")[0], "fc_0.w_0");
  // Applied again it finds nothing (its own output is not matched).
  Model again;
  Build(again, optimizer::SGD(0.1f), O1());
  Copied(again);
  EXPECT_TRUE(Copied(again).empty());
}

// With and without the pass: the same losses and persistables, bit for bit, step after step; each
// kept copy is its weight rounded after every step. Fails when an update reads the 16-bit
// gradient otherwise than cast_grad widened it, or writes a copy that is not the weight rounded.
TEST(AmpWeightCopy, TrainsBitForBitAsTheCastingProgram) {
  const auto opts = testing::TrainingOptimizers();
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const auto& [name, make] : opts) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + name);
      Model plain, kept;
      Build(plain, *make(), O1(dtype));
      Build(kept, *make(), O1(dtype));
      const std::vector<std::string> copied = Copied(kept);
      ASSERT_EQ(copied.size(), 4u);
      Executor a, b;
      a.Run(plain.startup);
      b.Run(kept.startup);
      for (int step = 0; step < 6; ++step) {
        const Tensor la = a.Run(plain.main, testing::AmpMlpBatch(step), {plain.loss.name()})[0];
        const Tensor lb = b.Run(kept.main, testing::AmpMlpBatch(step), {kept.loss.name()})[0];
        ASSERT_EQ(std::memcmp(la.raw_data(), lb.raw_data(), sizeof(float)), 0)
            << "step " << step << ": " << la.item<float>() << " vs " << lb.item<float>();
        for (const std::string& w : copied) {
          const Tensor& wt = b.scope().FindVar(w)->tensor();
          const Tensor& ct =
              b.scope()
                  .FindVar(w + (dtype == DType::kBFloat16 ? ".cast_bf16" : ".cast_fp16"))
                  ->tensor();
          for (int64_t i = 0; i < wt.numel(); ++i) {
            const float v = wt.data<float>()[i];
            const uint16_t want = dtype == DType::kBFloat16 ? bfloat16(v).bits : float16(v).bits;
            const uint16_t got = dtype == DType::kBFloat16 ? ct.data<bfloat16>()[i].bits
                                                           : ct.data<float16>()[i].bits;
            ASSERT_EQ(got, want) << w << "[" << i << "] step " << step;
          }
        }
      }
      const auto x = testing::PersistableBytes(plain.main, a),
                 y = testing::PersistableBytes(kept.main, b);
      EXPECT_EQ(y.size(), x.size() + copied.size());
      for (const auto& [var, bytes] : x) EXPECT_TRUE(bytes == y.at(var)) << var;
    }
  }
}

TEST(AmpWeightCopy, LeavesAloneWeightsOtherOpsTouch) {
  {
    SCOPED_TRACE("global-norm clip reads every gradient");
    Model m;
    optimizer::SGD sgd(0.1f);
    sgd.set_grad_clip({1.0f});
    Build(m, sgd, O1());
    EXPECT_TRUE(Copied(m).empty());
  }
  {
    SCOPED_TRACE("L2 weight decay reads every gradient");
    Model m;
    optimizer::Momentum mom(0.1f, 0.9f);
    mom.set_weight_decay(1e-4f);
    Build(m, mom, O1());
    EXPECT_TRUE(Copied(m).empty());
  }
  {
    SCOPED_TRACE("loss scaling unscales every gradient");
    Model m;
    amp::AmpConfig c = O1(DType::kFloat16);
    c.use_dynamic_loss_scaling.reset();  // float16's default: dynamic scaling
    Build(m, optimizer::SGD(0.1f), c);
    EXPECT_TRUE(Copied(m).empty());
  }
  {
    SCOPED_TRACE("a weight read in float32 beside its cast");
    Model m;
    Build(m, optimizer::SGD(0.1f), O1(), /*black_reader=*/true);
    const std::vector<std::string> copied = Copied(m);
    EXPECT_EQ(std::count(copied.begin(), copied.end(), "fc_1.w_0"), 0);
    EXPECT_EQ(std::count(copied.begin(), copied.end(), "fc_0.w_0"), 1);
  }
  // Through fleet: gradient merge accumulates the gradients, LocalSGD and sharding write the
  // weights; plain data parallelism keeps the copies.
  struct Case {
    const char* what;
    std::function<void(fleet::DistributedStrategy*)> set;
    bool copies;
  } cases[] = {
      {"data parallel", [](auto*) {}, true},
      {"gradient merge", [](auto* s) { s->gradient_merge = true; }, false},
      {"local sgd",
       [](auto* s) {
         s->use_local_sgd = true;
         s->fuse_all_reduce_ops = false;
       },
       false},
      {"sharding", [](auto* s) { s->sharding = true; }, false},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    Model m;
    Build(m, optimizer::SGD(0.1f), O1());
    fleet::DistributedStrategy s;
    s.amp = true;
    s.amp_configs = O1();
    k.set(&s);
    if (s.gradient_merge) s.gradient_merge_configs.k_steps = 2;
    fleet::Transpile(m.main, m.startup, s, testing::TwoOfFour());
    EXPECT_EQ(AnyMaster(m.main), k.copies);
  }
}

// A write to the fused gradient buffer between the casts back and the updates (here a scale of
// the whole buffer, as an unscale or a clip of it would be) changes the copies' gradients that
// the updates would read: no weight of that buffer gets a copy. Fails when the pass checks only
// the slices' own names.
TEST(AmpWeightCopy, AWriteToTheFusedBufferBeforeTheUpdatesKeepsTheCasts) {
  Model m;
  Build(m, optimizer::SGD(0.1f), O1());
  fleet::DistributedStrategy s;
  s.amp = true;
  s.amp_configs = O1();
  s.fuse_all_reduce_ops = true;
  const fleet::Role role = testing::TwoOfFour();
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, role)).Apply(m.main, m.startup);
  Block& b = m.main.global_block();
  size_t first_update = b.num_ops();
  std::vector<std::string> fused;  // every fused buffer (the 16-bit and the float32 group)
  for (size_t i = 0; i < b.num_ops(); ++i) {
    if (b.op(i)->type() == "coalesce_tensor") fused.push_back(b.op(i)->Output("FusedOutput")[0]);
    if (b.op(i)->type() == "sgd" && first_update == b.num_ops()) first_update = i;
  }
  ASSERT_FALSE(fused.empty());
  ASSERT_LT(first_update, b.num_ops());
  for (const std::string& f : fused) {
    OpDesc* scale = b.InsertOp(first_update, "scale");
    scale->SetInput("X", {f});
    scale->SetOutput("Out", {f});
    scale->SetAttr("scale", 0.5f);
    scale->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kOptimize));
  }
  transpiler::AmpWeightCopyPass pass;
  pass.Apply(m.main, m.startup);
  EXPECT_TRUE(pass.copied().empty());
}

// Data parallel: startup makes each copy after rank 0's broadcast of its weight, so that every
// rank's copy is rank 0's weight rounded; the stream sync before the updates waits on the
// all-reduced 16-bit gradient the updates read.
TEST(AmpWeightCopy, DataParallelStartupCopiesTheBroadcastWeights) {
  Model m;
  Build(m, optimizer::SGD(0.1f), O1());
  fleet::DistributedStrategy s;
  s.amp = true;
  s.amp_configs = O1();
  fleet::Transpile(m.main, m.startup, s, testing::TwoOfFour());
  const Block& sb = m.startup.global_block();
  for (const char* w : {"fc_0.w_0", "fc_1.w_0"}) {
    size_t broadcast = sb.num_ops(), cast = sb.num_ops();
    for (size_t i = 0; i < sb.num_ops(); ++i) {
      const OpDesc& op = *sb.op(i);
      if (op.type() == "c_broadcast" && op.Input("X")[0] == w) broadcast = i;
      if (op.type() == "cast" && op.Input("X")[0] == w) cast = i;
    }
    ASSERT_LT(broadcast, sb.num_ops()) << w;
    ASSERT_LT(cast, sb.num_ops()) << w;
    EXPECT_LT(broadcast, cast) << w;
  }
  const Block& b = m.main.global_block();
  for (auto& op : b.ops()) {
    if (op->type() == "c_sync_comm_stream") {
      EXPECT_EQ(b.MustFindVar(op->Input("X")[0])->dtype(), DType::kBFloat16) << op->ToText();
    }
    if (op->type() == "sgd" && !op->Input("MasterParam").empty()) {
      EXPECT_EQ(b.MustFindVar(op->Input("Grad")[0])->dtype(), DType::kBFloat16) << op->ToText();
    }
  }
}

}  // namespace
}  // namespace keel
