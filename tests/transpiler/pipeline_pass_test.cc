// PipelinePass as program text (golden files: each stage of a 2-stage MLP, main and startup), the
// sections its programs split into, and its refusals; DistributedStrategy's pipeline checks.
#include <gtest/gtest.h>

#include "framework/dsl/amp.h"

#include "fleet/distributed_strategy.h"
#include "fleet/fleet.h"
#include "fleet/pipeline_runner.h"
#include "fleet/transpile.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/pipeline.h"
#include "framework/dsl/tensor_parallel.h"
#include "framework/ir/op_device.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
#include "transpiler/pipeline_pass.h"
#include "transpiler/tensor_parallel_pass.h"

namespace keel {
namespace {

// x -> fc 6 tanh (stage 0) -> fc 3 softmax, cross entropy, mean (stage 1); SGD.
Var BuildTwoStageMlp(Program& main, Program& startup, bool mark_all = true) {
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 4});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h;
  {
    PipelineStageGuard s(0);
    h = layers::fc(x, 6, "tanh");
  }
  Var loss;
  {
    PipelineStageGuard s(mark_all ? 1 : 0);
    loss = layers::mean(layers::cross_entropy(layers::fc(h, 3, "softmax"), y));
  }
  optimizer::SGD(0.1f).minimize(loss, &startup);
  return loss;
}

transpiler::PipelineOptions Stage(int stage) {
  transpiler::PipelineOptions o;
  o.degree = 2;
  o.stage = stage;
  o.micro_batches = 4;
  o.group = "pp:dp0.tp0";
  return o;
}

int Count(const Program& p, const std::string& type) {
  int n = 0;
  for (const auto& op : p.global_block().ops()) n += op->type() == type;
  return n;
}

TEST(PipelinePass, Pp2MlpStagesMatchGolden) {
  for (int stage = 0; stage < 2; ++stage) {
    Program main, startup;
    BuildTwoStageMlp(main, startup);
    transpiler::PipelinePass(Stage(stage)).Apply(main, startup);
    const std::string name = "pipeline_pp2_stage" + std::to_string(stage);
    testing::ExpectGolden(main.ToText(), name + "_main.txt");
    testing::ExpectGolden(startup.ToText(), name + "_startup.txt");
    // One activation forward, its gradient back; each stage's own two parameters.
    EXPECT_EQ(Count(main, "send_v2"), 1);
    EXPECT_EQ(Count(main, "recv_v2"), 1);
    EXPECT_EQ(Count(main, "sgd"), 2);
    EXPECT_EQ(Count(startup, "c_comm_init"), 1);
    int params = 0;
    for (VarDesc* v : main.global_block().AllVars()) params += v->is_parameter();
    EXPECT_EQ(params, 2);
    // The sections: forward, backward, optimizer in order.
    Executor exe;
    fleet::PipelineRunner runner(exe, main, {2, stage, 4, 0, true});
    EXPECT_GT(runner.forward_section().global_block().num_ops(), 0u);
    EXPECT_GT(runner.backward_section().global_block().num_ops(), 0u);
    EXPECT_EQ(Count(runner.optimizer_section(), "sgd"), 2);
  }
}

// Float16 loss scaling: the scaled loss is the last stage's forward op; every stage checks only
// its own gradients (their accumulators) for overflow and takes the maximum of the stages' flags
// on the pipeline ring before the scale's update and the updates that skip on it.
TEST(PipelinePass, Fp16LossScalingChecksEachStagesGradientsAndAgreesOnTheFlagGolden) {
  for (int stage = 0; stage < 2; ++stage) {
    Program main, startup;
    {
      ProgramGuard guard(main, startup);
      Var x = layers::data("x", {-1, 4});
      Var y = layers::data("y", {-1, 1}, DType::kInt64);
      Var h, loss;
      {
        PipelineStageGuard s(0);
        h = layers::fc(x, 6, "tanh");
      }
      {
        PipelineStageGuard s(1);
        loss = layers::mean(layers::cross_entropy(layers::fc(h, 3, "softmax"), y));
      }
      amp::AmpConfig c;
      c.dtype = DType::kFloat16;
      c.check_kernels = false;
      amp::decorate(optimizer::SGD(0.1f), c).minimize(loss, &startup);
    }
    transpiler::PipelinePass(Stage(stage)).Apply(main, startup);
    testing::ExpectGolden(main.ToText(),
                          "pipeline_pp2_fp16_stage" + std::to_string(stage) + "_main.txt");
    int checks = 0;
    for (const auto& op : main.global_block().ops()) {
      if (op->type() != "check_finite_and_unscale") continue;
      ++checks;
      // This stage's two accumulators only.
      ASSERT_EQ(op->Input("X").size(), 2u);
      for (const std::string& g : op->Input("X"))
        EXPECT_NE(g.find(stage == 0 ? "fc_0" : "fc_1"), std::string::npos) << g;
    }
    EXPECT_EQ(checks, 1);
    EXPECT_EQ(Count(main, "c_allreduce_max"), 1);
    EXPECT_EQ(Count(main, "update_loss_scaling"), 1);
  }
}

