// Pipeline parallelism with real processes on loopback (tests/workers/pp_worker.cc): PP=2 (both
// schedules, SGD and Adam), PP=4 and PP=2 x DP=2 train to the parameters and losses of one process
// at the same global batch; 1F1B holds at most S - stage micro-batches in flight and F-then-B all
// M; receives that wait for another transfer's tag fail by the comm timeout instead of pairing
// with the wrong send. The largest differences are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "tests/util/named_tensors.h"
#include "tests/util/op_test_util.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

struct PpRun {
  int exit_code = 0;
  std::string output;                // the console and every worker's log
  std::vector<NamedTensors> params;  // per rank
};

PpRun Train(int nproc, const std::string& args, const std::string& dir, bool expect_ok = true) {
  RunCommand("mkdir -p " + dir);
  const std::string worker = BinPath("pp_worker") + " --out=" + dir + " " + args;
  const std::string cmd = nproc == 1 ? worker
                                     : "FLAGS_cpu_math_threads=1 " + BinPath("keel") +
                                           " launch --nproc_per_node=" + std::to_string(nproc) +
                                           " --log_dir=" + dir + "/log " + worker + " > " + dir +
                                           "/launch.out 2>&1; rc=$?; cat " + dir + "/launch.out " +
                                           dir + "/log/workerlog.*; exit $rc";
  auto r = RunCommand(cmd);
  PpRun run;
  run.exit_code = r.exit_code;
  run.output = r.output;
  if (!expect_ok) return run;
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  for (int k = 0; k < nproc; ++k)
    run.params.push_back(LoadSafetensors(dir + "/rank" + std::to_string(k) + ".safetensors"));
  return run;
}

// Values of "rank R step S <what> V" lines, by step (rank 0's lines reach the console twice).
std::vector<double> Series(const std::string& output, int rank, const std::string& what) {
  std::vector<double> values;
  std::istringstream in(output);
  std::string line;
  const std::string prefix = "rank " + std::to_string(rank) + " step ";
  const std::string key = " " + what + " ";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) != 0 || line.find(key) == std::string::npos) continue;
    if (static_cast<int>(values.size()) != std::stoi(line.substr(prefix.size()))) continue;
    values.push_back(std::stod(line.substr(line.find(key) + key.size())));
  }
  return values;
}

// Every parameter of the one-process run is held by exactly one stage of every data-parallel
// replica (ranks r*pp .. r*pp+pp-1): the largest difference.
double MaxParamDifference(const PpRun& one, const PpRun& pp, int stages) {
  double worst = 0;
  const int replicas = static_cast<int>(pp.params.size()) / stages;
  for (const auto& [name, want] : one.params[0]) {
    for (int r = 0; r < replicas; ++r) {
      int holders = 0;
      for (int s = 0; s < stages; ++s) {
        const Tensor* got = FindTensor(pp.params[r * stages + s], name);
        if (got == nullptr) continue;
        ++holders;
        EXPECT_EQ(got->dims(), want.dims()) << name;
        if (got->dims() != want.dims()) continue;
        for (int64_t i = 0; i < want.numel(); ++i)
          worst = std::max(
              worst, static_cast<double>(std::fabs(got->data<float>()[i] - want.data<float>()[i])));
      }
      EXPECT_EQ(holders, 1) << name << " is held by " << holders << " stages of replica " << r;
    }
  }
  return worst;
}

