// AMP O2 (amp_configs.level = "O2"): parameters that forward reads in low precision become
// float16/bfloat16 parameters with float32 masters "<param>.master"; the optimizer updates the
// masters in float32 (multi_precision) and writes both. Golden programs; the invariant that every
// parameter is its master rounded, step after step; training that follows float32's; a resume
// that continues bit for bit; data-parallel startup broadcasting the masters; refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
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
#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "framework/runtime/float16.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
#include "tests/util/subprocess.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/amp_pass.h"

namespace keel {
namespace {

using testing::ErrorOf;
using testing::ExpectErrorContainsAll;

struct Model {
  Program main, startup;
  Var loss;
  std::unique_ptr<amp::MixedPrecisionOptimizer> opt;
};

// x[-1, 6] -> fc(8, relu) -> layer_norm -> fc(3) -> softmax_with_cross_entropy -> mean.
// `c` nullptr: float32 with `inner`.
void Build(Model& m, const optimizer::Optimizer& inner, const amp::AmpConfig* c) {
  ProgramGuard guard(m.main, m.startup);
  m.main.set_random_seed(5);
  m.startup.set_random_seed(5);
  m.loss = testing::AmpMlpLoss();
  if (c == nullptr) {
    inner.Clone()->minimize(m.loss);
    return;
  }
  m.opt = std::make_unique<amp::MixedPrecisionOptimizer>(inner, *c);
  m.opt->minimize(m.loss);
}

amp::AmpConfig O2(DType dtype = DType::kBFloat16) {
  amp::AmpConfig c;
  c.dtype = dtype;
  c.level = "O2";
  c.check_kernels = false;  // the lists alone: the same program on every machine
  return c;
}

int Count(const Program& p, const std::string& type) {
  int n = 0;
  for (auto& op : p.global_block().ops()) n += op->type() == type;
  return n;
}

TEST(AmpO2, MlpAdamBf16ProgramsMatchGolden) {
  Model m;
  amp::AmpConfig c = O2();
  Build(m, optimizer::Adam(1e-2f), &c);
  testing::ExpectGolden(m.main.ToText(), "amp_o2_bf16_mlp_train.txt");
  testing::ExpectGolden(m.startup.ToText(), "amp_o2_bf16_mlp_startup.txt");
  const Block& b = m.main.global_block();
  // The fc weights and biases are bfloat16 with float32 masters; layer_norm's stay float32.
  for (const char* p : {"fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"}) {
    EXPECT_EQ(b.MustFindVar(p)->dtype(), DType::kBFloat16) << p;
    const VarDesc* master = b.FindVar(transpiler::AmpMasterName(p));
    ASSERT_NE(master, nullptr) << p;
    EXPECT_EQ(master->dtype(), DType::kFloat32);
    EXPECT_TRUE(master->persistable());
    EXPECT_EQ(m.opt->master_params().at(p), transpiler::AmpMasterName(p));
  }
  for (const VarDesc* v : b.AllVars()) {
    if (!v->is_parameter() || v->name().rfind("layer_norm", 0) != 0) continue;
    EXPECT_EQ(v->dtype(), DType::kFloat32) << v->name();
    EXPECT_EQ(b.FindVar(transpiler::AmpMasterName(v->name())), nullptr) << v->name();
  }
  // No per-step cast of a low-precision parameter is left; each update reads its master.
  for (auto& op : b.ops()) {
    if (op->type() == "cast") {
      EXPECT_EQ(m.opt->master_params().count(op->Input("X")[0]), 0u) << op->ToText();
    }
    if (op->type() != "adam") continue;
    const std::string& p = op->Input("Param")[0];
    const bool low = b.MustFindVar(p)->dtype() == DType::kBFloat16;
    EXPECT_EQ(op->HasInput("MasterParam") && !op->Input("MasterParam").empty(), low) << p;
    EXPECT_EQ(b.MustFindVar(op->Input("Moment1")[0])->dtype(), DType::kFloat32) << p;
  }
  EXPECT_EQ(Count(m.startup, "cast"), 4);
}

// Every low-precision parameter equals its master rounded after every step (startup casts it
// so, each update writes both); the loss follows float32 training of the same model.
TEST(AmpO2, ParamsStayTheirMastersRoundedAndTrainingFollowsFloat32) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    Model f32, low;
    Build(f32, optimizer::Adam(1e-2f), nullptr);
    amp::AmpConfig c = O2(dtype);
    c.check_kernels = true;  // this machine's kernels decide: it runs
    Build(low, optimizer::Adam(1e-2f), &c);
    ASSERT_FALSE(low.opt->master_params().empty());
    Executor ef, el;
    ef.Run(f32.startup);
    el.Run(low.startup);
    float lf = 0, ll = 0, first = 0;
    for (int step = 0; step < 60; ++step) {
      // One batch again and again: a loss that training can drive down.
      lf = ef.Run(f32.main, testing::AmpMlpBatch(0), {f32.loss.name()})[0].item<float>();
      ll = el.Run(low.main, testing::AmpMlpBatch(0), {low.loss.name()})[0].item<float>();
      if (step == 0) first = lf;
      for (const auto& [p, master] : low.opt->master_params()) {
        const Tensor& pt = el.scope().FindVar(p)->tensor();
        const Tensor& mt = el.scope().FindVar(master)->tensor();
        ASSERT_EQ(pt.dtype(), dtype);
        for (int64_t i = 0; i < pt.numel(); ++i) {
          const float m = mt.data<float>()[i];
          const uint16_t want = dtype == DType::kBFloat16 ? bfloat16(m).bits : float16(m).bits;
          const uint16_t got =
              dtype == DType::kBFloat16 ? pt.data<bfloat16>()[i].bits : pt.data<float16>()[i].bits;
          ASSERT_EQ(got, want) << p << "[" << i << "] step " << step;
        }
      }
    }
    EXPECT_LT(lf, 0.6f * first) << "float32 did not train";
    // Forward in 16 bits: the losses agree to a few 16-bit roundings.
    EXPECT_NEAR(ll, lf, 0.05f * std::abs(lf) + 0.02f);
  }
}

