// Asynchronous and GEO parameter-server training (a_sync=true; k_steps > 0: GEO) in real processes
// on loopback
// (tests/workers/ps_worker.cc under keel launch --server_num --worker_num): every trainer's
// gradient is applied on its own, as it arrives, exactly once (checked exactly on a model whose
// gradients do not depend on the parameters, so SGD's result does not depend on the order of the
// updates); the MLP trains to the loss sync reaches; trainers may stop after different numbers of
// steps; a trainer that dies ends the job naming it. GEO's formulas (delta = (local - old) / N
// added on the server every k steps) exactly on a two-trainer toy; the MLP trains in GEO mode too.
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

// The servers' fc_0.w_0 (two blocks: server 0, server 1) and fc_0.b_0 (server 0) once every
// trainer stopped, as ps_worker's servers wrote them.
std::map<std::string, std::vector<float>> ServersLinear(const std::string& save) {
  auto s0 = Load(save + "/server0/" + kPersistablesFile);
  auto s1 = Load(save + "/server1/" + kPersistablesFile);
  if (!s0.count("fc_0.w_0.block0") || !s1.count("fc_0.w_0.block1") || !s0.count("fc_0.b_0"))
    return {};
  std::vector<float> w = s0["fc_0.w_0.block0"];
  w.insert(w.end(), s1["fc_0.w_0.block1"].begin(), s1["fc_0.w_0.block1"].end());
  return {{"fc_0.w_0", w}, {"fc_0.b_0", s0["fc_0.b_0"]}};
}

// Largest |a - b| over the vars of `a`.
double MaxDiff(const std::map<std::string, std::vector<float>>& a,
               std::map<std::string, std::vector<float>> b) {
  double d = 0;
  for (const auto& [name, x] : a) {
    EXPECT_EQ(x.size(), b[name].size()) << name;
    for (size_t i = 0; i < x.size() && i < b[name].size(); ++i)
      d = std::max(d, static_cast<double>(std::abs(x[i] - b[name][i])));
  }
  return d;
}

// mean(fc(x, 256)): d/dW = column means of x / 256, d/db = 1/256, whatever W and b. Async SGD
// with rate r on 2 trainers x 8 rows applies each trainer's gradient once: the servers end at
// init - r * sum of all trainers' gradients, which is one process on the 16 rows (mean gradient)
// with rate 2r. A server that averaged over trainers (sync's 1/N), dropped or repeated a gradient
// would be off by a whole step's update.
TEST(ParameterServerAsync, EveryTrainersGradientIsAppliedOnce) {
  const std::string dir = MakeTempDir();
  const std::string flags = " --linear --rows=16 --steps=8";
  Job one = Launch(0, 1, dir + "/one", flags + " --lr=1.0");
  Job none = Launch(0, 1, dir + "/none", " --linear --rows=16 --steps=0");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(none.exit_code, 0) << none.output;
  auto ref = Load(dir + "/one/save/" + kPersistablesFile);
  auto init = Load(dir + "/none/save/" + kPersistablesFile);
  // The trainers' communicator as Paddle's defaults make it (a queue of 16 steps, no merging), one
  // that merges up to 4 queued steps into one push (SGD: by sum), and none (each step pushes and
  // pulls in the trainer's thread).
  for (const char* queue :
       {"", " --send_queue_size=4 --max_merge_var_num=4", " --send_queue_size=0"}) {
    SCOPED_TRACE(queue);
    RunCommand("rm -rf " + dir + "/ps");
    Job ps = Launch(2, 2, dir + "/ps", flags + " --lr=0.5 --mode=async" + queue);
    ASSERT_EQ(ps.exit_code, 0) << ps.output;
    const auto got = ServersLinear(dir + "/ps/save");
    ASSERT_EQ(got.size(), 2u) << ps.output;
    const double diff = MaxDiff(got, ref), moved = MaxDiff(got, init);
    const CommandResult pushes = RunCommand("grep -h 'communicator pushed' " + dir + "/ps/log/*");
    std::printf(
        "async parameter server%s, 2 servers x 2 trainers x 8 rows, SGD 0.5, 8 steps vs 1 process "
        "x 16 rows, SGD 1.0: max abs difference %.3g (parameters moved up to %.3g)\n%s",
        queue, diff, moved, pushes.output.c_str());
    EXPECT_LT(diff, 1e-6) << ps.output;
    EXPECT_GT(moved, 1e-3);
  }
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

// One trainer with the communicator (Paddle's default queue of 16): with keel's max_staleness 0
// each step waits for the parameters pulled after its previous push, so the trainer computes
// exactly what one process computes, step by step (the losses it prints). A trainer whose step
// took the latest parameters pulled so far, as Paddle's communicator hands them, computed its
// next steps on parameters without its own previous update (this MLP's step is far shorter than
// a push and its pull), and its losses fell behind one process's.
TEST(ParameterServerAsync, OneTrainerWithTheCommunicatorTrainsAsOneProcess) {
  const std::string dir = MakeTempDir();
  const std::string flags = " --same_batch --rows=16 --steps=12 --lr=0.5 --every_loss";
  Job one = Launch(0, 1, dir + "/one", flags);
  Job ps = Launch(2, 1, dir + "/ps", flags + " --mode=async");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(ps.exit_code, 0) << ps.output;
  double worst = 0;
  for (int step = 0; step < 12; ++step) {
    const double a = LossAt(one.output, step), b = LossAt(ps.output, step);
    ASSERT_FALSE(std::isnan(a) || std::isnan(b)) << step << "\n" << one.output << ps.output;
    worst = std::max(worst, std::abs(a - b) / std::max(1.0, std::abs(a)));
  }
  std::printf(
      "MLP, 2 servers x 1 trainer, async with the communicator vs 1 process, 12 steps of SGD "
      "0.5: largest relative loss difference %.3g (loss %.4f -> %.4f)\n",
      worst, LossAt(one.output, 0), LossAt(one.output, 11));
  EXPECT_LT(worst, 1e-5) << one.output << ps.output;
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

// A server killed (SIGKILL) after serving 4 trainer steps: the job ends within seconds, the
// trainers naming the server (no trainer waits out the comm timeout).
TEST(ParameterServerAsync, DeadServerEndsTheJobNamingIt) {
  const std::string dir = MakeTempDir();
  const auto t0 = std::chrono::steady_clock::now();
  Job r = Launch(1, 2, dir, " --mode=async --steps=6 --fault_point=listen_and_serv_step3");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "server 0 (rank 0)")) << r.output;
  EXPECT_LT(s, 10) << r.output;
  RunCommand("rm -rf " + dir);
}