// As MaxParamDifference, within float rounding; the losses too. Returns the largest parameter
// difference.
double ExpectEqualsOneProcess(const PpRun& one, const PpRun& pp, int stages, const char* what) {
  const double worst = MaxParamDifference(one, pp, stages);
  const std::vector<double> l1 = Series(one.output, 0, "loss");
  const std::vector<double> lp = Series(pp.output, stages - 1, "loss");
  EXPECT_EQ(l1.size(), lp.size()) << pp.output;
  double worst_loss = 0;
  for (size_t i = 0; i < std::min(l1.size(), lp.size()); ++i)
    worst_loss = std::max(worst_loss, std::fabs(l1[i] - lp[i]));
  std::printf(
      "%s: max |param - one process| = %.3g, max |loss - one process| = %.3g over %zu "
      "steps\n",
      what, worst, worst_loss, l1.size());
  EXPECT_LT(worst, 2e-6) << what;
  EXPECT_LT(worst_loss, 2e-6) << what;
  EXPECT_FALSE(l1.empty());
  return worst;
}

TEST(PipelineParallel, Pp2EqualsOneProcess) {
  const std::string dir = MakeTempDir();
  for (const std::string opt : {"sgd", "adam"}) {
    const PpRun one = Train(1, "--pp=1 --opt=" + opt, dir + "/one_" + opt);
    for (const std::string sched : {"1F1B", "F-then-B"}) {
      if (opt == "adam" && sched == "F-then-B") continue;  // the schedule does not touch the math
      const PpRun two = Train(2, "--pp=2 --micro=4 --schedule=" + sched + " --opt=" + opt,
                              dir + "/pp2_" + opt + sched);
      ExpectEqualsOneProcess(one, two, 2, ("PP=2 M=4 " + sched + " " + opt).c_str());
      // Shared-memory rings (the default on one host) move the transfers through memory the
      // sender shares, not through the store (both stages say so).
      for (int k = 0; k < 2; ++k)
        EXPECT_NE(
            RunCommand("cat " + dir + "/pp2_" + opt + sched + "/log/workerlog." + std::to_string(k))
                .output.find("point-to-point transfers through shared memory"),
            std::string::npos)
            << "rank " << k << "\n"
            << two.output;
    }
    if (opt == "sgd") {
      // Gloo rings move the transfers over their own connections (both stages say so), not
      // through the store, and train alike.
      const PpRun gloo =
          Train(2, "--pp=2 --micro=4 --opt=sgd --cpu_comm_backend=gloo", dir + "/pp2_gloo");
      ExpectEqualsOneProcess(one, gloo, 2, "PP=2 M=4 1F1B sgd, gloo rings");
      for (int k = 0; k < 2; ++k)
        EXPECT_NE(RunCommand("cat " + dir + "/pp2_gloo/log/workerlog." + std::to_string(k))
                      .output.find("point-to-point transfers over gloo (native"),
                  std::string::npos)
            << "rank " << k << "\n"
            << gloo.output;
    }
  }
  RunCommand("rm -rf " + dir);
}

TEST(PipelineParallel, Pp4RelaysThroughTheMiddleStagesAndEqualsOneProcess) {
  const std::string dir = MakeTempDir();
  const PpRun one = Train(1, "--pp=1 --opt=adam", dir + "/one");
  const PpRun four = Train(4, "--pp=4 --micro=4 --schedule=1F1B --opt=adam", dir + "/pp4");
  ExpectEqualsOneProcess(one, four, 4, "PP=4 M=4 1F1B adam");
  RunCommand("rm -rf " + dir);
}

// The built-in transformer places its layers on the stages itself (layer i on stage i * S / 2).
TEST(PipelineParallel, Pp2OnTheTransformerEqualsOneProcess) {
  const std::string dir = MakeTempDir();
  // SGD: Adam would turn the rounding noise of gradients that are zero in exact arithmetic (the
  // key projection's bias: softmax ignores a shift) into steps of the learning rate.
  const std::string args = " --model=transformer --opt=sgd --global_batch=8";
  const PpRun one = Train(1, "--pp=1" + args, dir + "/one");
  const PpRun two = Train(2, "--pp=2 --micro=4" + args, dir + "/pp2");
  ExpectEqualsOneProcess(one, two, 2, "transformer PP=2 M=4 1F1B sgd");
  RunCommand("rm -rf " + dir);
}

