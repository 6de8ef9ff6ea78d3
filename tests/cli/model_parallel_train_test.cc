// keel train under pipeline and tensor parallelism (--pp_degree, --tp_degree) keeps everything
// else working, end to end through keel launch with real processes: the checkpoint is complete
// (one process resumes from it, and it holds the single-device names), --auto_resume continues
// exactly (the final checkpoint equals an uninterrupted run's, bit for bit), a worker killed under
// --max_restarts restarts the job from its last checkpoint to the same end, a pipeline evaluates
// (--eval_every) as one process does, and a profile of a pipeline shows its point-to-point
// transfers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "executor/executor_io.h"
#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "framework/op/op_registry.h"
#include "tests/util/op_test_util.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

// "step N loss X" lines of keel train's console, by step.
std::map<int, std::string> LossLines(const std::string& text) {
  std::map<int, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("step ", 0) != 0) continue;
    std::istringstream words(line);
    std::string w, loss;
    int step = -1;
    words >> w >> step >> w >> loss;
    if (step >= 0 && w == "loss") out[step] = loss;
  }
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// How one process that resumes from the job's checkpoint compares with the job: the same losses to
// the digit (the pipeline sums in the same order), to 1e-4 (tensor parallelism's all-reduces round
// differently), or not at all (batch norm: one process normalizes over the whole batch, the
// pipeline over each micro-batch).
enum class OneProcess { kExact, kNear, kOtherBatchNorm };