// A stage holds part of the model: fleet gathers a complete checkpoint of the programs its
// minimize made (tests/fleet/pipeline_parallel_test.cc) and refuses a stage made by hand, whose
// place in the pipeline it does not know, naming the setting (the transfers declare ShardsModel),
// for saving and loading alike.
TEST(PipelinePass, AHandMadeStageProgramsCheckpointIsRefusedNamingThePipeline) {
  Program main, startup;
  BuildTwoStageMlp(main, startup);
  transpiler::PipelinePass(Stage(0)).Apply(main, startup);
  Executor exe;
  for (const bool save : {true, false})
    testing::ExpectErrorContainsAll(testing::ErrorOf([&] {
                                      if (save)
                                        fleet::save_persistables(exe, "/nonexistent/ck", &main);
                                      else
                                        fleet::load_persistables(exe, "/nonexistent/ck", &main);
                                    }),
                                    {"checkpoint", "model-parallel", "op send_v2",
                                     "DistributedStrategy.pipeline", "minimize did not make it"});
}

// Stages of tensor-parallel groups: the model's own tensor-parallel collectives (ring 32) stay on
// the stage that builds them, and each stage keeps its shards' c_split in startup; any other
// collective before the pass is refused, naming the op.
TEST(PipelinePass, KeepsEachStagesTensorParallelCollectivesAndRefusesOthers) {
  for (int stage = 0; stage < 2; ++stage) {
    Program main, startup;
    {
      ProgramGuard guard(main, startup);
      TensorParallelGuard tp({2, 1, transpiler::kTensorParallelRingId});
      Var x = layers::data("x", {-1, 4});
      Var y = layers::data("y", {-1, 1}, DType::kInt64);
      Var h;
      {
        PipelineStageGuard s(0);
        h = layers::fc(layers::fc(x, 6, "tanh", 1, {}, {}, true, layers::Parallel::kColumn), 4, "",
                       1, {}, {}, true, layers::Parallel::kRow);
      }
      Var loss;
      {
        PipelineStageGuard s(1);
        Var g = layers::fc(layers::fc(h, 6, "tanh", 1, {}, {}, true, layers::Parallel::kColumn), 3,
                           "", 1, {}, {}, true, layers::Parallel::kRow);
        loss = layers::mean(layers::cross_entropy(layers::softmax(g), y));
      }
      optimizer::SGD(0.1f).minimize(loss, &startup);
    }
    transpiler::PipelinePass(Stage(stage)).Apply(main, startup);
    SCOPED_TRACE("stage " + std::to_string(stage));
    // Forward: one c_identity before the column layer and one mp_allreduce_sum after the row
    // layer; their gradients run in backward.
    EXPECT_EQ(Count(main, "c_identity"), 1);
    EXPECT_EQ(Count(main, "mp_allreduce_sum"), 1);
    EXPECT_EQ(Count(main, "send_v2"), 1);
    EXPECT_EQ(Count(main, "recv_v2"), 1);
    EXPECT_EQ(Count(startup, "c_split"), 3);  // this stage's 2 weights and the column bias
    for (const auto& op : main.global_block().ops()) {
      if (op->type() == "c_identity" || op->type() == "mp_allreduce_sum") {
        EXPECT_EQ(op->Attr<int>("ring_id"), transpiler::kTensorParallelRingId);
      }
    }
  }
  Program main, startup;
  BuildTwoStageMlp(main, startup);
  OpDesc* ar = main.global_block().InsertOp(0, "c_allreduce_sum");
  ar->SetInput("X", {"x"});
  ar->SetOutput("Out", {"x"});
  ar->SetAttr("ring_id", 0);
  ar->SetAttr(kOpDeviceAttr, std::string("stage:0"));
  testing::ExpectErrorContainsAll(
      testing::ErrorOf([&] { transpiler::PipelinePass(Stage(0)).Apply(main, startup); }),
      {"c_allreduce_sum", "is a collective"});
}