TEST(PipelineParallel, Pp2TimesDp2EqualsOneProcessAtTheSameGlobalBatch) {
  const std::string dir = MakeTempDir();
  const PpRun one = Train(1, "--pp=1 --opt=adam", dir + "/one");
  const PpRun four = Train(4, "--pp=2 --micro=4 --schedule=1F1B --opt=adam", dir + "/pp2dp2");
  ExpectEqualsOneProcess(one, four, 2, "PP=2 x DP=2 M=4 1F1B adam");
  // The replicas of each stage hold the same bits.
  for (int s = 0; s < 2; ++s)
    for (const auto& [name, a] : four.params[s]) {
      const Tensor* b = FindTensor(four.params[2 + s], name);
      ASSERT_NE(b, nullptr) << name;
      EXPECT_EQ(0, std::memcmp(a.raw_data(), b->raw_data(), a.nbytes())) << name;
    }
  RunCommand("rm -rf " + dir);
}

// Sync batch norm on PP=2 x DP=2 (ResNet at depth 8, 2 micro-batches of 2 rows per replica):
// each stage's batch norms take their statistics over both replicas' micro-batch through the
// data-parallel ring of that stage, micro-batch by micro-batch, so the job equals one process
// with sync batch norm merging micro-batches of 4 rows (both replicas' k-th micro-batch) at the
// same learning rate: parameters and moving statistics to float rounding. Without the sync each
// replica normalizes its own rows, which the test checks differs, so it cannot pass vacuously.
TEST(PipelineParallel,
     Pp2TimesDp2WithSyncBatchNormEqualsOneProcessMergingBothReplicasMicroBatches) {
  const std::string dir = MakeTempDir();
  const std::string args = " --model=resnet --opt=sgd --global_batch=8 --steps=3";
  const PpRun one = Train(1, "--pp=1 --merge=2 --replicas=2 --sync_bn" + args, dir + "/one");
  const PpRun synced = Train(4, "--pp=2 --micro=2 --sync_bn" + args, dir + "/synced");
  ExpectEqualsOneProcess(one, synced, 2, "resnet PP=2 x DP=2 M=2 sync batch norm");
  const PpRun unsynced = Train(4, "--pp=2 --micro=2" + args, dir + "/unsynced");
  const double apart = MaxParamDifference(one, unsynced, 2);
  std::printf("without the sync: max |param or statistic - one process| = %.3g\n", apart);
  EXPECT_GT(apart, 1e-3);
  RunCommand("rm -rf " + dir);
}

// The bytes of optimizer state each rank holds after startup, by rank.
std::vector<double> StateBytes(const std::string& output, int nproc) {
  std::vector<double> bytes;
  for (int r = 0; r < nproc; ++r) {
    const std::string key = "rank " + std::to_string(r) + " state_bytes ";
    const size_t at = output.find(key);
    EXPECT_NE(at, std::string::npos) << key << "\n" << output;
    bytes.push_back(at == std::string::npos ? 0 : std::stod(output.substr(at + key.size())));
  }
  return bytes;
}