// 2k steps in one go, and k steps + a checkpoint + a fresh process-like executor that loads it +
// k steps, end bit for bit equal (masters, low-precision parameters, accumulators, loss-scaling
// state). The checkpoint holds each master under "<param>.master" and the parameter in 16 bits.
TEST(AmpO2, CheckpointResumeIsBitIdentical) {
  const std::string dir = testing::MakeTempDir();
  struct Case {
    DType dtype;
    bool momentum;
  };
  for (Case cs : {Case{DType::kBFloat16, false}, Case{DType::kBFloat16, true},
                  Case{DType::kFloat16, false}}) {
    SCOPED_TRACE(std::string(DTypeName(cs.dtype)) + (cs.momentum ? " momentum" : " adam"));
    amp::AmpConfig c = O2(cs.dtype);
    c.check_kernels = true;
    if (cs.dtype == DType::kFloat16) c.incr_every_n_steps = 3;  // the scale moves meanwhile
    std::unique_ptr<optimizer::Optimizer> inner;
    if (cs.momentum) {
      inner = std::make_unique<optimizer::Momentum>(0.05f, 0.9f);
    } else {
      inner = std::make_unique<optimizer::Adam>(1e-2f);
    }
    const int k = 7;
    Model whole, half;
    Build(whole, *inner, &c);
    Build(half, *inner, &c);
    Executor a;
    a.Run(whole.startup);
    for (int s = 0; s < 2 * k; ++s) a.Run(whole.main, testing::AmpMlpBatch(s));
    Executor b;
    b.Run(half.startup);
    for (int s = 0; s < k; ++s) b.Run(half.main, testing::AmpMlpBatch(s));
    const std::string ckpt = dir + "/" + DTypeName(cs.dtype) + (cs.momentum ? "m" : "a");
    save_persistables(b.scope(), ckpt, half.main);
    const NamedTensors saved = LoadSafetensors(ckpt + "/" + kPersistablesFile);
    bool has_master = false;
    for (const auto& [name, t] : saved)
      if (name == "fc_0.w_0.master") has_master = t.dtype() == DType::kFloat32;
    EXPECT_TRUE(has_master);
    Executor r;
    r.Run(half.startup);
    load_persistables(r.scope(), ckpt, half.main);
    for (int s = k; s < 2 * k; ++s) r.Run(half.main, testing::AmpMlpBatch(s));
    const auto x = testing::PersistableBytes(whole.main, a),
               y = testing::PersistableBytes(half.main, r);
    ASSERT_EQ(x.size(), y.size());
    for (const auto& [name, bytes] : x) EXPECT_TRUE(bytes == y.at(name)) << name;
  }
  testing::RunCommand("rm -rf " + dir);
}