TEST(PipelinePass, ScalesTheLossGradientByOneOverMicroBatches) {
  Program main, startup;
  BuildTwoStageMlp(main, startup);
  transpiler::PipelinePass(Stage(1)).Apply(main, startup);
  int found = 0;
  for (const auto& op : main.global_block().ops())
    if (op->type() == "fill_constant" && op->Attr<int>(kOpRoleAttr) == 257) {
      EXPECT_FLOAT_EQ(op->Attr<float>("value"), 0.25f);
      ++found;
    }
  EXPECT_EQ(found, 1);
}

// On a GPU the pipeline's ring is host-staged (buffered transfers; NCCL's send and receive meet
// inside the streams, where crossing sends wait on each other); a CPU ring has no such attribute.
TEST(PipelinePass, AStageOnAGpuMakesItsRingHostStaged) {
  for (int device : {-1, 0}) {
    Program main, startup;
    BuildTwoStageMlp(main, startup);
    transpiler::PipelineOptions o = Stage(0);
    o.device = device;
    transpiler::PipelinePass(o).Apply(main, startup);
    int inits = 0;
    for (const auto& op : startup.global_block().ops()) {
      if (op->type() != "c_comm_init") continue;
      ++inits;
      EXPECT_EQ(op->Attr<int>("device_id"), device);
      EXPECT_EQ(op->Attr<bool>("host_staged"), device >= 0) << device;
    }
    EXPECT_EQ(inits, 1);
  }
  // host_staged on a ring for CPU tensors would do nothing: refused, naming it.
  Program startup;
  OpDesc* init = startup.global_block().AppendOp("c_comm_init");
  init->SetAttr("ring_id", 33);
  init->SetAttr("nranks", 2);
  init->SetAttr("rank", 0);
  init->SetAttr("device_id", -1);
  init->SetAttr("group", std::string());
  init->SetAttr("host_staged", true);
  Executor exe;
  try {
    exe.Run(startup);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host_staged"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("device_id is -1"), std::string::npos) << e.what();
  }
}

TEST(PipelinePass, RefusesUnmarkedOpsAndStageCountsOtherThanTheDegree) {
  {
    Program main, startup;
    {
      ProgramGuard guard(main, startup);
      Var loss = layers::mean(layers::fc(layers::data("x", {-1, 4}), 3));
      optimizer::SGD(0.1f).minimize(loss, &startup);
    }
    testing::ExpectErrorContainsAll(
        testing::ErrorOf([&] { transpiler::PipelinePass(Stage(0)).Apply(main, startup); }),
        {"pipeline: forward op", "outside every stage", "PipelineStageGuard"});
  }
  {
    Program main, startup;
    BuildTwoStageMlp(main, startup, /*mark_all=*/false);
    testing::ExpectErrorContainsAll(
        testing::ErrorOf([&] { transpiler::PipelinePass(Stage(0)).Apply(main, startup); }),
        {"stages {0}", "pipeline_configs.pp_degree=2"});
  }
  {
    // A parameter read by two stages (shared weights).
    Program main, startup;
    {
      ProgramGuard guard(main, startup);
      Var x = layers::data("x", {-1, 4});
      Var w = layers::create_parameter({4, 4}, DType::kFloat32, "shared", "w", ParamAttr(),
                                       initializer::Constant(0.1f));
      Var h, loss;
      {
        PipelineStageGuard s(0);
        h = layers::matmul(x, w);
      }
      {
        PipelineStageGuard s(1);
        loss = layers::mean(layers::matmul(h, w));
      }
      optimizer::SGD(0.1f).minimize(loss, &startup);
    }
    testing::ExpectErrorContainsAll(
        testing::ErrorOf([&] { transpiler::PipelinePass(Stage(0)).Apply(main, startup); }),
        {"parameter 'shared", "stages 0 and 1"});
  }
}