// ZeRO-1 inside a pipeline (PP=2 x DP=2, Adam): each stage's optimizer state is sharded over its
// two data-parallel replicas, whose accumulators are reduce-scattered to their owners once per
// mini-batch, the owners update and broadcast. Bit for bit the plain PP x DP job's parameters;
// each stage's state bytes split between its replicas; a checkpoint is complete (the owners
// broadcast their state to the stage's first replica, which the pipeline's gather reads), equal
// bit for bit to the plain job's, and resuming from it under sharding continues exactly.
TEST(PipelineParallel, ZeroOneShardingOfEachStageEqualsPlainDataParallelAndCheckpointsCompletely) {
  const std::string dir = MakeTempDir();
  const std::string args = " --pp=2 --micro=2 --opt=adam";
  const PpRun plain = Train(4, "--steps=4" + args, dir + "/plain");
  const PpRun zero = Train(4, "--steps=4 --sharding" + args, dir + "/zero");
  for (int r = 0; r < 4; ++r)
    for (const auto& [name, want] : plain.params[r]) {
      const Tensor* got = FindTensor(zero.params[r], name);
      ASSERT_NE(got, nullptr) << name;
      EXPECT_EQ(0, std::memcmp(got->raw_data(), want.raw_data(), want.nbytes()))
          << name << " on rank " << r;
    }
  const std::vector<double> full = StateBytes(plain.output, 4), part = StateBytes(zero.output, 4);
  for (int s = 0; s < 2; ++s) {
    std::printf("stage %d: optimizer state bytes %.0f + %.0f under sharding, %.0f plain\n", s,
                part[s], part[2 + s], full[s]);
    EXPECT_EQ(part[s] + part[2 + s], full[s]) << "stage " << s;
    EXPECT_LT(part[s], full[s]);
    EXPECT_LT(part[2 + s], full[s]);
  }
  Train(4, "--steps=2 --save_dir=" + dir + "/ck_zero --sharding" + args, dir + "/half_zero");
  Train(4, "--steps=2 --save_dir=" + dir + "/ck_plain" + args, dir + "/half_plain");
  const NamedTensors a = LoadSafetensors(dir + "/ck_zero/" + kPersistablesFile),
                     b = LoadSafetensors(dir + "/ck_plain/" + kPersistablesFile);
  ASSERT_EQ(a.size(), b.size());
  ExpectHoldsBitForBit(a, b, "the sharded job's checkpoint");
  const PpRun resumed =
      Train(4, "--steps=4 --first_step=2 --sharding --load_dir=" + dir + "/ck_zero" + args,
            dir + "/resumed");
  for (int r = 0; r < 4; ++r)
    for (const auto& [name, want] : zero.params[r]) {
      const Tensor* got = FindTensor(resumed.params[r], name);
      ASSERT_NE(got, nullptr) << name;
      EXPECT_EQ(0, std::memcmp(got->raw_data(), want.raw_data(), want.nbytes()))
          << name << " on rank " << r << " after the resume";
    }
  RunCommand("rm -rf " + dir);
}

