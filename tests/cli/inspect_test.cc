// keel inspect --strategy / --summary end to end: the programs one rank of a job runs, printed
// without any worker (golden texts for flat, fused, hierarchical, LocalSGD and AMP O1), --diff
// showing only the transpiler's changes, a saved training __model__ transpiled, and a model summary
// whose parameter count equals the sum over the saved params.safetensors.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/io/checkpoint.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

// stdout only (glog's lines go to stderr).
CommandResult Inspect(const std::string& flags) {
  return RunCommand(Keel() + " inspect " + flags + " 2>/dev/null");
}
// stdout and stderr, for error messages.
CommandResult InspectAll(const std::string& flags) {
  return RunCommand(Keel() + " inspect " + flags);
}

const char* kSmallMlp = " --model=mlp --mlp_hidden=8 --optimizer=sgd";

TEST(InspectStrategy, FlatAllReduceGolden) {
  auto r = Inspect("--strategy --nranks=2 --fuse_all_reduce_ops=false" + std::string(kSmallMlp));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectGolden(r.output, "inspect_strategy_flat.txt");
}

TEST(InspectStrategy, FusedAllReduceGolden) {
  auto r = Inspect(
      "--strategy --nranks=2 --nccl_comm_num=2 --fuse_parameter_memory_size=1 "
      "--fuse_parameter_groups_size=2" +
      std::string(kSmallMlp));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectGolden(r.output, "inspect_strategy_fused.txt");
}

TEST(InspectStrategy, HierarchicalAllReduceGolden) {
  auto r = Inspect(
      "--strategy --nranks=4 --nnodes=2 --rank=3 "
      "--hierarchical_allreduce_inter_nranks=2" +
      std::string(kSmallMlp));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 3 of 4 on 2 node(s)"), std::string::npos) << r.output;
  ExpectGolden(r.output, "inspect_strategy_hierarchical.txt");
}

TEST(InspectStrategy, LocalSgdGolden) {
  auto r = Inspect("--strategy --nranks=2 --local_sgd_steps=4 --local_sgd_warmup_steps=2" +
                   std::string(kSmallMlp));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("conditional_block("), std::string::npos) << r.output;
  ExpectGolden(r.output, "inspect_strategy_local_sgd.txt");
}

// keel's commands fuse each fc layer's mul and bias add (DistributedStrategy.fuse_gemm_epilogue)
// unless told not to; the goldens above show the fused programs a job runs.
TEST(InspectStrategy, FuseGemmEpilogueIsOnByDefaultAndTurnsOff) {
  auto on = Inspect("--strategy --nranks=2" + std::string(kSmallMlp));
  auto off = Inspect("--strategy --nranks=2 --fuse_gemm_epilogue=false" + std::string(kSmallMlp));
  ASSERT_EQ(on.exit_code, 0) << on.output;
  ASSERT_EQ(off.exit_code, 0) << off.output;
  for (const char* op : {"fused_gemm_epilogue(", "fused_gemm_epilogue_grad("}) {
    EXPECT_NE(on.output.find(op), std::string::npos) << on.output;
    EXPECT_EQ(off.output.find(op), std::string::npos) << off.output;
  }
  for (const char* op : {"  mul(", "  mul_grad(", "  elementwise_add_grad("}) {
    EXPECT_EQ(on.output.find(op), std::string::npos) << on.output;
    EXPECT_NE(off.output.find(op), std::string::npos) << off.output;
  }
}