TEST(PipelineStrategy, RefusesWhatItDoesNotBuildNamingBothFields) {
  fleet::Role role;
  role.world_size = 4;
  // Pipeline of 2 stages plus `change`, validated on `world` workers.
  auto error_on = [&](int world, auto change) {
    fleet::Role r = role;
    r.world_size = world;
    fleet::DistributedStrategy s;
    s.pipeline = true;
    s.pipeline_configs.pp_degree = 2;
    change(&s);
    return testing::ErrorOf([&] { s.Validate(r); });
  };
  auto error = [&](auto change) { return error_on(4, change); };
  testing::ExpectErrorContainsAll(error([](auto* s) { s->pipeline_configs.pp_degree = 3; }),
                                  {"pipeline_configs.pp_degree=3", "world_size=4"});
  testing::ExpectErrorContainsAll(error([](auto* s) { s->pipeline_configs.pp_degree = 1; }),
                                  {"pipeline_configs.pp_degree=1", ">= 2"});
  testing::ExpectErrorContainsAll(
      error([](auto* s) { s->pipeline_configs.schedule_mode = "interleaved"; }),
      {"schedule_mode='interleaved'"});
  testing::ExpectErrorContainsAll(error([](auto* s) { s->pipeline_configs.accumulate_steps = 0; }),
                                  {"accumulate_steps=0"});
  // Recompute inside the stages.
  EXPECT_EQ(error([](auto* s) { s->recompute = true; }), "");
  // Stages of tensor-parallel groups: when the degrees' product divides the world.
  EXPECT_EQ(error([](auto* s) {
              s->tensor_parallel = true;
              s->tensor_parallel_configs.tensor_parallel_degree = 2;
            }),
            "");
  {
    fleet::Role six;
    six.world_size = 6;
    fleet::DistributedStrategy s;
    s.pipeline = true;
    s.pipeline_configs.pp_degree = 2;
    s.tensor_parallel = true;
    s.tensor_parallel_configs.tensor_parallel_degree = 2;
    testing::ExpectErrorContainsAll(
        testing::ErrorOf([&] { s.Validate(six); }),
        {"pipeline_configs.pp_degree=2", "tensor_parallel_configs.tensor_parallel_degree=2",
         "world_size=6"});
  }
  // ZeRO-1 over each stage's data-parallel replicas; refused without replicas.
  EXPECT_EQ(error([](auto* s) { s->sharding = true; }), "");
  testing::ExpectErrorContainsAll(
      error_on(2, [](auto* s) { s->sharding = true; }),
      {"sharding=true", "pipeline_configs.pp_degree=2", "one data-parallel replica"});
  auto degree = [](int d) {
    return [d](auto* s) {
      s->sharding = true;
      s->sharding_configs.sharding_degree = d;
    };
  };
  EXPECT_EQ(error(degree(2)), "");
  testing::ExpectErrorContainsAll(
      error(degree(4)), {"sharding_configs.sharding_degree=4", "data-parallel degree (2)"});
  testing::ExpectErrorContainsAll(error([](auto* s) { s->use_local_sgd = true; }),
                                  {"pipeline=true", "use_local_sgd=true"});
  testing::ExpectErrorContainsAll(error([](auto* s) { s->gradient_merge = true; }),
                                  {"pipeline=true", "gradient_merge=true"});
  // AMP, with loss scaling too (the stages agree on the overflow flag through the pipeline ring).
  EXPECT_EQ(error([](auto* s) { s->amp = true; }), "");
  EXPECT_EQ(error([](auto* s) {
              s->amp = true;
              s->amp_configs.dtype = DType::kFloat16;
            }),
            "");
  // Sync batch norm: with data-parallel replicas of the stages (4 workers, 2 stages), not
  // without.
  EXPECT_EQ(error([](auto* s) { s->sync_batch_norm = true; }), "");
  testing::ExpectErrorContainsAll(
      error_on(2, [](auto* s) { s->sync_batch_norm = true; }),
      {"sync_batch_norm=true", "pipeline_configs.pp_degree=2", "one data-parallel replica"});
  // Fusion groups the accumulators' once-per-mini-batch all-reduces.
  EXPECT_EQ(error([](auto* s) { s->fuse_all_reduce_ops = true; }), "");
  // Pipeline and its settings alone are accepted.
  EXPECT_EQ(error([](auto* s) { s->pipeline_configs.schedule_mode = "F-then-B"; }), "");
}

TEST(PipelineTopology, StagesAreThePpCoordinateAndGroupsGetTheirRing) {
  fleet::Role role;
  role.world_size = 4;
  fleet::DistributedStrategy s;
  s.pipeline = true;
  s.pipeline_configs.pp_degree = 2;
  s.pipeline_configs.accumulate_steps = 3;
  std::string seen;
  for (int r = 0; r < 4; ++r) {
    role.rank = r;
    const transpiler::PipelineOptions o = fleet::PipelineOptionsFor(s, role);
    seen += StrCat(r, ":", o.stage, "/", o.group, " ");
    EXPECT_EQ(o.degree, 2);
    EXPECT_EQ(o.micro_batches, 3);
    EXPECT_EQ(fleet::RingOptionsFor(s, role).nranks, 2);
  }
  EXPECT_EQ(seen, "0:0/pp:dp0.tp0 1:1/pp:dp0.tp0 2:0/pp:dp1.tp0 3:1/pp:dp1.tp0 ");
}

}  // namespace
}  // namespace keel