// Float16 loss scaling (dynamic, from a scale that overflows): each stage checks its own
// gradients and the flag is all-reduced (max) over the pipeline group, so every stage skips the
// same steps and moves the loss scale alike. The pipeline scales each micro-batch's loss by S/M
// (the mini-batch loss times S), so its float16 values are exactly those of one process merging
// the same M micro-batches (gradient merge, averaged) at the scale S/M, a power of two away:
// every rank's scale is 4x the reference's at every step, the same steps are skipped, and the
// parameters agree. With the flag kept on each stage (the all-reduce removed on purpose), stage 0
// skips a step that stage 1 takes: the stages' scales part (this test fails without the
// reduction).
TEST(PipelineParallel, Float16LossScalingSkipsTheSameStepsOnEveryStageAndEqualsOneProcess) {
  const std::string dir = MakeTempDir();
  const std::string args = " --steps=6 --opt=adam";
  const PpRun one = Train(1, "--pp=1 --merge=4 --loss_scale=750000" + args, dir + "/one");
  const std::vector<double> want_scale = Series(one.output, 0, "loss_scale");
  const std::vector<double> want_skipped = Series(one.output, 0, "skipped");
  ASSERT_EQ(want_scale.size(), 6u) << one.output;
  // The scale moves both ways in these steps: overflows first, then a step taken.
  EXPECT_GE(want_skipped.back(), 2) << one.output;
  EXPECT_LT(want_skipped.back(), 6) << one.output;
  struct Case {
    int nproc, stages;
    const char* flags;
  };
  // PP x DP: each replica's 2 micro-batches of 4 rows are the reference's, and the loss
  // gradient's 1/2 for the replicas keeps the micro-batches' scale at 3e6 / 4. With ZeRO-1
  // sharding each owner checks its own accumulators: the flag is all-reduced over the replicas
  // too.
  int k = 0;
  for (const Case& c :
       {Case{2, 2, " --micro=4 --schedule=1F1B"}, Case{2, 2, " --micro=4 --schedule=F-then-B"},
        Case{4, 4, " --micro=4 --schedule=1F1B"}, Case{4, 2, " --micro=2 --schedule=1F1B"},
        Case{4, 2, " --micro=2 --schedule=1F1B --sharding"}}) {
    const std::string what = "PP=" + std::to_string(c.stages) +
                             " x DP=" + std::to_string(c.nproc / c.stages) + c.flags +
                             " fp16 loss scaling";
    SCOPED_TRACE(what);
    const PpRun pp =
        Train(c.nproc, "--pp=" + std::to_string(c.stages) + " --loss_scale=3e6" + args + c.flags,
              dir + "/case" + std::to_string(k++));
    for (int r = 0; r < c.nproc; ++r) {
      const std::vector<double> scale = Series(pp.output, r, "loss_scale");
      ASSERT_EQ(scale.size(), want_scale.size()) << "rank " << r << "\n" << pp.output;
      for (size_t i = 0; i < scale.size(); ++i)
        EXPECT_EQ(scale[i], 4 * want_scale[i]) << "rank " << r << " step " << i;
      EXPECT_EQ(Series(pp.output, r, "skipped"), want_skipped) << "rank " << r;
    }
    ExpectEqualsOneProcess(one, pp, c.stages, what.c_str());
  }
  const PpRun local =
      Train(2, "--pp=2 --micro=4 --loss_scale=3e6 --local_overflow_flag --steps=6 --opt=sgd",
            dir + "/local");
  EXPECT_NE(Series(local.output, 0, "loss_scale"), Series(local.output, 1, "loss_scale"))
      << local.output;
  RunCommand("rm -rf " + dir);
}

