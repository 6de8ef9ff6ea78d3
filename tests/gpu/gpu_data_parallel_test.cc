// GPU data parallelism (ctest label `gpu`): two ranks sharing GPU 0 with host-staged collectives
// (--selected_gpus=0,0 --gpu_comm_backend=host) train to one rank's parameters on the double
// batch, with 1 and 2 rings and with gradient fusion; one rank over NCCL runs the transpiled
// program; num_threads > 1 on a CUDAPlace is accepted and changes no bit; sync_batch_norm on the
// GPU follows the CPU. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "executor/executor.h"
#include "executor/executor_io.h"
#include "framework/base/strings.h"
#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "framework/runtime/device.h"
#include "tests/util/gpu_test_util.h"
#include "tests/util/model_train.h"
#include "tests/util/op_test_util.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_data.h"

namespace keel::testing {
namespace {

// mlp_dp_worker on GPU 0: one rank alone, or `nranks` ranks sharing GPU 0 under keel launch.
NamedTensors TrainOnGpu(int nranks, int rings, int fuse_num, const std::string& backend,
                        const std::string& dir) {
  std::string worker = BinPath("mlp_dp_worker") +
                       " --global_batch=24 --steps=20 --rings=" + std::to_string(rings) +
                       " --out=" + dir + "/rank${RANK:-0}" +
                       (fuse_num > 0 ? " --fuse --fuse_num=" + std::to_string(fuse_num) : "");
  std::string gpus = "0";
  for (int r = 1; r < nranks; ++r) gpus += ",0";
  std::string cmd = nranks == 1
                        ? "FLAGS_selected_gpus=0 FLAGS_gpu_comm_backend=" + backend + " " + worker
                        : BinPath("keel") + " launch --selected_gpus=" + gpus +
                              " --gpu_comm_backend=" + backend + " --log_dir=" + dir +
                              "/log sh -c '" + worker + "'";
  auto r = RunCommand(cmd + (nranks == 1 ? "" : "; cat " + dir + "/log/workerlog.*"));
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  return LoadSafetensors(dir + "/rank0/" + kPersistablesFile);
}

TEST(GpuDataParallel, TwoRanksSharingAGpuWithHostCollectivesMatchOneRankOnTheDoubleBatch) {
  SKIP_WITHOUT_GPU();
  const std::string dir = MakeTempDir();
  NamedTensors ref = TrainOnGpu(1, 1, 0, "host", dir + "/single");
  ASSERT_FALSE(ref.empty());
  struct Config {
    int rings, fuse_num;
  };
  for (Config c : {Config{1, 0}, Config{2, 0}, Config{1, 8}, Config{2, 2}}) {
    SCOPED_TRACE(std::to_string(c.rings) + " rings, fuse_num " + std::to_string(c.fuse_num));
    const std::string d = dir + "/r" + std::to_string(c.rings) + "f" + std::to_string(c.fuse_num);
    ExpectSameParameters(TrainOnGpu(2, c.rings, c.fuse_num, "host", d), ref);
  }
  RunCommand("rm -rf " + dir);
}

TEST(GpuDataParallel, OneRankOverNcclRunsTheTranspiledProgram) {
  SKIP_WITHOUT_GPU();
  const std::string dir = MakeTempDir();
  NamedTensors host = TrainOnGpu(1, 2, 2, "host", dir + "/host");
  NamedTensors nccl = TrainOnGpu(1, 2, 2, "nccl", dir + "/nccl");
  ASSERT_FALSE(nccl.empty());
  ExpectSameParameters(nccl, host);
  RunCommand("rm -rf " + dir);
}

// "step N loss X" lines of keel train's console, the losses in order.
std::vector<double> TrainLosses(const std::string& out) {
  std::vector<double> losses;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string step, n, loss;
    double value = 0;
    if (words >> step >> n >> loss >> value && step == "step" && loss == "loss")
      losses.push_back(value);
  }
  return losses;
}

// Runs two keel train jobs that print their losses and expects `steps` losses from each, `got`'s
// within `rel` (relative) of `want`'s at every step; prints the largest relative difference.
// `got_cmd` runs on GPU 0 (its role line says so).
void ExpectLossesFollow(const std::string& want_cmd, const std::string& got_cmd, size_t steps,
                        double rel) {
  auto want_run = RunCommand(want_cmd), got_run = RunCommand(got_cmd);
  ASSERT_EQ(want_run.exit_code, 0) << want_cmd << "\n" << want_run.output;
  ASSERT_EQ(got_run.exit_code, 0) << got_cmd << "\n" << got_run.output;
  EXPECT_NE(got_run.output.find(" gpus=0"), std::string::npos) << got_run.output;
  const std::vector<double> want = TrainLosses(want_run.output), got = TrainLosses(got_run.output);
  ASSERT_EQ(want.size(), steps) << want_run.output;
  ASSERT_EQ(got.size(), steps) << got_run.output;
  double worst = 0;
  for (size_t s = 0; s < steps; ++s) {
    EXPECT_NEAR(got[s], want[s], rel * std::abs(want[s])) << "step " << s;
    worst = std::max(worst, std::abs(got[s] - want[s]) / std::abs(want[s]));
  }
  std::printf("losses' largest relative difference %.2g\n", worst);
}

// `keel launch` of `ranks` workers logging under dir/log<n>: on the CPU (one math thread each), or
// all sharing GPU 0 (every ring host-staged).
std::string Launch(const std::string& dir, int n, int ranks, bool gpu) {
  std::string gpus = "0";
  for (int r = 1; r < ranks; ++r) gpus += ",0";
  return std::string(gpu ? "" : "FLAGS_cpu_math_threads=1 ") + BinPath("keel") +
         " launch --log_dir=" + dir + "/log" + std::to_string(n) +
         (gpu ? " --selected_gpus=" + gpus : " --nproc_per_node=" + std::to_string(ranks)) + " ";
}

// sync_batch_norm's CUDA kernels against its CPU ones: ResNet-20 under --sync_batch_norm alone on
// GPU 0, and on two ranks sharing GPU 0 (a host-staged ring 0, the statistics' all-reduce between
// the kernels), follows the same job on the CPU: the first two steps' losses within 1e-3 relative
// (cuDNN's and oneDNN's convolutions round differently; later steps drift further, as the plain
// ResNet's GPU twin test allows).
TEST(GpuSyncBatchNorm, ResnetFollowsTheCpuJobAloneAndOnTwoRanks) {
  SKIP_WITHOUT_GPU();
  const std::string dir = MakeTempDir();
  const std::string train = BinPath("keel") +
                            " train --model=resnet --sync_batch_norm --steps=2 --batch_size=8 "
                            "--seed=5 --progress=lines 2>&1";
  {
    SCOPED_TRACE("1 rank");
    ExpectLossesFollow("FLAGS_cpu_math_threads=1 " + train, "FLAGS_selected_gpus=0 " + train, 2,
                       1e-3);
  }
  {
    SCOPED_TRACE("2 ranks");
    ExpectLossesFollow(Launch(dir, 0, 2, false) + train, Launch(dir, 1, 2, true) + train, 2, 1e-3);
  }
  RunCommand("rm -rf " + dir);
}

// Pipelines on a GPU: two stages sharing GPU 0 (their ring host-staged: send_v2 copies to the
// host after the compute stream's work, recv_v2 back into a device tensor of the static
// micro-batch shape) follow the same pipeline on the CPU: the mlp under 1F1B, the transformer under
// F-then-B, three steps' losses within 1e-3 relative (cuBLAS and oneDNN round differently).
TEST(GpuPipeline, TwoStagesSharingAGpuFollowTheCpuPipeline) {
  SKIP_WITHOUT_GPU();
  const std::string dir = MakeTempDir();
  int n = 0;
  for (const std::string job :
       {"--model=mlp --pp_schedule=1f1b", "--model=transformer --pp_schedule=fthenb --dropout=0"}) {
    SCOPED_TRACE(job);
    const std::string train = BinPath("keel") + " train " + job +
                              " --pp_degree=2 --micro_batches=4 --steps=3 --batch_size=16 "
                              "--seed=5 --progress=lines 2>&1";
    ExpectLossesFollow(Launch(dir, n, 2, false) + train, Launch(dir, n + 1, 2, true) + train, 3,
                       1e-3);
    n += 2;
  }
  RunCommand("rm -rf " + dir);
}

// A GPU pipeline receives what the message holds: LeNet on MNIST trains on micro-batches of 24 and
// evaluates the 2000 test samples in batches of 500 (other shapes than training's) on two stages
// sharing GPU 0, and prints the CPU pipeline's losses and test accuracy (within 1e-3 and 2
// samples).
TEST(GpuPipeline, LenetEvaluatesBatchesOfAnotherShape) {
  SKIP_WITHOUT_GPU();
  if (!HaveMnist()) GTEST_SKIP() << "no MNIST at " << MnistDir();
  const std::string dir = MakeTempDir();
  const std::string train = BinPath("keel") + " train --model=lenet --data=mnist:" + MnistDir() +
                            " --pp_degree=2 --micro_batches=2 --steps=3 --eval_every=3 "
                            "--batch_size=48 --seed=3 --progress=lines 2>&1";
  ExpectLossesFollow(Launch(dir, 0, 2, false) + train, Launch(dir, 1, 2, true) + train, 3, 1e-3);
  auto accuracy = [](const std::string& out) {
    const size_t at = out.find("test_accuracy ");
    return at == std::string::npos ? -1.0 : std::atof(out.c_str() + at + 14);
  };
  auto cpu = RunCommand(Launch(dir, 2, 2, false) + train);
  auto gpu = RunCommand(Launch(dir, 3, 2, true) + train);
  ASSERT_GE(accuracy(cpu.output), 0.0) << cpu.output;
  EXPECT_NEAR(accuracy(gpu.output), accuracy(cpu.output), 1e-3) << gpu.output;
  RunCommand("rm -rf " + dir);
}

// Float16 loss scaling in a GPU pipeline: every step the stages' overflow flags meet on the
// host-staged pipeline ring (an int32 maximum, a collective beside the transfers on that ring);
// the job's losses follow the same job on the CPU within 1e-2 relative (float16 kernels of two
// devices).
TEST(GpuPipeline, Float16LossScalingFollowsTheCpuPipeline) {
  SKIP_WITHOUT_GPU();
  const std::string dir = MakeTempDir();
  const std::string train = BinPath("keel") +
                            " train --model=mlp --amp=fp16 --pp_degree=2 "
                            "--micro_batches=2 --steps=4 --batch_size=16 --seed=5 "
                            "--progress=lines 2>&1";
  ExpectLossesFollow(Launch(dir, 0, 2, false) + train, Launch(dir, 1, 2, true) + train, 4, 1e-2);
  RunCommand("rm -rf " + dir);
}

// ZeRO-1 and pipeline x data parallel on GPUs: ranks sharing GPU 0 (every ring host-staged) follow
// the same jobs on the CPU, three steps' losses within 1e-3 relative: the transformer with Adam's
// state sharded over 2 ranks (gradients reduce-scattered to their owners, the owners' parameters
// broadcast), and PP=2 x DP=2 on 4 ranks (the accumulators all-reduced once per mini-batch beside
// the pipeline's transfers).
TEST(GpuHybrid, ZeroOneAndPipelineTimesDataParallelFollowTheCpuJobs) {
  SKIP_WITHOUT_GPU();
  const std::string dir = MakeTempDir();
  int n = 0;
  for (const auto& [ranks, job] : std::vector<std::pair<int, std::string>>{
           {2, "--model=transformer --dropout=0 --optimizer=adam --sharding_stage=1"},
           {4, "--model=mlp --pp_degree=2 --micro_batches=2"}}) {
    SCOPED_TRACE(job);
    const std::string train = BinPath("keel") + " train " + job +
                              " --steps=3 --batch_size=16 --seed=5 --progress=lines 2>&1";
    ExpectLossesFollow(Launch(dir, n, ranks, false) + train,
                       Launch(dir, n + 1, ranks, true) + train, 3, 1e-3);
    n += 2;
  }
  RunCommand("rm -rf " + dir);
}

// Tensor parallelism on a GPU: the mlp's column- then row-parallel layers on two ranks sharing GPU
// 0 (c_identity and mp_allreduce_sum on the host-staged ring 32) print TP=1's losses on the GPU
// within 1e-5 relative. (The transformer's vocabulary-parallel output layer has CPU kernels only:
// refused naming the op and the ring.)
TEST(GpuTensorParallel, MlpTp2FollowsTp1OnTheGpuAndTheVocabularyLayerIsRefused) {
  SKIP_WITHOUT_GPU();
  const std::string dir = MakeTempDir();
  const std::string train = BinPath("keel") +
                            " train --model=mlp --steps=3 --batch_size=16 --seed=5 "
                            "--progress=lines 2>&1";
  ExpectLossesFollow("FLAGS_selected_gpus=0 " + train,
                     Launch(dir, 0, 2, true) + train + " --tp_degree=2", 3, 1e-5);
  auto vocab = RunCommand(Launch(dir, 1, 2, true) + BinPath("keel") +
                          " train --model=transformer --tp_degree=2 --steps=1 2>&1");
  EXPECT_NE(vocab.exit_code, 0);
  EXPECT_NE(vocab.output.find("c_softmax_with_cross_entropy: ring 32"), std::string::npos)
      << vocab.output;
  RunCommand("rm -rf " + dir);
}

// Paddle's GPU recipe sets exec_strategy.num_threads = 3: accepted, said once, and the ops are
// still enqueued by one thread, so the losses are those of num_threads=1 bit for bit.
TEST(GpuExecutor, NumThreadsAboveOneIsAcceptedSaidOnceAndGivesTheOneThreadLosses) {
  SKIP_WITHOUT_GPU();
  std::string out[2];
  for (int threads : {1, 3}) {
    auto r = RunCommand("FLAGS_selected_gpus=0 " + BinPath("keel") +
                        " train --model=mlp --steps=5 --seed=3 --fetch_frequency=1 --num_threads=" +
                        std::to_string(threads));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("gpus=0"), std::string::npos) << r.output;
    const std::string told =
        "ExecutionStrategy::num_threads=3 on CUDAPlace(0): one thread enqueues";
    size_t at = r.output.find(told);
    if (threads == 3) {
      EXPECT_NE(at, std::string::npos) << r.output;
      EXPECT_EQ(r.output.find(told, at + 1), std::string::npos) << "said more than once";
    } else {
      EXPECT_EQ(at, std::string::npos) << r.output;
    }
    for (const std::string& line : StrSplit(r.output, '\n'))
      if (line.rfind("step ", 0) == 0)
        out[threads == 3] += line.substr(0, line.find(" samples/s")) + "\n";
  }
  EXPECT_NE(out[0].find("step 4 loss"), std::string::npos) << out[0];
  EXPECT_EQ(out[1], out[0]);
}

}  // namespace
}  // namespace keel::testing
