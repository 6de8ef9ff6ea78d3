// Multi-worker training end to end under `keel launch`, and its failure modes: a worker killed
// mid-training, ranks built with different programs.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "framework/runtime/place.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

std::string Launch(int n, const std::string& dir) {
  return "FLAGS_cpu_math_threads=1 " + BinPath("keel") +
         " launch --nproc_per_node=" + std::to_string(n) + " --log_dir=" + dir + "/log ";
}

TEST(FleetTraining, TwoWorkersTrainTheSeedProgramAndOnlyRankZeroSaves) {
  std::string dir = MakeTempDir();
  auto r = RunCommand("cd " + dir + " && " + Launch(2, dir) + BinPath("train_mlp_fleet"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 99 cost="), std::string::npos) << r.output;
  EXPECT_TRUE(std::ifstream(dir + "/model/persistables.safetensors").good());
  RunCommand("rm -rf " + dir);
}

TEST(FleetTraining, KeelTrainUnderLaunchMatchesItsCheckpointFormat) {
  std::string dir = MakeTempDir();
  auto r = RunCommand(Launch(2, dir) + BinPath("keel") +
                      " train --steps=20 --seed=3 --mlp_hidden=64 --fetch_frequency=10 "
                      "--save_dir=" +
                      dir + "/ckpt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 10 loss"), std::string::npos) << r.output;
  auto i = RunCommand(BinPath("keel") + " inspect " + dir + "/ckpt");
  EXPECT_NE(i.output.find("fc_0.w_0 : float32[32, 64]"), std::string::npos) << i.output;
  RunCommand("rm -rf " + dir);
}

// keel train's strategy flags reach the DistributedStrategy every rank transpiles with (fleet logs
// it), and --log_all_ranks makes rank 1 print its steps too.
TEST(FleetTraining, KeelTrainStrategyFlagsReachTheStrategy) {
  std::string dir = MakeTempDir();
  struct Case {
    std::string flags;
    std::vector<std::string> logged;
  };
  const std::vector<Case> cases = {
      {"--nccl_comm_num=2 --fuse_all_reduce_ops=false",
       {"nccl_comm_num=2, fuse_all_reduce_ops=false", "ring 1 ("}},
      {"--hierarchical_allreduce_inter_nranks=1",
       {"fuse_all_reduce_ops=true",
        "use_hierarchical_allreduce=true, "
        "hierarchical_allreduce_inter_nranks=1",
        "ring 2 ("}},
      {"--local_sgd_steps=2 --local_sgd_warmup_steps=1",
       {"use_local_sgd=true, local_sgd_steps=2, local_sgd_warmup_steps=1"}},
      {"--log_all_ranks --fetch_frequency=1", {"step 1 loss"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    auto r = RunCommand(Launch(2, dir) + BinPath("keel") +
                        " train --steps=2 --mlp_hidden=8 --batch_size=4 " + c.flags);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto log = RunCommand("cat " + dir + "/log/workerlog.1").output;
    for (const std::string& piece : c.logged) EXPECT_NE(log.find(piece), std::string::npos) << log;
  }
  RunCommand("rm -rf " + dir);
}

TEST(FleetFaults, DifferentProgramsOnDifferentRanksFailAtStartNamingTheOp) {
  std::string dir = MakeTempDir();
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand(Launch(2, dir) + "sh -c '" + BinPath("keel") +
                      " train --steps=5 --mlp_hidden=$((32 + RANK))'");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(secs, 30);
  auto logs = RunCommand("cat " + dir + "/log/workerlog.*");
  EXPECT_NE(logs.output.find("differs between ranks"), std::string::npos) << logs.output;
  EXPECT_NE(logs.output.find("fingerprint"), std::string::npos) << logs.output;
  EXPECT_NE(logs.output.find("[32, 32]"), std::string::npos) << logs.output;  // the first diff
  RunCommand("rm -rf " + dir);
}

// DistributedStrategy::comm_timeout_s bounds the collectives of the rings minimize creates: with
// 2 s, rank 0's first all-reduce gives up 2 s after rank 1 stalls (30 s) and names the timeout;
// before, the strategy's value was ignored and rank 0 waited for the flag's 300 s default.
TEST(FleetFaults, StrategyCommTimeoutBoundsEveryCollective) {
  std::string dir = MakeTempDir();
  for (const char* backend : {"shm", "gloo"}) {
    SCOPED_TRACE(backend);
    auto t0 = std::chrono::steady_clock::now();
    auto r = RunCommand(std::string("FLAGS_cpu_comm_backend=") + backend + " " + Launch(2, dir) +
                        BinPath("mlp_dp_worker") +
                        " --steps=3 --strategy_timeout_s=2 --stall_rank=1 --stall_s=30");
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_LT(secs, 20) << r.output;
    auto logs = RunCommand("cat " + dir + "/log/workerlog.0");
    EXPECT_NE(logs.output.find("c_allreduce_sum"), std::string::npos) << logs.output;
    EXPECT_NE(logs.output.find("timed out after 2 s"), std::string::npos) << logs.output;
  }
  RunCommand("rm -rf " + dir);
}

// Two processes with one rank (a RANK left in an environment, two launchers given one node rank):
// the second is named at once, with the first, instead of hanging or mixing up the rings.
TEST(FleetFaults, ARankThatJoinsTwiceIsNamedAtOnce) {
  std::string dir = MakeTempDir();
  const std::string env =
      "FLAGS_cpu_math_threads=1 FLAGS_comm_timeout_s=20 WORLD_SIZE=2 KEEL_JOB_TOKEN=twice-test "
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
      std::to_string(FreePort()) + " ";
  // Rank 0 stays in the job for 4 s (it stalls before its first step), rank 1 joins, then a
  // second rank 1.
  const std::string worker = BinPath("mlp_dp_worker") + " --steps=2 --stall_rank=0 --stall_s=4";
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand("cd " + dir + " && (RANK=0 " + env + worker +
                      " > r0.log 2>&1 &) && "
                      "(RANK=1 " +
                      env + worker + " > r1.log 2>&1 &) && sleep 1 && RANK=1 " + env + worker +
                      "; code=$?; sleep 4; exit $code");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("rank 1 of 2 joined the job twice: this process (127.0.0.1 pid "),
            std::string::npos)
      << r.output;
  EXPECT_LT(secs, 15);
  RunCommand("rm -rf " + dir);
}

// Ranks given different settings fail at start, in seconds, naming what differs (not a silent
// divergence, not a hang for the comm timeout).
struct Mismatch {
  std::string name;
  std::string flags;     // `keel train` flags, $RANK expanded by the shell per worker
  std::string expected;  // in the workers' logs
};

class FleetMismatch : public ::testing::TestWithParam<Mismatch> {};

TEST_P(FleetMismatch, FailsAtStartNamingIt) {
  std::string dir = MakeTempDir();
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand("FLAGS_comm_timeout_s=120 " + Launch(2, dir) + "sh -c '" + BinPath("keel") +
                      " train --steps=5 --mlp_hidden=16 " + GetParam().flags + "'");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(secs, 30);
  auto logs = RunCommand("cat " + dir + "/log/workerlog.*");
  EXPECT_NE(logs.output.find(GetParam().expected), std::string::npos) << logs.output;
  RunCommand("rm -rf " + dir);
}

INSTANTIATE_TEST_SUITE_P(
    StartupAndRings, FleetMismatch,
    ::testing::Values(
        // The learning rate lives in the startup program only.
        Mismatch{"lr", "--lr=0.0$((1 + RANK))", "the startup program differs between ranks"},
        // With one fused group main uses ring 0 alone; startup creates 1 or 2 rings.
        Mismatch{"nccl_comm_num", "--nccl_comm_num=$((1 + RANK))",
                 "the startup program differs between ranks"},
        Mismatch{"cpu_comm_backend", "--cpu_comm_backend=$([ $RANK = 0 ] && echo shm || echo gloo)",
                 "rank 1 has cpu_comm_backend=gloo"}),
    [](const ::testing::TestParamInfo<Mismatch>& info) { return info.param.name; });

// Ranks on distinct GPUs build programs that differ only in per-rank attributes (c_comm_init's
// device_id, rank): the cross-rank check passes them, before any device call. Without two GPUs
// the workers then fail naming the device they cannot have; with two they train.
TEST(FleetStart, DistinctGpuIdsPassTheProgramCheck) {
  std::string dir = MakeTempDir();
  auto r = RunCommand("FLAGS_comm_timeout_s=60 " + BinPath("keel") +
                      " launch --selected_gpus=0,1 --log_dir=" + dir + "/log " + BinPath("keel") +
                      " train --steps=2 --mlp_hidden=16");
  auto logs = RunCommand("cat " + dir + "/log/workerlog.*");
  EXPECT_EQ(logs.output.find("differs between ranks"), std::string::npos) << logs.output;
  if (CudaDeviceCount() >= 2) {
    EXPECT_EQ(r.exit_code, 0) << r.output << logs.output;
  } else {
    EXPECT_NE(r.exit_code, 0) << r.output;
    // The device error names a missing device: rank 1's CUDAPlace(1), or rank 0's CUDAPlace(0)
    // when rank 0 fails first and the launcher stops rank 1 before it logs.
    EXPECT_NE(logs.output.find("CUDAPlace("), std::string::npos) << logs.output;
  }
  RunCommand("rm -rf " + dir);
}

// The pid of the process running with RANK=<rank> in its environment, among `pattern` matches.
int FindRankPid(const std::string& pattern, int rank) {
  auto r = RunCommand("pgrep -f '" + pattern + "'");
  std::istringstream in(r.output);
  int pid;
  while (in >> pid) {
    std::ifstream env("/proc/" + std::to_string(pid) + "/environ");
    std::string all((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    if (all.find(std::string("\0RANK=", 6) + std::to_string(rank) + '\0') != std::string::npos)
      return pid;
  }
  return -1;
}

TEST(FleetFaults, KillingAWorkerMidTrainingStopsTheJobWithin10sNamingIt) {
  std::string dir = MakeTempDir();
  std::string marker = "--seed=" + std::to_string(40000 + ::getpid() % 20000);
  std::string cmd = Launch(2, dir) + BinPath("keel") + " train --steps=1000000 --mlp_hidden=64 " +
                    marker + " > " + dir + "/out.txt 2>&1; echo $? > " + dir + "/rc.txt";
  std::thread job([&] { RunCommand(cmd); });
  int pid = -1;
  for (int i = 0; i < 200 && pid < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    // Mid-training: rank 0 has printed a few steps.
    if (RunCommand("grep -q '^step 3 ' " + dir + "/out.txt && echo yes").output != "yes\n")
      continue;
    pid = FindRankPid("train --steps=1000000 --mlp_hidden=64 " + marker, 1);
  }
  ASSERT_GT(pid, 0) << RunCommand("cat " + dir + "/out.txt").output;
  auto t0 = std::chrono::steady_clock::now();
  ::kill(pid, SIGKILL);
  job.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 10);
  std::string out = RunCommand("cat " + dir + "/out.txt").output;
  EXPECT_NE(RunCommand("cat " + dir + "/rc.txt").output, "0\n");
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
  EXPECT_NE(out.find("SIGKILL"), std::string::npos) << out;
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