// fleet::save_persistables of a pipeline (every rank calls it) writes one complete checkpoint:
// rank 0 gathers the other stages' persistables, under the single-device names. Resuming the
// pipeline from it (each stage loads its own) continues exactly: 2k steps equal k, save, resume,
// k more, bit for bit, on PP=2 and PP=2 x DP=2; one process loads it and holds the pipeline's
// parameters, and trains on from it to the pipeline's parameters (float rounding); the pipeline
// loads one process's checkpoint.
TEST(PipelineParallel, ACheckpointHoldsEveryStageAndResumesExactly) {
  const std::string dir = MakeTempDir();
  for (const int nproc : {2, 4}) {
    const std::string d = dir + "/n" + std::to_string(nproc);
    const std::string args = " --pp=2 --micro=4 --opt=adam";
    const PpRun full = Train(nproc, "--steps=4" + args, d + "/full");
    const PpRun half = Train(nproc, "--steps=2 --save_dir=" + d + "/ckpt" + args, d + "/half");
    const PpRun resumed =
        Train(nproc, "--steps=4 --first_step=2 --load_dir=" + d + "/ckpt" + args, d + "/resumed");
    ASSERT_EQ(full.params.size(), resumed.params.size());
    size_t compared = 0;
    for (size_t k = 0; k < full.params.size(); ++k)
      for (const auto& [name, want] : full.params[k]) {
        const Tensor* got = FindTensor(resumed.params[k], name);
        ASSERT_NE(got, nullptr) << name << " on rank " << k;
        ASSERT_EQ(got->dims(), want.dims()) << name;
        EXPECT_EQ(0, std::memcmp(got->raw_data(), want.raw_data(), want.nbytes()))
            << name << " on rank " << k << " differs after the resume (" << nproc << " ranks)";
        ++compared;
      }
    EXPECT_GT(compared, 0u);
    const std::vector<double> lf = Series(full.output, 1, "loss");
    // The resumed run prints steps 2 and 3 only (Series takes a run's lines from step 0).
    std::vector<double> tail;
    std::istringstream in(resumed.output);
    for (std::string line; std::getline(in, line);)
      for (int step : {2, 3})
        if (line.rfind("rank 1 step " + std::to_string(step) + " loss ", 0) == 0 &&
            static_cast<int>(tail.size()) == step - 2)
          tail.push_back(std::stod(line.substr(line.rfind(' ') + 1)));
    ASSERT_EQ(lf.size(), 4u) << full.output;
    ASSERT_EQ(tail.size(), 2u) << resumed.output;
    EXPECT_EQ(lf[2], tail[0]);
    EXPECT_EQ(lf[3], tail[1]);
    // One process: the checkpoint names every persistable of the single-device program (Adam's
    // moments and beta powers too, else the load fails); loaded, it holds the pipeline's
    // parameters bit for bit, and two more steps end where the pipeline's do.
    const PpRun one_loaded =
        Train(1, "--pp=1 --opt=adam --steps=2 --first_step=2 --load_dir=" + d + "/ckpt",
              d + "/one_loaded");
    EXPECT_EQ(MaxParamDifference(one_loaded, half, 2), 0.0) << nproc << " ranks";
    const PpRun one_on = Train(
        1, "--pp=1 --opt=adam --steps=4 --first_step=2 --load_dir=" + d + "/ckpt", d + "/one_on");
    const double diff = MaxParamDifference(one_on, full, 2);
    std::printf(
        "%d ranks (PP=2%s): resumed == uninterrupted bit for bit over %zu tensors; one process "
        "from the checkpoint, 2 steps: max |param - pipeline| = %.3g\n",
        nproc, nproc == 4 ? " x DP=2" : "", compared, diff);
    EXPECT_LT(diff, 2e-6);
    // The other way: the pipeline loads one process's checkpoint, each stage its own part.
    const PpRun one_saved =
        Train(1, "--pp=1 --opt=adam --steps=2 --save_dir=" + d + "/one_ckpt", d + "/one_saved");
    const PpRun from_one = Train(
        nproc, "--steps=2 --first_step=2 --load_dir=" + d + "/one_ckpt" + args, d + "/from_one");
    EXPECT_EQ(MaxParamDifference(one_saved, from_one, 2), 0.0);
  }
  RunCommand("rm -rf " + dir);
}

// 1F1B keeps at most S - stage micro-batches of activations per stage; F-then-B keeps all M.
TEST(PipelineParallel, OneFOneBHoldsAtMostStagesMinusStageMicroBatchesInFlight) {
  const std::string dir = MakeTempDir();
  const PpRun f1b = Train(4, "--pp=4 --micro=6 --global_batch=24 --steps=1", dir + "/1f1b");
  const PpRun ftb =
      Train(4, "--pp=4 --micro=6 --global_batch=24 --steps=1 --schedule=F-then-B", dir + "/ftb");
  for (int s = 0; s < 4; ++s) {
    const std::vector<double> a = Series(f1b.output, s, "peak_in_flight");
    const std::vector<double> b = Series(ftb.output, s, "peak_in_flight");
    ASSERT_EQ(a.size(), 1u) << f1b.output;
    ASSERT_EQ(b.size(), 1u) << ftb.output;
    std::printf("stage %d: peak micro-batches in flight 1F1B %g, F-then-B %g\n", s, a[0], b[0]);
    EXPECT_EQ(a[0], 4 - s) << "stage " << s;
    EXPECT_EQ(b[0], 6) << "stage " << s;
  }
  RunCommand("rm -rf " + dir);
}