// `parallel`: the flags that make the job model-parallel on 2 workers (one process drops them);
// `shared`: other flags, which one process keeps too.
void ExpectCheckpointsWork(const std::string& model, const std::string& parallel,
                           OneProcess one_process, int nproc = 2, const std::string& shared = "") {
  const std::string dir = MakeTempDir();
  const std::string train = " train " + model +
                            " --optimizer=adam --seed=5 --batch_size=8 --progress=lines " + shared +
                            " ";
  const std::string env = "FLAGS_cpu_math_threads=1 ";
  auto launch = [&](const std::string& log, const std::string& flags) {
    return RunCommand(env + Keel() + " launch --nproc_per_node=" + std::to_string(nproc) +
                      " --log_dir=" + dir + "/" + log + " " + Keel() + train + parallel + " " +
                      flags + " 2>&1");
  };
  auto straight = launch("l1", "--steps=10 --save_dir=" + dir + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::map<int, std::string> want = LossLines(straight.output);
  ASSERT_EQ(want.size(), 10u) << straight.output;

  // Six steps, then the rest from the checkpoint: the end is the uninterrupted run's.
  auto half = launch("l2", "--steps=6 --save_dir=" + dir + "/resumed");
  ASSERT_EQ(half.exit_code, 0) << half.output;
  // One process loads the job's checkpoint (single-device names, whole tensors) and trains on
  // from step 6 on the same data.
  auto one = RunCommand(env + Keel() + train + "--steps=10 --load_dir=" + dir +
                        "/resumed --save_dir=" + dir + "/one 2>&1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_TRUE(Contains(one.output, "resumed from " + dir + "/resumed at step 6")) << one.output;
  const std::map<int, std::string> got_one = LossLines(one.output);
  for (int s = 6; s < 10; ++s) {
    ASSERT_TRUE(got_one.count(s)) << one.output;
    if (one_process == OneProcess::kExact) {
      EXPECT_EQ(got_one.at(s), want.at(s)) << "step " << s;
    } else if (one_process == OneProcess::kNear) {
      EXPECT_NEAR(std::atof(got_one.at(s).c_str()), std::atof(want.at(s).c_str()), 1e-4)
          << "step " << s;
    }
  }
  std::map<std::string, std::string> job = CheckpointTensorBytes(dir + "/straight"),
                                     single = CheckpointTensorBytes(dir + "/one");
  ASSERT_EQ(job.size(), single.size());
  for (auto a = job.begin(), b = single.begin(); a != job.end(); ++a, ++b) {
    EXPECT_EQ(a->first, b->first);
    EXPECT_EQ(a->second.size(), b->second.size()) << a->first;
  }
  auto resumed = launch("l3", "--steps=10 --auto_resume --save_dir=" + dir + "/resumed");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(Contains(resumed.output, "resumed from " + dir + "/resumed at step 6"))
      << resumed.output;
  const std::map<int, std::string> got = LossLines(resumed.output);
  for (int s = 6; s < 10; ++s) EXPECT_EQ(got.count(s) ? got.at(s) : "", want.at(s)) << s;
  EXPECT_EQ(CheckpointTensorBytes(dir + "/resumed"), job);

  // Rank 1 killed during step 7: keel launch restarts both, they resume from step 6's checkpoint
  // and end where the uninterrupted run ends.
  auto restarted =
      RunCommand(env + "KEEL_FAULT_POINT=trainer_step_7@1 " + Keel() +
                 " launch --nproc_per_node=" + std::to_string(nproc) +
                 " --max_restarts=1 --log_dir=" + dir + "/l4 " + Keel() + train + parallel +
                 " --steps=10 --save_every=2 --save_dir=" + dir + "/restarted 2>&1");
  ASSERT_EQ(restarted.exit_code, 0) << restarted.output;
  EXPECT_TRUE(Contains(restarted.output, "keel launch: restart 1 of 1: worker rank 1"))
      << restarted.output;
  EXPECT_TRUE(Contains(restarted.output, "resumed from " + dir + "/restarted at step 6"))
      << restarted.output;
  EXPECT_EQ(CheckpointTensorBytes(dir + "/restarted"), job);
  RunCommand("rm -rf " + dir);
}

TEST(KeelTrainModelParallel, PipelineCheckpointsResumeAndRestartExactly) {
  ExpectCheckpointsWork("--model=mlp --mlp_hidden=16", "--pp_degree=2 --micro_batches=4",
                        OneProcess::kExact);
}

// ResNet-20's stages hold convolutions and batch norms, whose running statistics are persistables
// of the stage that computes them.
TEST(KeelTrainModelParallel, ResnetPipelineCheckpointsResumeAndRestartExactly) {
  ExpectCheckpointsWork("--model=resnet", "--pp_degree=2 --micro_batches=2",
                        OneProcess::kOtherBatchNorm);
}

// The transformer's stages hold embeddings, attention, layer norms and the output layer.
TEST(KeelTrainModelParallel, TransformerPipelineCheckpointsResumeAndRestartExactly) {
  ExpectCheckpointsWork("--model=transformer", "--pp_degree=2 --micro_batches=4",
                        OneProcess::kNear);
}

TEST(KeelTrainModelParallel, TensorParallelCheckpointsResumeAndRestartExactly) {
  ExpectCheckpointsWork("--model=mlp --mlp_hidden=16", "--tp_degree=2", OneProcess::kNear);
}

// ResNet-20's tensor-parallel variant: each block's convolutions split by channels, the first
// block's batch norm sharded with them (its moving statistics too).
TEST(KeelTrainModelParallel, ResnetTensorParallelCheckpointsResumeAndRestartExactly) {
  ExpectCheckpointsWork("--model=resnet", "--tp_degree=2", OneProcess::kNear);
}

// The transformer's tensor-parallel variant: column and row layers, a vocabulary-parallel
// embedding (rows split), replicated layer norms.
TEST(KeelTrainModelParallel, TransformerTensorParallelCheckpointsResumeAndRestartExactly) {
  ExpectCheckpointsWork("--model=transformer", "--tp_degree=2", OneProcess::kNear);
}

// Tensor parallelism with gradient merge, saved mid-accumulation (6 steps of k=4): the merge
// buffers of sharded parameters are joined like their parameters, so one process resumes the
// accumulation, and the job resumes it exactly.
TEST(KeelTrainModelParallel, TransformerTensorParallelGradientMergeCheckpointsResumeExactly) {
  ExpectCheckpointsWork("--model=transformer", "--tp_degree=2", OneProcess::kNear, 2,
                        "--gradient_merge_k=4");
}

// Pipeline stages of tensor-parallel groups (4 processes): the checkpoint joins each stage's
// shards into the single-device tensors.
TEST(KeelTrainModelParallel, TransformerPipelineTimesTensorParallelCheckpointsResumeExactly) {
  ExpectCheckpointsWork("--model=transformer", "--pp_degree=2 --micro_batches=4 --tp_degree=2",
                        OneProcess::kNear, 4);
}

// The float32 tensors of the checkpoint in `dir`, by name.
std::map<std::string, Tensor> FloatTensors(const std::string& dir) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : LoadSafetensors(dir + "/" + kPersistablesFile))
    if (t.dtype() == DType::kFloat32) out[name] = t;
  return out;
}

// The largest difference of `got`'s tensors from `want`'s, relative (to at least 1e-3), and how
// many tensors were compared; every tensor of `got` must be in `want`, with its element count.
double MaxRelativeDifference(const std::map<std::string, Tensor>& got,
                             const std::map<std::string, Tensor>& want, int* compared,
                             std::string* worst_name = nullptr) {
  double worst_rel = 0;
  *compared = 0;
  for (const auto& [name, t] : got) {
    auto it = want.find(name);
    EXPECT_NE(it, want.end()) << name << " is not in the other checkpoint";
    if (it == want.end()) continue;
    EXPECT_EQ(it->second.numel(), t.numel()) << name;
    if (it->second.numel() != t.numel()) continue;
    const float* a = t.data<float>();
    const float* b = it->second.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double rel = std::abs(static_cast<double>(a[i]) - b[i]) /
                         std::max(1e-3, std::abs(static_cast<double>(b[i])));
      if (rel > worst_rel && worst_name) *worst_name = name;
      worst_rel = std::max(worst_rel, rel);
    }
    ++*compared;
  }
  return worst_rel;
}