// --tp_degree: rank 1 of tp2 x dp2 holds its shards of the mlp's two hidden layers (column, then
// row), the collectives between them, its data-parallel ring over ranks {1, 3} and its
// tensor-parallel ring over {0, 1}. Every rank's program names its own groups.
TEST(InspectStrategy, TensorParallelGolden) {
  auto r = Inspect("--strategy --nranks=4 --rank=1 --tp_degree=2" + std::string(kSmallMlp));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectGolden(r.output, "inspect_strategy_tensor_parallel.txt");
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE(rank);
    auto each = Inspect("--strategy --program=startup --nranks=4 --tp_degree=2 --rank=" +
                        std::to_string(rank) + std::string(kSmallMlp));
    ASSERT_EQ(each.exit_code, 0) << each.output;
    const std::string tp =
        "group=\"tp:dp" + std::to_string(rank / 2) +
        ".pp0\", host_staged=false, nranks=2, op_role=0, rank=" + std::to_string(rank % 2) +
        ", ring_id=32";
    const std::string dp =
        "group=\"dp:pp0.tp" + std::to_string(rank % 2) +
        "\", host_staged=false, nranks=2, op_role=0, rank=" + std::to_string(rank / 2) +
        ", ring_id=0";
    EXPECT_NE(each.output.find(tp), std::string::npos) << each.output;
    EXPECT_NE(each.output.find(dp), std::string::npos) << each.output;
  }
  // --rank=-1: every rank's programs, one after the other, the same as each alone.
  auto all = Inspect("--strategy --program=startup --nranks=4 --rank=-1 --tp_degree=2" +
                     std::string(kSmallMlp));
  ASSERT_EQ(all.exit_code, 0) << all.output;
  std::string each_in_turn;
  for (int rank = 0; rank < 4; ++rank)
    each_in_turn += Inspect("--strategy --program=startup --nranks=4 --tp_degree=2 --rank=" +
                            std::to_string(rank) + std::string(kSmallMlp))
                        .output;
  EXPECT_EQ(all.output, each_in_turn);
  // A degree that does not divide the job is refused naming the field.
  auto bad = InspectAll("--strategy --nranks=4 --tp_degree=3" + std::string(kSmallMlp));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("tensor_parallel_degree=3 does not divide world_size=4"),
            std::string::npos)
      << bad.output;
}