// GEO every k=2 steps, SGD 0.5, 2 trainers on 8 rows each, the same rows every step: trainer t's
// gradient is a constant g_t (linear model), so after k local steps from the last synced value
// its delta is (latest - old) / 2 = -k * 0.5 * g_t / 2 whatever it started from, and the servers
// add both: they end at init - steps * 0.5 * (g_0 + g_1) / 2, one process on the 16 rows with
// SGD 0.5. Three steps: the third is local only (never pushed), so the servers hold what one
// process has after two steps. Without the 1/N the servers would move twice as far; pushing
// every step, or the third, would hold three steps.
TEST(ParameterServerGeo, DeltasOverTrainersAreAddedEveryKSteps) {
  const std::string dir = MakeTempDir();
  const std::string flags = " --linear --same_batch --rows=16 --lr=0.5";
  Job two = Launch(0, 1, dir + "/two", flags + " --steps=2");
  Job three = Launch(0, 1, dir + "/three", flags + " --steps=3");
  Job geo = Launch(2, 2, dir + "/geo", flags + " --steps=3 --mode=geo --geo_k=2");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  ASSERT_EQ(three.exit_code, 0) << three.output;
  ASSERT_EQ(geo.exit_code, 0) << geo.output;
  const auto got = ServersLinear(dir + "/geo/save");
  ASSERT_EQ(got.size(), 2u) << geo.output;
  const double diff = MaxDiff(got, Load(dir + "/two/save/" + kPersistablesFile));
  const double off = MaxDiff(got, Load(dir + "/three/save/" + kPersistablesFile));
  std::printf(
      "GEO k=2, 2 servers x 2 trainers x 8 rows, SGD 0.5, 3 steps vs 1 process x 16 rows, 2 "
      "steps: max abs difference %.3g (vs 3 steps: %.3g)\n",
      diff, off);
  EXPECT_LT(diff, 1e-6) << geo.output;
  EXPECT_GT(off, 1e-3);
  RunCommand("rm -rf " + dir);
}

// The MLP on one fixed batch, 30 steps, GEO every 2 steps: the loss reaches sync's target.
TEST(ParameterServerGeo, MlpLossFallsToSyncsTarget) {
  const std::string dir = MakeTempDir();
  Job geo = Launch(2, 2, dir, " --same_batch --rows=16 --steps=30 --mode=geo --geo_k=2");
  ASSERT_EQ(geo.exit_code, 0) << geo.output;
  const double g0 = LossAt(geo.output, 0), g29 = LossAt(geo.output, 29);
  std::printf("MLP, GEO k=2, 2 servers x 2 trainers, same batch: trainer 0's loss %.4f -> %.4f\n",
              g0, g29);
  EXPECT_GT(g0, 2.0) << geo.output;
  EXPECT_LT(g29, 0.05) << geo.output;
  RunCommand("rm -rf " + dir);
}

// A GEO trainer that exits mid-training without stop_worker ends the job within seconds, named.
TEST(ParameterServerGeo, DeadTrainerEndsTheJobNamingIt) {
  const std::string dir = MakeTempDir();
  const auto t0 = std::chrono::steady_clock::now();
  Job r = Launch(2, 2, dir, " --mode=geo --geo_k=2 --steps=6 --die_trainer=1");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "trainer 1")) << r.output;
  EXPECT_LT(s, 10) << r.output;
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
