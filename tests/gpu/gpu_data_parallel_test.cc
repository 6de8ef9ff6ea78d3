// GPU data parallelism (ctest label `gpu`): two ranks sharing GPU 0 with host-staged collectives
// (--selected_gpus=0,0 --gpu_comm_backend=host) train to one rank's parameters on the double
// batch, with 1 and 2 rings and with gradient fusion; one rank over NCCL runs the transpiled
// program; the executor on CUDAPlace refuses num_threads > 1. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>

#include "executor/executor.h"
#include "executor/executor_io.h"
#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "framework/runtime/device.h"
#include "tests/util/gpu_test_util.h"
#include "tests/util/model_train.h"
#include "tests/util/op_test_util.h"
#include "tests/util/subprocess.h"

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

TEST(GpuExecutor, MoreThanOneThreadOnACudaPlaceIsRefused) {
  SKIP_WITHOUT_GPU();
  ExecutionStrategy s;
  s.num_threads = 4;
  Program p;
  Executor exe(CUDAPlace(0), s);
  ExpectErrorContainsAll(ErrorOf([&] { exe.Run(p); }),
                         {"ExecutionStrategy::num_threads=4", "CUDAPlace(0)"});
}

}  // namespace
}  // namespace keel::testing