// The transformer on 2 pipeline stages of 2 tensor-parallel ranks each (4 processes): every
// stage's tensor-parallel group runs its column/row-parallel layers, the stages exchange what
// crosses the cut rank by rank (tensor-parallel rank t of one stage with rank t of the next), and
// the checkpoint joins each stage's shards. Every float tensor of it (parameters, momentum
// velocities) equals one process's at the same batch to float rounding, under both schedules, and
// the losses agree. (Not Adam: the attention's key bias has a gradient of zero up to rounding,
// which Adam's normalization turns into updates of the learning rate's size in either run.)
TEST(KeelTrainModelParallel, TransformerPipelineTimesTensorParallelEqualsOneProcess) {
  const std::string dir = MakeTempDir();
  const std::string env = "FLAGS_cpu_math_threads=1 ";
  const std::string train =
      " train --model=transformer --dropout=0 --optimizer=momentum --seed=5 --batch_size=8 "
      "--steps=4 --progress=lines ";
  auto one = RunCommand(env + Keel() + train + "--save_dir=" + dir + "/one 2>&1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::map<int, std::string> one_losses = LossLines(one.output);
  ASSERT_EQ(one_losses.size(), 4u) << one.output;
  const std::map<std::string, Tensor> want = FloatTensors(dir + "/one");
  for (const char* sched : {"1f1b", "fthenb"}) {
    auto job = RunCommand(env + Keel() + " launch --nproc_per_node=4 --log_dir=" + dir + "/log_" +
                          sched + " " + Keel() + train +
                          "--pp_degree=2 --tp_degree=2 --micro_batches=2 --pp_schedule=" + sched +
                          " --save_dir=" + dir + "/" + sched + " 2>&1");
    ASSERT_EQ(job.exit_code, 0) << job.output;
    const std::map<int, std::string> losses = LossLines(job.output);
    ASSERT_EQ(losses.size(), 4u) << job.output;
    double worst_loss = 0;
    for (const auto& [step, loss] : losses)
      worst_loss = std::max(
          worst_loss, std::abs(std::atof(loss.c_str()) - std::atof(one_losses.at(step).c_str())));
    int compared = 0;
    const std::map<std::string, Tensor> got = FloatTensors(dir + "/" + sched);
    std::string worst;
    const double worst_rel = MaxRelativeDifference(got, want, &compared, &worst);
    std::printf(
        "transformer PP=2 x TP=2 (%s) against one process: %d tensors, max relative difference "
        "%.3g (%s), max loss difference %.3g over 4 steps\n",
        sched, compared, worst_rel, worst.c_str(), worst_loss);
    EXPECT_EQ(got.size(), want.size()) << sched;
    EXPECT_EQ(compared, static_cast<int>(want.size())) << sched;
    EXPECT_GE(compared, 70) << sched;  // 36 parameters and their velocities
    EXPECT_LT(worst_rel, 5e-4) << sched;
    EXPECT_LT(worst_loss, 2e-5) << sched;
  }
  RunCommand("rm -rf " + dir);
}

// Tensor parallelism with gradient merge (the model's collectives run every micro-step, the
// merge step's updates once per k) and with recompute (a recomputed segment runs its
// tensor-parallel collectives again in backward, as Megatron's activation checkpointing does):
// TP=2 equals one process with the same settings, every float tensor of the checkpoint
// (parameters, velocities, the merge buffers, which are sharded like their parameters) joined
// from the shards, to float rounding. With float16 loss scaling beside gradient merge the
// overflow check sits in the merge step's sub-block and its flag is all-reduced over the group
// there; a row-parallel sum rounds each rank's partial product to 16 bits, so TP=2 follows one
// process within float16's rounding: the same loss scale and skipped steps, the losses to 1e-3.
TEST(KeelTrainModelParallel,
     TransformerTensorParallelWithGradientMergeOrRecomputeEqualsOneProcess) {
  const std::string dir = MakeTempDir();
  const std::string env = "FLAGS_cpu_math_threads=1 ";
  const std::string train =
      " train --model=transformer --dropout=0 --optimizer=momentum --seed=5 --batch_size=8 "
      "--steps=4 --progress=lines ";
  int k = 0;
  for (const std::string flags :
       {"--gradient_merge_k=2", "--recompute", "--gradient_merge_k=2 --amp=fp16"}) {
    SCOPED_TRACE(flags);
    const std::string d = dir + "/" + std::to_string(k++);
    auto one = RunCommand(env + Keel() + train + flags + " --save_dir=" + d + "/one 2>&1");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    auto two = RunCommand(env + Keel() + " launch --nproc_per_node=2 --log_dir=" + d + "/log " +
                          Keel() + train + flags + " --tp_degree=2 --save_dir=" + d + "/two 2>&1");
    ASSERT_EQ(two.exit_code, 0) << two.output;
    const std::map<int, std::string> l1 = LossLines(one.output), l2 = LossLines(two.output);
    ASSERT_EQ(l1.size(), 4u) << one.output;
    ASSERT_EQ(l2.size(), 4u) << two.output;
    double worst_loss = 0;
    for (const auto& [step, loss] : l2)
      worst_loss =
          std::max(worst_loss, std::abs(std::atof(loss.c_str()) - std::atof(l1.at(step).c_str())));
    int compared = 0;
    const std::map<std::string, Tensor> got = FloatTensors(d + "/two"),
                                        want = FloatTensors(d + "/one");
    std::string worst;
    const double worst_rel = MaxRelativeDifference(got, want, &compared, &worst);
    std::printf(
        "transformer TP=2 %s against one process: %d tensors, max relative difference %.3g (%s), "
        "max loss difference %.3g over 4 steps\n",
        flags.c_str(), compared, worst_rel, worst.c_str(), worst_loss);
    EXPECT_EQ(got.size(), want.size());
    EXPECT_EQ(compared, static_cast<int>(want.size()));
    EXPECT_GE(compared, 70);
    if (flags.find("fp16") == std::string::npos) {
      EXPECT_LT(worst_rel, 5e-4);
      EXPECT_LT(worst_loss, 2e-5);
      continue;
    }
    EXPECT_LT(worst_loss, 1e-3);
    int scaling = 0;
    for (const auto& [name, t] : got) {
      if (name.rfind("loss_scaling", 0) && name.rfind("num_skipped_steps", 0)) continue;
      ++scaling;
      EXPECT_EQ(t.data<float>()[0], want.at(name).data<float>()[0]) << name;
    }
    EXPECT_EQ(scaling, 2);
    auto program = RunCommand(Keel() +
                              " inspect --strategy --model=transformer --nranks=2 --tp_degree=2 "
                              "--gradient_merge_k=2 --amp=fp16 --program=main 2>&1");
    ASSERT_EQ(program.exit_code, 0) << program.output;
    const size_t sub = program.output.find("block 1 parent=0");
    ASSERT_NE(sub, std::string::npos) << program.output;
    EXPECT_NE(program.output.find("c_allreduce_max(X: find_infinite_0@ALLREDUCE_INT)", sub),
              std::string::npos)
        << program.output;
  }
  RunCommand("rm -rf " + dir);
}

// Data parallelism beside a pipeline all-reduces each stage's accumulators once per mini-batch;
// fusion (keel train's default) concatenates them into buffers (by default of up to 32 MB and 8
// accumulators), all-reduces each buffer once and splits it back. PP=2 x DP=2 on the transformer:
// fused, unfused and fused in bfloat16 (fp16_allreduce) all train; fused and unfused end bit for
// bit alike, and rank 0's program all-reduces stage 0's 18 accumulators in 3 buffers.
TEST(KeelTrainModelParallel, PipelineTimesDataParallelFusesTheAccumulatorsAllReduces) {
  const std::string dir = MakeTempDir();
  const std::string env = "FLAGS_cpu_math_threads=1 ";
  const std::string train =
      " train --model=transformer --dropout=0 --optimizer=momentum --seed=5 --batch_size=8 "
      "--steps=3 --progress=lines --pp_degree=2 --micro_batches=2 ";
  auto run = [&](const std::string& name, const std::string& flags) {
    auto r =
        RunCommand(env + Keel() + " launch --nproc_per_node=4 --log_dir=" + dir + "/log_" + name +
                   " " + Keel() + train + flags + " --save_dir=" + dir + "/" + name + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r;
  };
  auto fused = run("fused", "");
  auto plain = run("plain", "--fuse_all_reduce_ops=false");
  auto low = run("low", "--fp16_allreduce=bf16");
  EXPECT_EQ(LossLines(fused.output), LossLines(plain.output));
  EXPECT_EQ(CheckpointTensorBytes(dir + "/fused"), CheckpointTensorBytes(dir + "/plain"));
  EXPECT_EQ(LossLines(low.output).size(), 3u) << low.output;
  // Rank 0's program: stage 0's accumulators in buffers of at most 8.
  auto program = RunCommand(Keel() +
                            " inspect --strategy --model=transformer --nranks=4 --pp_degree=2 "
                            "--micro_batches=2 --fuse_all_reduce_ops=true --program=main 2>&1");
  ASSERT_EQ(program.exit_code, 0) << program.output;
  int sums = 0, accs = 0;
  std::istringstream in(program.output);
  for (std::string line; std::getline(in, line);) {
    sums += line.find("c_allreduce_sum(") != std::string::npos;
    accs += line.find("sum(X: [") != std::string::npos && line.find("@PP_ACC") != std::string::npos;
  }
  std::printf("stage 0: %d accumulators, %d all-reduces per mini-batch\n", accs, sums);
  EXPECT_GT(accs, 8);
  EXPECT_EQ(sums, (accs + 7) / 8);
  RunCommand("rm -rf " + dir);
}

// Mixed precision on two pipeline stages: the casts the AMP rewrite inserts take their consumers'
// stages, and the pipeline equals one process that merges the gradients of the same micro-batches
// (--gradient_merge_k=2 at half the batch; 16-bit floats round each micro-batch's products, so
// one process at the whole batch rounds differently): every float tensor of the checkpoint to
// float rounding, the losses to the printed digit. bfloat16 has no loss scaling; float16 scales
// the loss by 2^16 (each micro-batch's by 2^15, a power of two away from the merging run's, so
// the same bits once unscaled), and each stage checks its own gradients, the flag agreed over the
// stages (tests/fleet/pipeline_parallel_test.cc holds that to overflowing steps).
TEST(KeelTrainModelParallel,
     TransformerPipelineInMixedPrecisionEqualsOneProcessMergingItsMicroBatches) {
  const std::string dir = MakeTempDir();
  const std::string env = "FLAGS_cpu_math_threads=1 ";
  for (const std::string amp : {"bf16", "fp16"}) {
    SCOPED_TRACE(amp);
    const std::string d = dir + "/" + amp;
    const std::string train =
        " train --model=transformer --dropout=0 --optimizer=momentum --seed=5 --amp=" + amp +
        " --progress=lines ";
    auto merged = RunCommand(env + Keel() + train + "--batch_size=16 --gradient_merge_k=2 " +
                             "--steps=6 --save_dir=" + d + "/merged 2>&1");
    ASSERT_EQ(merged.exit_code, 0) << merged.output;
    auto pp = RunCommand(
        env + Keel() + " launch --nproc_per_node=2 --log_dir=" + d + "/log " + Keel() + train +
        "--batch_size=32 --pp_degree=2 --micro_batches=2 --steps=3 --save_dir=" + d + "/pp 2>&1");
    ASSERT_EQ(pp.exit_code, 0) << pp.output;
    const std::map<int, std::string> m = LossLines(merged.output), p = LossLines(pp.output);
    ASSERT_EQ(m.size(), 6u) << merged.output;
    ASSERT_EQ(p.size(), 3u) << pp.output;
    double worst_loss = 0;
    for (int s = 0; s < 3; ++s)
      worst_loss = std::max(
          worst_loss,
          std::abs(std::atof(p.at(s).c_str()) -
                   (std::atof(m.at(2 * s).c_str()) + std::atof(m.at(2 * s + 1).c_str())) / 2));
    int compared = 0;
    const std::map<std::string, Tensor> got = FloatTensors(d + "/pp"),
                                        want = FloatTensors(d + "/merged");
    const double worst_rel = MaxRelativeDifference(got, want, &compared);
    std::printf(
        "transformer PP=2 in %s against one process merging 2 micro-batches: %d tensors, max "
        "relative difference %.3g, max loss difference %.3g\n",
        amp.c_str(), compared, worst_rel, worst_loss);
    EXPECT_GE(compared, 70);
    EXPECT_LT(worst_rel, 1e-4);
    EXPECT_LT(worst_loss, 2e-6);
    if (amp == "fp16") {
      // The loss scale and the skipped steps are in the checkpoint (compared above).
      int scaling = 0;
      for (const auto& [name, t] : got)
        if (name.rfind("loss_scaling", 0) == 0 || name.rfind("num_skipped_steps", 0) == 0) {
          ++scaling;
          std::printf("  %s = %g\n", name.c_str(), t.data<float>()[0]);
        }
      EXPECT_EQ(scaling, 2);
      // Stages of tensor-parallel groups (4 processes): the flag is the maximum over each group
      // (ring 32), then over the stages (ring 33). A row-parallel sum rounds each rank's partial
      // product to 16 bits, so the job follows the merging run within float16's rounding: the
      // same loss scale and skipped steps, the losses to 1e-3.
      auto tp = RunCommand(env + Keel() + " launch --nproc_per_node=4 --log_dir=" + d + "/log_tp " +
                           Keel() + train +
                           "--batch_size=32 --pp_degree=2 --tp_degree=2 --micro_batches=2 "
                           "--steps=3 --save_dir=" +
                           d + "/pp_tp 2>&1");
      ASSERT_EQ(tp.exit_code, 0) << tp.output;
      const std::map<int, std::string> t = LossLines(tp.output);
      ASSERT_EQ(t.size(), 3u) << tp.output;
      double tp_loss = 0;
      for (int s = 0; s < 3; ++s)
        tp_loss = std::max(
            tp_loss,
            std::abs(std::atof(t.at(s).c_str()) -
                     (std::atof(m.at(2 * s).c_str()) + std::atof(m.at(2 * s + 1).c_str())) / 2));
      const std::map<std::string, Tensor> joined = FloatTensors(d + "/pp_tp");
      int state = 0;
      for (const auto& [name, v] : joined) {
        if (name.rfind("loss_scaling", 0) && name.rfind("num_skipped_steps", 0)) continue;
        ++state;
        EXPECT_EQ(v.data<float>()[0], want.at(name).data<float>()[0]) << name;
      }
      std::printf(
          "transformer PP=2 x TP=2 in fp16 against the merging run: max loss difference "
          "%.3g\n",
          tp_loss);
      EXPECT_EQ(state, 2);
      EXPECT_LT(tp_loss, 1e-3);
    }
  }
  RunCommand("rm -rf " + dir);
}

// ResNet-20 on two pipeline stages. Batch norm normalizes each micro-batch by its own statistics
// and updates the running ones once per micro-batch, as PyTorch's and Paddle's pipelines do, so the
// pipeline equals one process that merges the gradients of the same micro-batches
// (--gradient_merge_k=M at batch B/M, the same rows in the same order), not one process at batch
// B. Every float tensor of the pipeline's checkpoint (parameters, momentum velocities, running
// means and variances) equals that run's to float rounding, under both schedules.
TEST(KeelTrainModelParallel, ResnetPipelineEqualsOneProcessMergingItsMicroBatches) {
  const std::string dir = MakeTempDir();
  const std::string env = "FLAGS_cpu_math_threads=1 ";
  const std::string train = " train --model=resnet --seed=5 --progress=lines ";
  auto merged = RunCommand(env + Keel() + train + "--batch_size=4 --steps=6 --gradient_merge_k=2 " +
                           "--save_dir=" + dir + "/merged 2>&1");
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  // One process at the whole batch normalizes over 8 rows: another model after 3 steps.
  auto whole = RunCommand(env + Keel() + train + "--batch_size=8 --steps=3 --save_dir=" + dir +
                          "/whole 2>&1");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  auto floats = FloatTensors;
  auto compare = [](const std::map<std::string, Tensor>& got,
                    const std::map<std::string, Tensor>& want,
                    int* compared) { return MaxRelativeDifference(got, want, compared); };
  const std::map<std::string, Tensor> want = floats(dir + "/merged");
  int compared = 0;
  const double batch_norm_differs = compare(floats(dir + "/whole"), want, &compared);
  std::printf(
      "one process at batch 8 against it merging 2 micro-batches of 4: max relative "
      "difference %.3g\n",
      batch_norm_differs);
  EXPECT_GT(batch_norm_differs, 1e-3);
  for (const char* sched : {"1f1b", "fthenb"}) {
    auto pp = RunCommand(env + Keel() + " launch --nproc_per_node=2 --log_dir=" + dir + "/log_" +
                         sched + " " + Keel() + train +
                         "--batch_size=8 --steps=3 --pp_degree=2 --micro_batches=2 --pp_schedule=" +
                         sched + " --save_dir=" + dir + "/" + sched + " 2>&1");
    ASSERT_EQ(pp.exit_code, 0) << pp.output;
    const double worst_rel = compare(floats(dir + "/" + sched), want, &compared);
    std::printf(
        "resnet PP=2 (%s) against one process merging 2 micro-batches: %d tensors, max "
        "relative difference %.3g\n",
        sched, compared, worst_rel);
    // 21 convolutions, 21 batch norms and the fc: 65 parameters, their 65 velocities and 42
    // running statistics.
    EXPECT_GE(compared, 65 + 65 + 42) << sched;
    EXPECT_LT(worst_rel, 1e-4) << sched;
  }
  RunCommand("rm -rf " + dir);
}

// A profile of a pipeline job holds each stage's transfers as comm spans naming the peer: stage 0
// sends activations to rank 1 and receives their gradients from it, stage 1 the reverse.
TEST(KeelTrainModelParallel, AProfileOfAPipelineShowsItsTransfers) {
  const std::string dir = MakeTempDir();
  auto r = RunCommand("FLAGS_cpu_math_threads=1 " + Keel() +
                      " launch --nproc_per_node=2 --log_dir=" + dir + "/log --profile=" + dir +
                      "/t.json " + Keel() +
                      " train --model=mlp --mlp_hidden=16 --steps=2 --batch_size=8 --pp_degree=2 "
                      "--micro_batches=2 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string t0 = ReadFile(dir + "/t.json.rank0"), t1 = ReadFile(dir + "/t.json.rank1");
  for (const char* s :
       {"{\"name\": \"send_v2\", \"cat\": \"comm\"", "\"detail\": \"to rank 1 tag ",
        "{\"name\": \"recv_v2\", \"cat\": \"comm\"", "\"detail\": \"from rank 1 tag "})
    EXPECT_TRUE(Contains(t0, s)) << s << "\n" << t0.substr(0, 2000);
  for (const char* s : {"\"detail\": \"to rank 0 tag ", "\"detail\": \"from rank 0 tag "})
    EXPECT_TRUE(Contains(t1, s)) << s << "\n" << t1.substr(0, 2000);
  RunCommand("rm -rf " + dir);
}

// --save_inference_dir under --pp_degree or --tp_degree: rank 0 gathers the stages or joins the
// shards and writes the single-device forward program with the whole parameters (a
// tensor-parallel program's collectives become copies); loaded in this process, it predicts what
// one process's inference model predicts (trained alike, to float rounding).
void ExpectWholeInferenceModel(const std::string& model, const std::string& parallel,
                               const std::string& tag) {
  const std::string dir = MakeTempDir();
  const std::string train = " train " + model + " --seed=5 --batch_size=8 --steps=3 ";
  auto one = RunCommand("FLAGS_cpu_math_threads=1 " + Keel() + train +
                        "--save_inference_dir=" + dir + "/one 2>&1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto two = RunCommand("FLAGS_cpu_math_threads=1 " + Keel() + " launch --nproc_per_node=2 " +
                        "--log_dir=" + dir + "/log " + Keel() + train + parallel +
                        " --save_inference_dir=" + dir + "/two 2>&1");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  // The mlp's features [4, 32], or the transformer's token ids [4, 8, 1] in [0, 10).
  const bool tokens = Contains(model, "transformer");
  std::vector<float> x(4 * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) / 7.0f - 0.4f;
  std::vector<int64_t> ids(4 * 8);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7) % 10);
  const Tensor feed = tokens ? Tensor::FromVector(ids, {4, 8, 1}) : Tensor::FromVector(x, {4, 32});
  std::vector<std::vector<float>> predicted;
  for (const std::string which : {"one", "two"}) {
    Executor exe(CPUPlace());
    InferenceModel m = load_inference_model(dir + "/" + which, exe);
    ASSERT_EQ(m.feeds.size(), 1u);
    ASSERT_EQ(m.targets.size(), 1u);
    for (const auto& op : m.program->global_block().ops())
      EXPECT_FALSE(OpRegistry::Traits(op->type()).shards_model) << which << ": " << op->type();
    std::vector<Tensor> out = exe.Run(*m.program, {{m.feeds[0], feed}}, m.targets);
    const float* p = out[0].data<float>();
    predicted.emplace_back(p, p + out[0].numel());
  }
  ASSERT_EQ(predicted[0].size(), predicted[1].size());
  double worst = 0;
  for (size_t i = 0; i < predicted[0].size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(predicted[0][i] - predicted[1][i])));
  std::printf("inference models of one process and %s: max |prediction diff| %.3g\n", tag.c_str(),
              worst);
  EXPECT_LT(worst, 1e-5);
  RunCommand("rm -rf " + dir);
}