// The allocator's high-water mark per stage: F-then-B's grows with M by a micro-batch's stash per
// micro-batch (measured as the slope between M=4 and M=8); under 1F1B stage s stays within what
// S - s micro-batches in flight need on top of the rest (the intercept), and does not grow with M.
TEST(PipelineParallel, OneFOneBPeakMemoryPerStageIsBoundedByStagesMinusStageMicroBatches) {
  const std::string dir = MakeTempDir();
  const std::string common = " --pp=4 --steps=2 --hidden=1024 --opt=sgd";
  const PpRun f4 =
      Train(4, "--micro=4 --global_batch=256 --schedule=F-then-B" + common, dir + "/f4");
  const PpRun f8 =
      Train(4, "--micro=8 --global_batch=512 --schedule=F-then-B" + common, dir + "/f8");
  const PpRun o8 = Train(4, "--micro=8 --global_batch=512 --schedule=1F1B" + common, dir + "/o8");
  for (int s = 0; s < 4; ++s) {
    auto peak = [&](const PpRun& r) {
      const std::vector<double> v = Series(r.output, s, "peak_bytes");
      EXPECT_EQ(v.size(), 2u) << r.output;
      return v.empty() ? 0.0 : v.back();  // the second step: past the first run's set-up
    };
    const double a = peak(f4), b = peak(f8), c = peak(o8);
    const double per_micro_batch = (b - a) / 4, base = a - 4 * per_micro_batch;
    const double bound = base + (4 - s) * per_micro_batch;
    std::printf(
        "stage %d: peak bytes F-then-B M=4 %.0f, M=8 %.0f (%.0f per micro-batch); 1F1B "
        "M=8 %.0f, bound for %d in flight %.0f\n",
        s, a, b, per_micro_batch, c, 4 - s, bound);
    // Stages 0, 1 and 3 stash the wide first layer's activations (stage 2 only relays them), so
    // there the slack below is small against what one micro-batch more would add.
    if (s != 2) {
      EXPECT_GT(per_micro_batch, 4 * 64 * 1024) << "stage " << s;
    }
    EXPECT_LE(c, bound + 64 * 1024) << "stage " << s;
  }
  RunCommand("rm -rf " + dir);
}

// Recompute inside the stages (DistributedStrategy::recompute beside pipeline): each stage's
// backward recomputes its transformer sublayers from their checkpoints, so a micro-batch in
// flight keeps only the checkpoints and the stage's peak memory drops, while the losses and the
// parameters stay those of the same pipeline without recompute, bit for bit.
TEST(PipelineParallel, RecomputeInsideTheStagesKeepsTheBitsAndLowersEachStagesPeak) {
  const std::string dir = MakeTempDir();
  const std::string common = "--model=transformer --pp=2 --micro=4 --global_batch=256 --steps=3";
  for (const std::string sched : {"1F1B", "F-then-B"}) {
    const PpRun plain = Train(2, common + " --schedule=" + sched, dir + "/plain" + sched);
    const PpRun again =
        Train(2, common + " --schedule=" + sched + " --recompute", dir + "/recompute" + sched);
    EXPECT_EQ(Series(plain.output, 1, "loss"), Series(again.output, 1, "loss")) << sched;
    EXPECT_EQ(MaxParamDifference(plain, again, 2), 0.0) << sched;
    for (int stage = 0; stage < 2; ++stage) {
      const std::vector<double> a = Series(plain.output, stage, "peak_bytes"),
                                b = Series(again.output, stage, "peak_bytes");
      ASSERT_EQ(a.size(), 3u) << plain.output;
      ASSERT_EQ(b.size(), 3u) << again.output;
      std::printf("%s stage %d: peak bytes %.0f without recompute, %.0f with (%.0f%% lower)\n",
                  sched.c_str(), stage, a.back(), b.back(), 100 * (1 - b.back() / a.back()));
      EXPECT_LT(b.back(), 0.8 * a.back()) << sched << " stage " << stage;
    }
  }
  RunCommand("rm -rf " + dir);
}