// Data parallel: startup broadcasts each master from rank 0 right before its parameter, so that
// every rank's master is rank 0's and the parameter is it rounded.
TEST(AmpO2, DataParallelStartupBroadcastsTheMasters) {
  Model m;
  amp::AmpConfig c = O2();
  Build(m, optimizer::SGD(0.1f), &c);
  fleet::DistributedStrategy s;
  s.amp = true;
  s.amp_configs = c;
  s.amp_configs.check_kernels = true;  // a strategy leaves it at its default
  fleet::Transpile(m.main, m.startup, s, testing::TwoOfFour());
  std::vector<std::string> order;
  for (auto& op : m.startup.global_block().ops())
    if (op->type() == "c_broadcast") order.push_back(op->Input("X")[0]);
  auto at = [&](const std::string& v) {
    return std::find(order.begin(), order.end(), v) - order.begin();
  };
  for (const char* p : {"fc_0.w_0", "fc_1.w_0"}) {
    ASSERT_LT(at(transpiler::AmpMasterName(p)), static_cast<long>(order.size())) << p;
    EXPECT_EQ(at(transpiler::AmpMasterName(p)) + 1, at(p)) << p;
  }
  // The gradients all-reduced are the low-precision ones: no cast of a gradient to float32.
  int low_allreduces = 0;
  for (auto& op : m.main.global_block().ops()) {
    if (op->type() != "c_allreduce_sum") continue;
    low_allreduces +=
        m.main.global_block().MustFindVar(op->Input("X")[0])->dtype() == DType::kBFloat16;
  }
  EXPECT_GT(low_allreduces, 0);
}

TEST(AmpO2, CombinationsThatCannotWorkAreRefusedNamingBoth) {
  amp::AmpConfig c = O2();
  {
    Model m;
    optimizer::SGD sgd(0.1f);
    sgd.set_grad_clip({1.0f});
    EXPECT_NE(ErrorOf([&] {
                Build(m, sgd, &c);
              }).find("amp_configs.level=O2 does not combine with the optimizer's gradient clip"),
              std::string::npos);
  }
  {
    Model m;
    optimizer::Momentum mom(0.1f, 0.9f);
    mom.set_weight_decay(1e-4f);
    EXPECT_NE(ErrorOf([&] { Build(m, mom, &c); })
                  .find("amp_configs.level=O2 does not combine with the optimizer's L2 weight "
                        "decay"),
              std::string::npos);
  }
  const fleet::Role role = testing::TwoOfFour();
  struct Case {
    std::function<void(fleet::DistributedStrategy*)> set;
    const char* other;
  } cases[] = {
      {[](auto* s) { s->use_local_sgd = true; }, "DistributedStrategy.use_local_sgd=true"},
      {[](auto* s) { s->sharding = true; }, "DistributedStrategy.sharding=true"},
      {[](auto* s) { s->gradient_merge = true; }, "DistributedStrategy.gradient_merge=true"},
      {[](auto* s) { s->recompute = true; }, "DistributedStrategy.recompute=true"},
  };
  for (const Case& k : cases) {
    fleet::DistributedStrategy s;
    s.amp = true;
    s.amp_configs.level = "O2";
    k.set(&s);
    ExpectErrorContainsAll(ErrorOf([&] { s.Validate(role); }),
                           {"amp_configs.level=O2 does not combine with", k.other});
  }
}

}  // namespace
}  // namespace keel