TEST(KeelTrainModelParallel, APipelineSavesTheWholeInferenceModel) {
  ExpectWholeInferenceModel("--model=mlp --mlp_hidden=16", "--pp_degree=2 --micro_batches=4",
                            "PP=2");
}

TEST(KeelTrainModelParallel, TensorParallelSavesTheWholeInferenceModel) {
  ExpectWholeInferenceModel("--model=mlp --mlp_hidden=16", "--tp_degree=2", "TP=2");
}

// The transformer's shards: column- and row-parallel layers, the vocabulary-parallel embedding
// (c_embedding becomes lookup_table on the whole table).
TEST(KeelTrainModelParallel, TensorParallelTransformerSavesTheWholeInferenceModel) {
  ExpectWholeInferenceModel("--model=transformer", "--tp_degree=2", "transformer TP=2");
}

// "step N test_accuracy A (S test samples)" lines.
std::vector<std::string> EvalLines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("step ", 0) == 0 && Contains(line, " test_accuracy ")) out.push_back(line);
  return out;
}

// --eval_every under --pp_degree: the stages evaluate the test batches together (forward only,
// in inference mode), the last stage computes the accuracy, and rank 0 prints what one process
// prints, once, and writes it to TensorBoard beside the loss. With two replicas (PP=2 x DP=2) each
// evaluates its shard and the counts add up.
TEST(KeelTrainModelParallel, APipelineEvaluatesAsOneProcessDoes) {
  const std::string dir = MakeTempDir();
  const std::string train =
      " train --model=transformer --steps=4 --eval_every=2 --seed=3 "
      "--batch_size=8 --dropout=0 --optimizer=sgd --progress=lines";
  const std::string env = "FLAGS_cpu_math_threads=1 ";
  auto one = RunCommand(env + Keel() + train + " 2>&1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<std::string> want = EvalLines(one.output);
  ASSERT_EQ(want.size(), 2u) << one.output;
  auto two =
      RunCommand(env + Keel() + " launch --nproc_per_node=2 --log_dir=" + dir + "/l2 " + Keel() +
                 train + " --pp_degree=2 --micro_batches=2 --logdir=" + dir + "/tb 2>&1");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(EvalLines(ReadFile(dir + "/l2/workerlog.0")), want) << two.output;
  EXPECT_TRUE(EvalLines(ReadFile(dir + "/l2/workerlog.1")).empty());
  // TensorBoard (rank 0's logdir): the pipeline's loss every step and the test accuracy.
  if (HaveTensorboard()) {
    auto scalars = ReadTensorboardScalars(dir + "/tb");
    EXPECT_EQ(scalars["train/loss"].size(), 4u);
    EXPECT_EQ(scalars["eval/accuracy"].size(), 2u);
  }
  auto four = RunCommand(env + Keel() + " launch --nproc_per_node=4 --log_dir=" + dir + "/l4 " +
                         Keel() + train + " --pp_degree=2 --micro_batches=2 2>&1");
  ASSERT_EQ(four.exit_code, 0) << four.output;
  const std::vector<std::string> got = EvalLines(ReadFile(dir + "/l4/workerlog.0"));
  ASSERT_EQ(got.size(), 2u) << four.output;
  const std::string samples = want[0].substr(want[0].find(" ("));
  for (const std::string& line : got) EXPECT_TRUE(Contains(line, samples)) << line;
  for (int r = 1; r < 4; ++r)
    EXPECT_TRUE(EvalLines(ReadFile(dir + "/l4/workerlog." + std::to_string(r))).empty()) << r;
  RunCommand("rm -rf " + dir);
}

// keel bench under --pp_degree runs each step as the stage's micro-batches (it fed the whole
// program's data to a stage before) and under --pp_degree or --tp_degree counts one replica's
// samples: the loss is one process's, samples/s the batch over the median step.
TEST(KeelTrainModelParallel, BenchRunsPipelineAndTensorParallelSteps) {
  const std::string dir = MakeTempDir();
  const std::string bench =
      " bench transformer --batch_size=16 --bench_steps=3 --bench_warmup=1 --seed=1";
  const std::string env = "FLAGS_cpu_math_threads=1 ";
  auto one = RunCommand(env + Keel() + bench + " 2>/dev/null");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::regex loss_re("\"loss\": ([0-9.]+)");
  const std::regex ms_re("\"step_ms\": ([0-9.]+), .*\"samples_per_s\": ([0-9.]+)");
  std::smatch want;
  ASSERT_TRUE(std::regex_search(one.output, want, loss_re)) << one.output;
  for (const std::string parallel : {"--pp_degree=2 --micro_batches=4", "--tp_degree=2"}) {
    SCOPED_TRACE(parallel);
    auto two = RunCommand(env + Keel() + " launch --nproc_per_node=2 --log_dir=" + dir + "/l " +
                          Keel() + bench + " " + parallel + " 2>/dev/null");
    ASSERT_EQ(two.exit_code, 0) << two.output;
    std::smatch got, ms;
    ASSERT_TRUE(std::regex_search(two.output, got, loss_re)) << two.output;
    EXPECT_EQ(got[1].str(), want[1].str()) << two.output;
    ASSERT_TRUE(std::regex_search(two.output, ms, ms_re)) << two.output;
    const double per_s = 16 / (std::stod(ms[1].str()) / 1e3);
    EXPECT_NEAR(std::stod(ms[2].str()), per_s, 0.01 * per_s) << two.output;
  }
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
