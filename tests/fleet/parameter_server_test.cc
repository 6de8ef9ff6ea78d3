// Synchronous parameter-server training in real processes on loopback (tests/workers/ps_worker.cc
// under keel launch --server_num --worker_num): W trainers on b rows each train to the parameters
// of one process on W x b rows (SGD and Adam on 2 servers x 2 trainers, SGD on 1 server x 2
// trainers), float rounding only, with fc_0.w_0 cut into blocks on both servers; unequal step
// counts end the job naming the trainers instead of hanging.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

struct Trained {
  NamedTensors params;
  std::string output;
  int exit_code = -1;
};

// One process (servers == 0) or a parameter-server job; the parameters trainer 0 wrote.
Trained Train(int servers, int trainers, const std::string& dir, const std::string& flags) {
  const std::string worker = BinPath("ps_worker") + " --out=" + dir + "/save" + flags;
  const std::string cmd =
      servers == 0 ? worker
                   : "FLAGS_cpu_math_threads=1 FLAGS_comm_timeout_s=20 " + Keel() +
                         " launch --server_num=" + std::to_string(servers) +
                         " --worker_num=" + std::to_string(trainers) + " --log_dir=" + dir +
                         "/log " + worker + " 2>&1; rc=$?; tail -n 5 " + dir + "/log/*; exit $rc";
  CommandResult r = RunCommand(cmd);
  Trained out;
  out.output = cmd + "\n" + r.output;
  out.exit_code = r.exit_code;
  if (r.exit_code == 0) out.params = LoadSafetensors(dir + "/save/" + kPersistablesFile);
  return out;
}

double MaxAbsDiff(const NamedTensors& got, const NamedTensors& ref) {
  double worst = 0;
  EXPECT_EQ(got.size(), ref.size());
  for (const auto& [name, r] : ref) {
    const Tensor* g = nullptr;
    for (const auto& kv : got)
      if (kv.first == name) g = &kv.second;
    EXPECT_NE(g, nullptr) << name;
    if (g == nullptr || g->dims() != r.dims()) {
      ADD_FAILURE() << name << " missing or of other dims";
      continue;
    }
    for (int64_t i = 0; i < r.numel(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(r.data<float>()[i]) -
                                       static_cast<double>(g->data<float>()[i])));
  }
  return worst;
}

void ExpectSyncEqualsOneProcess(int servers, const std::string& optimizer,
                                const std::string& more = "") {
  SCOPED_TRACE(optimizer + " on " + std::to_string(servers) + " server(s)" + more);
  const std::string dir = MakeTempDir();
  const std::string flags = " --optimizer=" + optimizer + " --rows=16 --steps=4" + more;
  Trained one = Train(0, 1, dir + "/one", flags);
  Trained ps = Train(servers, 2, dir + "/ps", flags);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(ps.exit_code, 0) << ps.output;
  ASSERT_EQ(ps.params.size(), 4u) << ps.output;
  const double diff = MaxAbsDiff(ps.params, one.params);
  std::printf(
      "sync parameter server, %d server(s) x 2 trainers x 8 rows vs 1 process x 16 rows, %s, "
      "4 steps%s: max abs difference %.3g over the parameters\n",
      servers, optimizer.c_str(), more.c_str(), diff);
  EXPECT_LT(diff, 1e-5) << ps.output;
  // The job really moved the parameters (a run that trained nothing would also be "equal" to
  // an untrained reference only if both were untrained): compare with the initial values.
  Trained none = Train(0, 1, dir + "/none", " --optimizer=" + optimizer + " --rows=16 --steps=0");
  ASSERT_EQ(none.exit_code, 0) << none.output;
  EXPECT_GT(MaxAbsDiff(ps.params, none.params), 1e-3);
  RunCommand("rm -rf " + dir);
}

TEST(ParameterServer, SyncTwoServersTwoTrainersSgdEqualsOneProcess) {
  ExpectSyncEqualsOneProcess(2, "sgd");
}

TEST(ParameterServer, SyncTwoServersTwoTrainersAdamEqualsOneProcess) {
  ExpectSyncEqualsOneProcess(2, "adam");
}

// Momentum, and a learning-rate schedule (tenfold drop after step 2) that each server runs once
// per step in its lr_decay block: a schedule run per block, or not at all, would not match.
TEST(ParameterServer, SyncTwoServersMomentumWithPiecewiseRateEqualsOneProcess) {
  ExpectSyncEqualsOneProcess(2, "momentum", " --piecewise");
}

TEST(ParameterServer, SyncOneServerTwoTrainersSgdEqualsOneProcess) {
  ExpectSyncEqualsOneProcess(1, "sgd");
}

// Trainer 1 runs 3 steps, trainer 0 four: the servers find it at step 4 and end the job, naming
// both trainers, within seconds (not the comm timeout, not a hang).
TEST(ParameterServer, UnequalStepCountsAreNamed) {
  const std::string dir = MakeTempDir();
  const auto t0 = std::chrono::steady_clock::now();
  Trained r = Train(1, 2, dir, " --steps=4 --short_trainer=1");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "trainer 1 stopped after 3 steps while trainer 0 started step 4"))
      << r.output;
  EXPECT_LT(s, 15) << r.output;
  RunCommand("rm -rf " + dir);
}

// Trainer 0's checkpoint holds what one process's holds (parameters, Adam's moments and beta
// powers, the learning rate: the same names and dims, so the single-device program loads it) with
// the same values, the state pulled from both servers and reassembled from its blocks.
TEST(ParameterServer, TrainerZerosCheckpointIsCompleteAndEqualsOneProcess) {
  const std::string dir = MakeTempDir();
  const std::string flags = " --optimizer=adam --rows=16 --steps=3 --checkpoint";
  Trained one = Train(0, 1, dir + "/one", flags);
  Trained ps = Train(2, 2, dir + "/ps", flags);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(ps.exit_code, 0) << ps.output;
  EXPECT_EQ(ps.params.size(), 4u * 5 + 1) << ps.output;  // 4 x (param, 2 moments, 2 powers), rate
  const double diff = MaxAbsDiff(ps.params, one.params);
  std::printf(
      "sync parameter server checkpoint, 2 servers x 2 trainers, adam, 3 steps: max abs "
      "difference %.3g over parameters and optimizer state\n",
      diff);
  EXPECT_LT(diff, 1e-5) << ps.output;
  RunCommand("rm -rf " + dir);
}

// A server killed (SIGKILL) at its third step: the job ends within seconds, not at the comm
// timeout (20 s here) nor Paddle's 900 s, and the trainers' errors name the server.
TEST(ParameterServer, DeadServerEndsTheJobNamingIt) {
  const std::string dir = MakeTempDir();
  const auto t0 = std::chrono::steady_clock::now();
  Trained r = Train(1, 2, dir, " --steps=6 --fault_point=listen_and_serv_step3");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "server 0 (rank 0)")) << r.output;
  EXPECT_LT(s, 10) << r.output;
  RunCommand("rm -rf " + dir);
}

// A trainer that exits mid-training (without stop_worker): the job ends within seconds, the
// launcher and the servers naming trainer 1; the other trainer does not wait for the comm timeout.
TEST(ParameterServer, DeadTrainerEndsTheJobNamingIt) {
  const std::string dir = MakeTempDir();
  const auto t0 = std::chrono::steady_clock::now();
  Trained r = Train(1, 2, dir, " --steps=6 --die_trainer=1");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "trainer 1")) << r.output;
  EXPECT_LT(s, 10) << r.output;
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
