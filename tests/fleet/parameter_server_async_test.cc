// Asynchronous parameter-server training (a_sync=true) in real processes on loopback
// (tests/workers/ps_worker.cc under keel launch --server_num --worker_num): every trainer's
// gradient is applied on its own, as it arrives, exactly once (checked exactly on a model whose
// gradients do not depend on the parameters, so SGD's result does not depend on the order of the
// updates); the MLP trains to the loss sync reaches; trainers may stop after different numbers of
// steps; a trainer that dies ends the job naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

struct Job {
  std::string output;
  int exit_code = -1;
};

Job Launch(int servers, int trainers, const std::string& dir, const std::string& flags) {
  const std::string worker = BinPath("ps_worker") + " --out=" + dir + "/save" + flags;
  const std::string cmd =
      servers == 0 ? worker
                   : "FLAGS_cpu_math_threads=1 FLAGS_comm_timeout_s=20 " + Keel() +
                         " launch --server_num=" + std::to_string(servers) +
                         " --worker_num=" + std::to_string(trainers) + " --log_dir=" + dir +
                         "/log " + worker + " 2>&1; rc=$?; tail -n 5 " + dir + "/log/*; exit $rc";
  CommandResult r = RunCommand(cmd);
  return {cmd + "\n" + r.output, r.exit_code};
}

std::map<std::string, std::vector<float>> Load(const std::string& file) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : LoadSafetensors(file))
    out[name] = std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
  return out;
}

// trainer 0's loss at `step` as it printed it ("trainer 0 step S loss L").
double LossAt(const std::string& output, int step) {
  const std::string key = "trainer 0 step " + std::to_string(step) + " loss ";
  const size_t at = output.find(key);
  if (at == std::string::npos) return NAN;
  return std::strtod(output.c_str() + at + key.size(), nullptr);
}

// mean(fc(x, 256)): d/dW = column means of x / 256, d/db = 1/256, whatever W and b. Async SGD
// with rate r on 2 trainers x 8 rows applies each trainer's gradient once: the servers end at
// init - r * sum of all trainers' gradients, which is one process on the 16 rows (mean gradient)
// with rate 2r. A server that averaged over trainers (sync's 1/N), dropped or repeated a gradient
// would be off by a whole step's update.
TEST(ParameterServerAsync, EveryTrainersGradientIsAppliedOnce) {
  const std::string dir = MakeTempDir();
  const std::string flags = " --linear --rows=16 --steps=4";
  Job one = Launch(0, 1, dir + "/one", flags + " --lr=1.0");
  Job ps = Launch(2, 2, dir + "/ps", flags + " --lr=0.5 --mode=async");
  Job none = Launch(0, 1, dir + "/none", " --linear --rows=16 --steps=0");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(ps.exit_code, 0) << ps.output;
  ASSERT_EQ(none.exit_code, 0) << none.output;
  auto ref = Load(dir + "/one/save/" + kPersistablesFile);
  auto init = Load(dir + "/none/save/" + kPersistablesFile);
  // The servers' blocks once every trainer stopped: fc_0.w_0 in two blocks (server 0, server 1),
  // fc_0.b_0 on server 0.
  auto s0 = Load(dir + "/ps/save/server0/" + kPersistablesFile);
  auto s1 = Load(dir + "/ps/save/server1/" + kPersistablesFile);
  ASSERT_TRUE(s0.count("fc_0.w_0.block0") && s1.count("fc_0.w_0.block1") && s0.count("fc_0.b_0"))
      << ps.output;
  std::vector<float> w = s0["fc_0.w_0.block0"];
  w.insert(w.end(), s1["fc_0.w_0.block1"].begin(), s1["fc_0.w_0.block1"].end());
  const std::map<std::string, std::vector<float>> got = {{"fc_0.w_0", w},
                                                         {"fc_0.b_0", s0["fc_0.b_0"]}};
  double diff = 0, moved = 0;
  for (const auto& [name, g] : got) {
    ASSERT_EQ(g.size(), ref[name].size()) << name;
    for (size_t i = 0; i < g.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::abs(g[i] - ref[name][i])));
      moved = std::max(moved, static_cast<double>(std::abs(g[i] - init[name][i])));
    }
  }
  std::printf(
      "async parameter server, 2 servers x 2 trainers x 8 rows, SGD 0.5, 4 steps vs 1 process x "
      "16 rows, SGD 1.0: max abs difference %.3g (parameters moved up to %.3g)\n",
      diff, moved);
  EXPECT_LT(diff, 1e-6) << ps.output;
  EXPECT_GT(moved, 1e-3);
  RunCommand("rm -rf " + dir);
}

// The MLP on one fixed batch of 16 rows, 30 steps, SGD 0.5: async reaches the loss sync reaches
// (below 0.05 from about 2.4).
TEST(ParameterServerAsync, MlpLossFallsToSyncsTarget) {
  const std::string dir = MakeTempDir();
  const std::string flags = " --same_batch --rows=16 --steps=30";
  Job sync = Launch(2, 2, dir + "/sync", flags + " --mode=sync");
  Job async = Launch(2, 2, dir + "/async", flags + " --mode=async");
  ASSERT_EQ(sync.exit_code, 0) << sync.output;
  ASSERT_EQ(async.exit_code, 0) << async.output;
  const double s0 = LossAt(sync.output, 0), s29 = LossAt(sync.output, 29);
  const double a0 = LossAt(async.output, 0), a29 = LossAt(async.output, 29);
  std::printf(
      "MLP, 2 servers x 2 trainers, same batch, SGD 0.5: trainer 0's loss step 0 -> 29: sync "
      "%.4f -> %.4f, async %.4f -> %.4f\n",
      s0, s29, a0, a29);
  EXPECT_GT(s0, 2.0) << sync.output;
  EXPECT_LT(s29, 0.05) << sync.output;
  EXPECT_GT(a0, 2.0) << async.output;
  EXPECT_LT(a29, 0.05) << async.output;
  RunCommand("rm -rf " + dir);
}

// Trainers stop after different numbers of steps (trainer 1 one fewer): in async mode that is
// fine; the servers stop once both called stop_worker.
TEST(ParameterServerAsync, TrainersMayRunDifferentStepCounts) {
  const std::string dir = MakeTempDir();
  const auto t0 = std::chrono::steady_clock::now();
  Job r = Launch(2, 2, dir, " --mode=async --steps=4 --short_trainer=1");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "trainer 0 trained 4 steps")) << r.output;
  EXPECT_LT(s, 15) << r.output;
  RunCommand("rm -rf " + dir);
}

// A trainer that exits mid-training without stop_worker: the job ends within seconds, naming it.
TEST(ParameterServerAsync, DeadTrainerEndsTheJobNamingIt) {
  const std::string dir = MakeTempDir();
  const auto t0 = std::chrono::steady_clock::now();
  Job r = Launch(1, 2, dir, " --mode=async --steps=6 --die_trainer=1");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "trainer 1")) << r.output;
  EXPECT_LT(s, 10) << r.output;
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