// Receives that wait for another transfer's tag (as if matched by arrival order) never pair with
// the wrong send: the run fails, within the comm timeout, naming the transfer.
// On shared-memory rings and on Gloo rings, each with transfers of its own.
TEST(PipelineParallel, AReceiveWaitingForTheWrongTagFailsByTheCommTimeout) {
  const std::string dir = MakeTempDir();
  for (const std::string backend : {"shm", "gloo"}) {
    const PpRun bad = Train(2,
                            "--pp=2 --micro=2 --steps=1 --unordered_recv --comm_timeout_s=3 "
                            "--cpu_comm_backend=" +
                                backend,
                            dir + "/bad_" + backend, /*expect_ok=*/false);
    EXPECT_NE(bad.exit_code, 0) << backend << "\n" << bad.output;
    // Stage 1's first receive gets a transfer of another shape (refused by recv_v2's check) or
    // waits for a tag its peer never sends (the comm timeout), whichever the executor starts
    // first.
    EXPECT_TRUE(bad.output.find("receive from rank") != std::string::npos ||
                bad.output.find("recv_v2 of") != std::string::npos)
        << backend << "\n"
        << bad.output;
  }
  RunCommand("rm -rf " + dir);
}

// A stage that stops answering (hung) fails its neighbour within the comm timeout, naming the
// transfer, the stage it waits for and the timeout, instead of hanging the job.
// On shared-memory rings and on Gloo rings, each with transfers of its own.
TEST(PipelineParallel, AHungStageFailsItsNeighbourWithinTheCommTimeoutNamingTheStage) {
  const std::string dir = MakeTempDir();
  for (const std::string backend : {"shm", "gloo"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const PpRun hung = Train(2,
                             "--pp=2 --micro=2 --steps=3 --stall_stage=1 --stall_s=60 "
                             "--comm_timeout_s=2 --cpu_comm_backend=" +
                                 backend,
                             dir + "/hung_" + backend, /*expect_ok=*/false);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s rings: a hung stage 1 failed stage 0 after %.1f s\n", backend.c_str(), secs);
    EXPECT_NE(hung.exit_code, 0) << backend << "\n" << hung.output;
    EXPECT_LT(secs, 30) << backend << "\n" << hung.output;
    const std::string log0 =
        RunCommand("cat " + dir + "/hung_" + backend + "/log/workerlog.0").output;
    testing::ExpectContainsAll(
        log0, {"recv_v2 of", "from stage 1", "receive from rank 1", "no send arrived",
               " 2 s (--comm_timeout_s; did rank 1 stop"});
  }
  RunCommand("rm -rf " + dir);
}

// A stage whose process disappears (its connections closed) fails its neighbour at once, well
// within the comm timeout, naming the transfer, the stage and the rank it waited for.
TEST(PipelineParallel, AStageWhoseProcessDiesFailsItsNeighbourAtOnceNamingRankAndStage) {
  const std::string dir = MakeTempDir();
  for (const std::string backend : {"shm", "gloo"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const PpRun gone = Train(2,
                             "--pp=2 --micro=2 --steps=3 --vanish_stage=1 --comm_timeout_s=60 "
                             "--cpu_comm_backend=" +
                                 backend,
                             dir + "/gone_" + backend, /*expect_ok=*/false);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s rings: stage 1's process vanished; stage 0 failed after %.1f s (timeout 60)\n",
                backend.c_str(), secs);
    EXPECT_NE(gone.exit_code, 0) << backend << "\n" << gone.output;
    EXPECT_LT(secs, 30) << backend << "\n" << gone.output;
    const std::string log0 =
        RunCommand("cat " + dir + "/gone_" + backend + "/log/workerlog.0").output;
    testing::ExpectContainsAll(log0, {"rank 1", "stage 1"});
    const size_t at = log0.find("error: ");
    if (at != std::string::npos) std::printf("  %s", log0.substr(at).c_str());
  }
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