// The transformer at TP=2, rank 1: its output layer holds classes 6..11 of 12 (a column-parallel
// fc), and the loss and the top-1 are the vocabulary-parallel ops on the tensor-parallel ring; no
// var of the main program is a whole row of logits [-1, 12]. Q, K and V share one c_identity (one
// block), so the layer's attention, feed-forward and the output layer make three, and backward
// three all-reduces of an input gradient, not five.
TEST(InspectStrategy, TensorParallelTransformerGolden) {
  auto r = Inspect(
      "--strategy --program=main --nranks=2 --rank=1 --tp_degree=2 --model=transformer "
      "--vocab=12 --seq_len=4 --d_model=8 --heads=2 --d_ff=8 --layers=1 --dropout=0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("c_softmax_with_cross_entropy(Logits: fc_6.tmp_1, Label: "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("c_top1(X: fc_6.tmp_1)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(", 12]"), std::string::npos) << r.output;
  auto count = [&](const std::string& what) {
    int n = 0;
    for (size_t at = r.output.find(what); at != std::string::npos; at = r.output.find(what, at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(count("  c_identity("), 3) << r.output;
  EXPECT_EQ(count("  c_allreduce_sum("), 3) << r.output;
  ExpectGolden(r.output, "inspect_strategy_tensor_parallel_transformer.txt");
}

// --pp_degree with --tp_degree: rank 3 of 4 is tensor-parallel rank 1 of stage 1: the second
// layer's shards, the vocabulary-parallel loss, the transfers with stage 0's tensor-parallel rank 1
// (pipeline ring "pp:dp0.tp1") and the tensor-parallel collectives of its stage's group
// (ring 32, "tp:dp0.pp1").
TEST(InspectStrategy, PipelineTimesTensorParallelTransformerGolden) {
  const std::string flags =
      "--strategy --nranks=4 --rank=3 --pp_degree=2 --tp_degree=2 --micro_batches=2 "
      "--model=transformer --vocab=12 --seq_len=4 --d_model=8 --heads=2 --d_ff=8 --layers=2 "
      "--dropout=0";
  auto r = Inspect(flags + " --program=main");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectGolden(r.output, "inspect_strategy_pipeline_tensor_parallel_transformer.txt");
  ExpectContainsAll(r.output, {"c_softmax_with_cross_entropy(", "recv_v2() -> (Out: ",
                               "peer=0, ring_id=33", "c_identity(", "ring_id=32"});
  auto startup = Inspect(flags + " --program=startup");
  ASSERT_EQ(startup.exit_code, 0) << startup.output;
  ExpectContainsAll(
      startup.output,
      {"group=\"pp:dp0.tp1\", host_staged=false, nranks=2, op_role=0, rank=1, ring_id=33",
       "group=\"tp:dp0.pp1\", host_staged=false, nranks=2, op_role=0, rank=1, ring_id=32"});
}

// --pp_degree with data parallelism and float16 loss scaling (rank 0: stage 0 of replica 0): the
// replicas all-reduce each gradient accumulator once per mini-batch, first in the optimizer
// section (not each micro-batch's gradients); the overflow check reads this stage's accumulators
// and its flag is the maximum over the pipeline ring (33).
TEST(InspectStrategy, PipelineTimesDataParallelInFloat16Golden) {
  auto r = Inspect(
      "--strategy --nranks=4 --rank=0 --pp_degree=2 --micro_batches=2 --amp=fp16 "
      "--fuse_all_reduce_ops=false" +
      std::string(kSmallMlp));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectGolden(r.output, "inspect_strategy_pipeline_dp_fp16.txt");
  int sums = 0;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    if (line.find("c_allreduce_sum(") == std::string::npos) continue;
    ++sums;
    EXPECT_NE(line.find("@PP_ACC"), std::string::npos) << line;
    EXPECT_NE(line.find("op_role=2"), std::string::npos) << line;  // once per mini-batch
  }
  EXPECT_EQ(sums, 4);  // stage 0's two layers' weights and biases
  EXPECT_NE(r.output.find("c_allreduce_max(X: find_infinite_0@ALLREDUCE_INT)"), std::string::npos);
  EXPECT_NE(r.output.find("ring_id=33"), std::string::npos);
}

// --pp_degree: each rank holds one stage of the mlp (layers 0-1, then layer 2 and the loss), with
// the send_v2 / recv_v2 between them, its gradient accumulators and the pipeline ring (id 33).
TEST(InspectStrategy, PipelineGolden) {
  auto r = Inspect("--strategy --nranks=2 --rank=-1 --pp_degree=2 --micro_batches=2" +
                   std::string(kSmallMlp));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectGolden(r.output, "inspect_strategy_pipeline.txt");
  EXPECT_NE(r.output.find("send_v2(X: tanh.tmp_1)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("recv_v2() -> (Out: tanh.tmp_1)"), std::string::npos) << r.output;
  auto bad = InspectAll("--strategy --nranks=2 --pp_degree=2 --model=ctr");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--pp_degree=2: model ctr places no pipeline stages"),
            std::string::npos)
      << bad.output;
}

// --gradient_merge_k: the merge buffers, the counter and the merge step, whose sub-block holds the
// all-reduces (one per gradient) and the updates; fusion, on by default, steps aside.
TEST(InspectStrategy, GradientMergeGolden) {
  auto r = Inspect("--strategy --nranks=2 --gradient_merge_k=4" + std::string(kSmallMlp));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("gradient_merge=true, gradient_merge_configs={k_steps=4, avg=true}"),
            std::string::npos)
      << r.output;
  ExpectGolden(r.output, "inspect_strategy_gradient_merge.txt");
  // Asked for, fusion is refused naming both settings.
  auto both = InspectAll("--strategy --nranks=2 --gradient_merge_k=4 --fuse_all_reduce_ops" +
                         std::string(kSmallMlp));
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.output.find("gradient_merge=true does not combine with "
                             "DistributedStrategy.fuse_all_reduce_ops=true"),
            std::string::npos)
      << both.output;
}

// --sharding_stage=1 (ZeRO-1): rank 1 of 2 keeps the updates and the state of its own parameters
// only; the gradients go through one reduce-scatter, the parameters come back by broadcast.
TEST(InspectStrategy, ShardingGolden) {
  auto r = Inspect("--strategy --nranks=2 --rank=1 --sharding_stage=1" +
                   std::string(" --model=mlp --mlp_hidden=8 --optimizer=adam"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sharding=true, sharding_configs={stage=1, sharding_degree=0}"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("c_reducescatter("), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("c_allreduce_sum("), std::string::npos) << r.output;
  ExpectGolden(r.output, "inspect_strategy_sharding.txt");
  auto bad = InspectAll("--strategy --nranks=2 --sharding_stage=3" + std::string(kSmallMlp));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("sharding_configs.stage=3 is not built"), std::string::npos)
      << bad.output;
}

// Every "+" line of --diff is a line of the full transpiled text, every "-" line one of the
// untranspiled (one-rank) text, and a one-rank job changes nothing.
// --ps: a parameter-server job of --nservers servers (ranks 0..) and --nworkers trainers; the MLP
// at --mlp_hidden=128 has a first weight of 784 x 128, cut into blocks on both servers.
TEST(InspectStrategy, ParameterServerGoldens) {
  for (int rank : {0, 2}) {
    auto r = Inspect("--strategy --ps --nservers=2 --nworkers=2 --rank=" + std::to_string(rank) +
                     " --model=mlp --mlp_hidden=128 --optimizer=adam");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("a_sync=false"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(rank == 0 ? "listen_and_serv(" : "send_barrier("), std::string::npos)
        << r.output;
    ExpectGolden(r.output, "inspect_strategy_ps_rank" + std::to_string(rank) + ".txt");
  }
  // Asynchronous mode: the server applies one trainer's gradient at a time (mode=1, no sum).
  for (int rank : {0, 2}) {
    auto r = Inspect("--strategy --ps --ps_mode=async --nservers=2 --nworkers=2 --rank=" +
                     std::to_string(rank) + " --model=mlp --mlp_hidden=128 --optimizer=sgd");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("a_sync=true"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("mode=1"), std::string::npos) << r.output;
    ExpectGolden(r.output, "inspect_strategy_ps_async_rank" + std::to_string(rank) + ".txt");
  }
  // GEO every 4 steps: the trainer keeps its optimizer and exchanges deltas (geo_communicate).
  for (int rank : {0, 2}) {
    auto r = Inspect("--strategy --ps --ps_mode=geo --geo_k=4 --nservers=2 --nworkers=2 --rank=" +
                     std::to_string(rank) + " --model=mlp --mlp_hidden=128 --optimizer=sgd");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("a_sync_configs={k_steps=4,"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(rank == 0 ? "@GEO_DELTA" : "geo_communicate("), std::string::npos)
        << r.output;
    ExpectGolden(r.output, "inspect_strategy_ps_geo_rank" + std::to_string(rank) + ".txt");
  }
  auto bad = InspectAll("--strategy --ps --ps_mode=geo --geo_k=0" + std::string(kSmallMlp));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--ps_mode=geo needs --geo_k >= 1"), std::string::npos) << bad.output;
  auto collective = InspectAll("--strategy --ps_mode=sync" + std::string(kSmallMlp));
  EXPECT_NE(collective.output.find("--ps_mode goes with inspect --strategy --ps"),
            std::string::npos)
      << collective.output;
}

// (Without the layer fusion, which rewrites every layer: the data-parallel passes' changes alone.)
TEST(InspectStrategy, DiffShowsOnlyWhatTheTranspilerChanged) {
  const std::string flags = " --nranks=2 --fuse_gemm_epilogue=false" + std::string(kSmallMlp);
  auto full = Inspect("--strategy" + flags);
  auto diff = Inspect("--strategy --diff" + flags);
  auto single =
      Inspect("--strategy --nranks=1 --diff --fuse_gemm_epilogue=false" + std::string(kSmallMlp));
  ASSERT_EQ(diff.exit_code, 0) << diff.output;
  std::istringstream in(diff.output);
  std::string line;
  int added = 0, removed = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '+') {
      ++added;
      EXPECT_NE(full.output.find(line.substr(1) + "\n"), std::string::npos) << line;
    }
    if (line[0] == '-') {  // only the per-parameter updates a merged update replaces
      ++removed;
      EXPECT_EQ(line.rfind("-  sgd(", 0), 0) << line;
    }
  }
  EXPECT_GT(added, 8);  // comm init, broadcasts, coalesce, sync, all-reduce, scale, merged_sgd
  EXPECT_EQ(removed, 6) << diff.output;
  EXPECT_NE(diff.output.find("+  merged_sgd("), std::string::npos) << diff.output;
  EXPECT_NE(diff.output.find("+  c_allreduce_sum("), std::string::npos) << diff.output;
  EXPECT_NE(diff.output.find("+  c_comm_init("), std::string::npos) << diff.output;
  EXPECT_EQ(diff.output.find("+  mul("), std::string::npos) << diff.output;
  ASSERT_EQ(single.exit_code, 0);
  EXPECT_EQ(single.output.find("\n+"), std::string::npos) << single.output;
  EXPECT_NE(single.output.find("(none)"), std::string::npos) << single.output;
}

TEST(InspectStrategy, DotAndOneProgram) {
  auto dot = Inspect("--strategy --dot --program=main --nranks=2" + std::string(kSmallMlp));
  ASSERT_EQ(dot.exit_code, 0) << dot.output;
  EXPECT_NE(dot.output.find("digraph program {"), std::string::npos) << dot.output;
  EXPECT_NE(dot.output.find("c_allreduce_sum"), std::string::npos);
  auto startup = Inspect("--strategy --program=startup --nranks=2" + std::string(kSmallMlp));
  EXPECT_EQ(startup.output.find("---- main program"), std::string::npos);
  EXPECT_NE(startup.output.find("c_broadcast("), std::string::npos);
}

// A training program saved with SaveProgram (what `keel inspect` reads as __model__).
TEST(InspectStrategy, TranspilesASavedTrainingProgram) {
  std::string dir = MakeTempDir();
  {
    Program main, startup;
    ProgramGuard guard(main, startup);
    Var x = layers::data("x", {-1, 4});
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    Var cost = layers::mean(layers::cross_entropy(layers::fc(x, 2, "softmax"), y));
    optimizer::SGD(0.1f).minimize(cost, &startup);
    SaveProgram(main, dir + "/__model__");
    SaveProgram(startup, dir + "/startup");
  }
  auto with_startup = Inspect("--strategy --nranks=3 --fuse_all_reduce_ops=false " + dir +
                              " --startup=" + dir + "/startup");
  ASSERT_EQ(with_startup.exit_code, 0) << with_startup.output;
  EXPECT_NE(with_startup.output.find("# " + dir + "/__model__, rank 0 of 3"), std::string::npos);
  EXPECT_NE(with_startup.output.find("uniform_random("), std::string::npos);
  EXPECT_NE(with_startup.output.find("c_broadcast(X: fc_0.w_0)"), std::string::npos);
  EXPECT_NE(with_startup.output.find("scale=0.333333343"), std::string::npos);
  EXPECT_NE(with_startup.output.find("c_allreduce_sum(X: fc_0.w_0@GRAD)"), std::string::npos);
  // Without the startup program: one declaring main's persistables stands in.
  auto alone = Inspect("--strategy --nranks=3 " + dir + "/__model__");
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  EXPECT_EQ(alone.output.find("uniform_random("), std::string::npos);
  EXPECT_NE(alone.output.find("c_broadcast(X: fc_0.w_0)"), std::string::npos);
  RunCommand("rm -rf " + dir);
}

// --amp: the program minimize builds with mixed precision (AMP O1, the rewrite decided by this
// machine's CPU kernels), one rank, main program only. bfloat16 casts around the white ops and
// has no loss scaling; float16 scales the loss, checks and unscales the gradients, moves the
// scale, counts the skipped steps and skips the updates on overflow.
TEST(InspectStrategy, AmpO1Goldens) {
  struct Case {
    std::string model, amp;
  } cases[] = {{"lenet", "bf16"}, {"resnet", "bf16"}, {"transformer", "bf16"}, {"lenet", "fp16"}};
  for (const Case& c : cases) {
    auto r = Inspect("--strategy --nranks=1 --program=main --model=" + c.model + " --amp=" + c.amp);
    ASSERT_EQ(r.exit_code, 0) << c.model << " " << c.amp << "\n" << r.output;
    const bool fp16 = c.amp == "fp16";
    EXPECT_NE(r.output.find("  cast("), std::string::npos) << c.model << " " << c.amp;
    EXPECT_NE(r.output.find(fp16 ? ": float16[" : ": bfloat16["), std::string::npos) << c.model;
    for (const char* op : {"check_finite_and_unscale(", "update_loss_scaling(", "SkipUpdate: "})
      EXPECT_EQ(r.output.find(op) != std::string::npos, fp16)
          << c.model << " " << c.amp << " " << op;
    ExpectGolden(r.output, "inspect_strategy_amp_" + c.amp + "_" + c.model + ".txt");
  }
}

// --amp_level=O2 (one rank, main program): the weights of the low-precision ops are bfloat16
// parameters with float32 masters that their updates read (MasterParam). --fp16_allreduce=bf16 on
// two ranks (fused, the CLI's default): the fc layers' gradients are made bfloat16 where they are
// computed and their fused buffer (the first) is all-reduced as it is; each fused float32 buffer
// of the others (convolutions, norms) is cast to bfloat16, all-reduced and cast back. On the MLP,
// LeNet, ResNet-20 and the transformer.
TEST(InspectStrategy, AmpO2AndFp16AllReduceGoldens) {
  for (std::string model : {"mlp", "lenet", "resnet", "transformer"}) {
    const std::string size = model == "mlp" ? " --mlp_hidden=8" : "";
    auto o2 = Inspect(
        "--strategy --nranks=1 --program=main --amp=bf16 --amp_level=O2 --model=" + model + size);
    ASSERT_EQ(o2.exit_code, 0) << model << "\n" << o2.output;
    EXPECT_NE(o2.output.find(".master : float32["), std::string::npos) << model;
    EXPECT_NE(o2.output.find("MasterParam: "), std::string::npos) << model;
    EXPECT_NE(o2.output.find(" : bfloat16["), std::string::npos) << model;
    ExpectGolden(o2.output, "inspect_strategy_amp_o2_bf16_" + model + ".txt");
    auto ar = Inspect(
        "--strategy --nranks=2 --program=main --fp16_allreduce=bf16 --model=" + model + size);
    ASSERT_EQ(ar.exit_code, 0) << model << "\n" << ar.output;
    EXPECT_NE(ar.output.find("var @FUSED_GRAD@0 : bfloat16["), std::string::npos) << model;
    EXPECT_NE(ar.output.find("c_allreduce_sum(X: @FUSED_GRAD@0)"), std::string::npos) << model;
    EXPECT_EQ(ar.output.find("cast(X: @FUSED_GRAD@0)"), std::string::npos) << model;
    EXPECT_EQ(ar.output.find("  cast(") == std::string::npos, model == "mlp") << model;
    ExpectGolden(ar.output, "inspect_strategy_fp16_allreduce_bf16_" + model + ".txt");
  }
  // Combinations that cannot work name both settings.
  auto both = InspectAll("--strategy --nranks=2 --fp16_allreduce=bf16 --amp=bf16 --model=mlp");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.output.find("fp16_allreduce=true does not combine with DistributedStrategy.amp"),
            std::string::npos)
      << both.output;
  auto bad = InspectAll("--strategy --nranks=2 --fp16_allreduce=fp8 --model=mlp");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--fp16_allreduce must be off, fp16 or bf16"), std::string::npos)
      << bad.output;
}

// --amp=bf16 (O1) on two ranks (fused, the CLI's default): the bfloat16 gradients that backward
// makes for the weights' casts are what the rings all-reduce (bfloat16 buffers), and their casts
// to float32 run after the all-reduce (Paddle's update_role_var_grad); float32 gradients (batch
// and layer norm parameters) are fused apart, per dtype.
TEST(InspectStrategy, AmpO1DataParallelAllReducesTheSixteenBitGradients) {
  for (std::string model : {"mlp", "resnet", "transformer"}) {
    const std::string size = model == "mlp" ? " --mlp_hidden=8" : "";
    auto r = Inspect("--strategy --nranks=2 --program=main --amp=bf16 --model=" + model + size);
    ASSERT_EQ(r.exit_code, 0) << model << "\n" << r.output;
    EXPECT_NE(r.output.find("var @FUSED_GRAD@0 : bfloat16["), std::string::npos) << model;
    // The updates read the all-reduced 16-bit gradients of the weights' kept copies
    // (transpiler/amp_weight_copy_pass.h): no weight's gradient is cast back.
    const size_t reduce = r.output.find("c_allreduce_sum(X: @FUSED_GRAD@");
    // (The first update that reads a copy's gradient: the line of the first MasterParam.)
    const size_t master = r.output.find("MasterParam: ");
    ASSERT_NE(master, std::string::npos) << model;
    const size_t update = r.output.rfind('\n', master);
    const std::string line = r.output.substr(update, r.output.find('\n', update + 1) - update);
    EXPECT_NE(line.find(".cast_bf16@GRAD, "), std::string::npos) << model << line;
    ASSERT_NE(reduce, std::string::npos) << model;
    EXPECT_LT(reduce, update) << model;
    EXPECT_EQ(r.output.find(".w_0.cast_bf16@GRAD) -> (X@GRAD: "), std::string::npos) << model;
    ExpectGolden(r.output, "inspect_strategy_amp_o1_dp2_bf16_" + model + ".txt");
  }
}

TEST(InspectStrategy, BadJobsAreErrorsNamingTheFlag) {
  struct Case {
    std::string flags, expect;
  } cases[] = {
      {"--strategy --nranks=4 --nnodes=3", "--nnodes=3"},
      {"--strategy --nranks=0", "--nranks"},
      {"--strategy --nranks=2 --rank=2", "--rank=2"},
      {"--strategy --nranks=6 --hierarchical_allreduce_inter_nranks=4", "inter_nranks"},
      {"--strategy --program=both", "--program='both'"},
      {"--strategy --diff --dot", "--diff and --dot"},
      {"--strategy --model=mlp /nonexistent", "--model and a FILE"},
      {"--strategy /nonexistent", "/nonexistent"},
      {"--strategy --startup=/x", "--startup"},
      {"--strategy --local_sgd_warmup_steps=2", "--local_sgd_warmup_steps"},
      {"--strategy --model=vgg", "unknown model 'vgg'"},
      {"--nranks=2 somefile", "--nranks goes with inspect --strategy"},
      {"--strategy --summary", "pick one"},
      {"--strategy --amp=fp8", "--amp must be off, bf16 or fp16, got 'fp8'"},
      {"--strategy --amp_level=O1", "--amp_level applies only to mixed precision"},
      {"--strategy --amp=bf16 /nonexistent", "--amp=bf16 rewrites a program before its backward"},
      {"--strategy --recompute /nonexistent", "--recompute changes a program's backward"},
  };
  for (const Case& c : cases) {
    auto r = InspectAll(c.flags);
    EXPECT_EQ(r.exit_code, 1) << c.flags << "\n" << r.output;
    EXPECT_FALSE(r.signaled) << c.flags;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.flags << "\n" << r.output;
  }
}

// Sum of the element counts in `keel inspect FILE.safetensors`'s "name : dtype[d0, d1]" lines.
int64_t SafetensorsElements(const std::string& path) {
  auto r = Inspect(path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::istringstream in(r.output);
  std::string line;
  int64_t total = 0;
  while (std::getline(in, line)) {
    size_t open = line.find('['), close = line.find(']');
    if (line[0] == '#' || open == std::string::npos) continue;
    int64_t n = 1;
    std::istringstream dims(line.substr(open + 1, close - open - 1));
    std::string d;
    while (std::getline(dims, d, ',')) n *= std::stoll(d);
    total += n;
  }
  return total;
}

int64_t SummaryNumber(const std::string& out, const std::string& label) {
  size_t at = out.find(label);
  EXPECT_NE(at, std::string::npos) << out;
  if (at == std::string::npos) return -1;
  std::string digits;
  for (size_t i = at + label.size(); i < out.size() && out[i] != '\n'; ++i)
    if (std::isdigit(static_cast<unsigned char>(out[i]))) digits += out[i];
  return std::stoll(digits);
}

TEST(InspectSummary, ParameterCountEqualsTheSavedCheckpoint) {
  for (std::string model : {"mlp --mlp_hidden=16", "resnet"}) {
    std::string dir = MakeTempDir();
    auto train = RunCommand(Keel() + " train --model=" + model + " --steps=1 --batch_size=4 " +
                            "--seed=1 --save_inference_dir=" + dir);
    ASSERT_EQ(train.exit_code, 0) << train.output;
    auto s = Inspect("--summary --model=" + model);
    ASSERT_EQ(s.exit_code, 0) << s.output;
    const int64_t saved = SafetensorsElements(dir + "/params.safetensors");
    EXPECT_EQ(SummaryNumber(s.output, "total:"), saved) << model << "\n" << s.output;
    // The saved inference program summarizes to the same numbers.
    auto f = Inspect("--summary " + dir);
    ASSERT_EQ(f.exit_code, 0) << f.output;
    EXPECT_EQ(SummaryNumber(f.output, "total:"), saved) << f.output;
    if (model == "resnet") {
      EXPECT_GT(SummaryNumber(s.output, "state not trained:"), 0) << s.output;  // BN statistics
      EXPECT_NE(s.output.find("flops conv2d"), std::string::npos);
    }
    RunCommand("rm -rf " + dir);
  }
}

// Programs read from files are whatever the file says: a mul whose y_num_col_dims is 2^31 - 1 (it
// read past Y's shape: SIGSEGV) and a conv2d with no filters (a division by zero) summarize
// without a crash; a device with no end (/dev/zero) is read to a limit, then refused.
TEST(InspectSummary, HostileProgramsAndEndlessFilesNeverCrashIt) {
  const std::string dir = MakeTempDir();
  Program p;
  Block& b = p.global_block();
  auto var = [&](const std::string& name, std::vector<int64_t> shape) {
    VarDesc* v = b.Var(name);
    v->set_dtype(DType::kFloat32);
    v->set_shape(shape);
  };
  var("x", {-1, 4});
  var("w", {4, 3});
  var("y", {-1, 3});
  OpDesc* mul = b.AppendOp("mul");
  mul->SetInput("X", {"x"});
  mul->SetInput("Y", {"w"});
  mul->SetOutput("Out", {"y"});
  mul->SetAttr("x_num_col_dims", 1);
  mul->SetAttr("y_num_col_dims", 2147483647);
  var("img", {-1, 3, 8, 8});
  var("filter", {0, 3, 3, 3});
  var("conv", {-1, 0, 6, 6});
  OpDesc* conv = b.AppendOp("conv2d");
  conv->SetInput("Input", {"img"});
  conv->SetInput("Filter", {"filter"});
  conv->SetOutput("Output", {"conv"});
  SaveProgram(p, dir + "/__model__");
  auto r = InspectAll("--summary " + dir + "/__model__");
  EXPECT_FALSE(r.signaled) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("flops mul"), std::string::npos) << r.output;
  auto zero = InspectAll("/dev/zero");
  EXPECT_FALSE(zero.signaled) << zero.output;
  EXPECT_EQ(zero.exit_code, 1) << zero.output;
  EXPECT_NE(zero.output.find("/dev/zero: holds more than"), std::string::npos) << zero.output;
  RunCommand("rm -rf " + dir);
}

TEST(InspectSummary, FlopsOfTheMlpAreTwoPerMultiplyAdd) {
  const int64_t h = 16;
  auto s = Inspect("--summary --model=mlp --mlp_hidden=16");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(SummaryNumber(s.output, "flops mul"), 2 * (32 * h + h * h + h * 2)) << s.output;
  EXPECT_EQ(SummaryNumber(s.output, "trainable parameters:"), 32 * h + h + h * h + h + h * 2 + 2);
  EXPECT_NE(s.output.find("fc_1.w_0"), std::string::npos);
}

}  // namespace
}  // namespace keel::testing
