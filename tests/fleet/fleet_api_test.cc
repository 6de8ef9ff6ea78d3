// fleet's API as a user program meets it: minimize once per program, several programs per
// process, fleet::all_reduce and fleet::metrics, saving from rank 0 alone, barriers that fail fast
// on a peer that is gone or late, crash evidence in a worker's log; and `keel train` under
// `keel launch`: disjoint data shards and an evaluation sharded over the ranks.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "executor/executor.h"
#include "fleet/fleet.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/program_guard.h"
#include "models/mlp/mlp_model.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_data.h"

namespace keel::testing {
namespace {

std::string Launch(int n, const std::string& dir, const std::string& env = "") {
  return "FLAGS_cpu_math_threads=1 " + env + " timeout 120 " + BinPath("keel") +
         " launch --nproc_per_node=" + std::to_string(n) + " --log_dir=" + dir + "/log ";
}

std::string Worker(const std::string& c) { return BinPath("fleet_api_worker") + " --case=" + c; }

std::string Logs(const std::string& dir) {
  return RunCommand("cat " + dir + "/log/workerlog.*").output;
}

std::string Log(const std::string& dir, int rank) {
  std::ifstream in(dir + "/log/workerlog." + std::to_string(rank));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The seed MLP's loss on data vars x [-1, 32] and y, in the current ProgramGuard's programs.
Var MlpLoss() {
  return models::mlp(layers::data("x", {-1, 32}), layers::data("y", {-1, 1}, DType::kInt64), 4);
}

void InitOneWorker() {
  fleet::reset();
  fleet::init(fleet::UserDefinedRoleMaker(0, 1));
}

TEST(FleetMinimize, TwiceOnOneProgramIsAnErrorSayingSo) {
  InitOneWorker();
  Program main, startup;
  ProgramGuard g(main, startup);
  Var loss = MlpLoss();
  fleet::distributed_optimizer(optimizer::SGD(0.1f)).minimize(loss, &startup);
  const std::string before = main.ToText();
  try {
    fleet::distributed_optimizer(optimizer::Adam(0.1f)).minimize(loss, &startup);
    FAIL() << "a second minimize on one program was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "already called on this program")) << e.what();
  }
  EXPECT_EQ(main.ToText(), before);  // refused before touching the program
  // Another program is fine.
  Program main2, startup2;
  ProgramGuard g2(main2, startup2);
  EXPECT_NO_THROW(
      fleet::distributed_optimizer(optimizer::SGD(0.1f)).minimize(MlpLoss(), &startup2));
  fleet::reset();
}

// The learning rate after fleet's minimize: the DistributedOptimizer names its var, which a run
// fetches; the optimizer it copied says to ask it instead of naming "".
TEST(FleetMinimize, TheLearningRateVarIsTheDistributedOptimizers) {
  InitOneWorker();
  Program main, startup;
  ProgramGuard g(main, startup);
  Var loss = MlpLoss();
  optimizer::SGD sgd(0.25f);
  fleet::DistributedOptimizer d = fleet::distributed_optimizer(sgd);
  d.minimize(loss, &startup);
  Executor exe;
  exe.Run(startup);
  FeedMap feed{{"x", Tensor(DType::kFloat32, {2, 32})}, {"y", Tensor(DType::kInt64, {2, 1})}};
  std::memset(feed["x"].data<float>(), 0, 2 * 32 * sizeof(float));
  feed["y"].data<int64_t>()[0] = feed["y"].data<int64_t>()[1] = 1;
  EXPECT_EQ(exe.Run(main, feed, {d.learning_rate_var()})[0].item<float>(), 0.25f);
  try {
    sgd.learning_rate_var();
    ADD_FAILURE() << "the copied optimizer named a learning-rate var";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "DistributedOptimizer")) << e.what();
  }
  fleet::reset();
}

TEST(FleetAllReduce, OneWorkerLeavesTheTensorAndMetricsAreLocal) {
  fleet::reset();
  fleet::init(fleet::UserDefinedRoleMaker(0, 1));
  Tensor t(DType::kFloat32, DDim({2}));
  t.data<float>()[0] = 1.5f;
  t.data<float>()[1] = -2.0f;
  fleet::all_reduce(&t);
  EXPECT_EQ(t.data<float>()[0], 1.5f);
  EXPECT_EQ(t.data<float>()[1], -2.0f);
  EXPECT_EQ(fleet::metrics::acc(3, 4), 0.75);
  EXPECT_EQ(fleet::metrics::acc(0, 0), 0.0);
  EXPECT_EQ(fleet::metrics::sum(2.5), 2.5);
  fleet::reset();
}

TEST(FleetMultiProcess, TwoProgramsEachMinimizedOnceTrainOnTwoRanks) {
  std::string dir = MakeTempDir();
  auto r = RunCommand(Launch(2, dir) + Worker("two_programs"));
  EXPECT_EQ(r.exit_code, 0) << r.output << Logs(dir);
  EXPECT_TRUE(Contains(Logs(dir), "two_programs ok")) << Logs(dir);
  RunCommand("rm -rf " + dir);
}

TEST(FleetMultiProcess, AllReduceAndMetricsAreGlobalOnThreeRanks) {
  std::string dir = MakeTempDir();
  auto r = RunCommand(Launch(3, dir) + Worker("all_reduce"));
  EXPECT_EQ(r.exit_code, 0) << r.output << Logs(dir);
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(Contains(Log(dir, i), "all_reduce ok")) << "rank " << i << ": " << Log(dir, i);
  RunCommand("rm -rf " + dir);
}

TEST(FleetSave, RankZeroAloneSavesWithoutWaitingForAnyone) {
  std::string dir = MakeTempDir();
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand(Launch(2, dir) + Worker("save_rank0_only") + " --dir=" + dir + "/model");
  double secs = Seconds(t0);
  EXPECT_EQ(r.exit_code, 0) << r.output << Logs(dir);
  EXPECT_LT(secs, 60) << Logs(dir);
  EXPECT_TRUE(std::ifstream(dir + "/model/persistables.safetensors").good()) << Logs(dir);
  RunCommand("rm -rf " + dir);
}

TEST(FleetBarrier, APeerThatExitedFailsTheBarrierAtOnceNamingIt) {
  std::string dir = MakeTempDir();
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand(Launch(2, dir) + Worker("barrier_peer_gone"));
  double secs = Seconds(t0);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(secs, 20);  // not the 300 s comm timeout
  std::string log = Logs(dir);
  EXPECT_TRUE(Contains(log, "barrier_worker: rank 0 of 2")) << log;
  EXPECT_TRUE(Contains(log, "rank 1 closed its store connection")) << log;
  RunCommand("rm -rf " + dir);
}

TEST(FleetBarrier, ALatePeerIsNamedAfterTheCommTimeout) {
  std::string dir = MakeTempDir();
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand(Launch(2, dir, "FLAGS_comm_timeout_s=3") + Worker("barrier_peer_late"));
  double secs = Seconds(t0);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(secs, 30);
  std::string log = Logs(dir);
  EXPECT_TRUE(Contains(log, "rank(s) 1 never arrived")) << log;
  EXPECT_TRUE(Contains(log, "FLAGS_comm_timeout_s")) << log;
  RunCommand("rm -rf " + dir);
}

TEST(CrashEvidence, AWorkerKilledByASignalLeavesItsOutputAndAStackTraceInItsLog) {
  std::string dir = MakeTempDir();
  auto r = RunCommand(Launch(2, dir) + Worker("segfault"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  std::string log = Log(dir, 1);
  EXPECT_TRUE(Contains(log, "rank 1 about to crash")) << log;  // stdout, line-buffered
  EXPECT_TRUE(Contains(log, "*** SIGSEGV")) << log;
  EXPECT_TRUE(Contains(log, "stack trace")) << log;
  EXPECT_TRUE(Contains(log, "CrashNow")) << log;           // a symbolized frame
  EXPECT_TRUE(Contains(r.output, "SIGSEGV")) << r.output;  // the launcher names the signal
  RunCommand("rm -rf " + dir);
}

// ---------------------------------------------------------------- keel train under keel launch

// rank -> every sample index its "samples epoch <epoch> rank R: ..." lines list.
std::map<int, std::vector<int64_t>> SampleIds(const std::string& log, int epoch) {
  std::map<int, std::vector<int64_t>> ids;
  std::istringstream lines(log);
  std::string line;
  const std::string head = "samples epoch " + std::to_string(epoch) + " rank ";
  while (std::getline(lines, line)) {
    size_t at = line.find(head);
    if (at == std::string::npos) continue;
    std::istringstream in(line.substr(at + head.size()));
    int rank;
    char colon;
    in >> rank >> colon;
    for (int64_t id; in >> id;) ids[rank].push_back(id);
  }
  return ids;
}

void ExpectDisjointShardsCoveringTheTrainingSet(const std::string& extra_flags) {
  if (!HaveMnist()) GTEST_SKIP() << "no MNIST in " << MnistDir();
  const std::string mnist = MnistDir();
  std::string dir = MakeTempDir();
  auto r = RunCommand(
      Launch(2, dir) + BinPath("keel") + " train --model=lenet --data=mnist:" + mnist +
      " --epochs=1 --batch_size=100 --fetch_frequency=1000 " + "--log_sample_ids " + extra_flags);
  ASSERT_EQ(r.exit_code, 0) << r.output << Logs(dir);
  auto ids = SampleIds(Logs(dir), 0);
  ASSERT_EQ(ids.size(), 2u) << Logs(dir);
  std::set<int64_t> r0(ids[0].begin(), ids[0].end()), r1(ids[1].begin(), ids[1].end());
  EXPECT_EQ(ids[0].size(), 4000u);
  EXPECT_EQ(ids[1].size(), 4000u);
  EXPECT_EQ(r0.size(), 4000u);  // no repeats inside a shard
  EXPECT_EQ(r1.size(), 4000u);
  std::set<int64_t> all = r0;
  all.insert(r1.begin(), r1.end());
  EXPECT_EQ(all.size(), 8000u) << "overlap between the ranks' shards";
  EXPECT_EQ(*all.begin(), 0);
  EXPECT_EQ(*all.rbegin(), 7999);
  RunCommand("rm -rf " + dir);
}

TEST(KeelTrainUnderLaunch, LenetRanksTakeDisjointShardsOfOneShuffle) {
  ExpectDisjointShardsCoveringTheTrainingSet("--seed=5");
}

TEST(KeelTrainUnderLaunch, LenetRanksAgreeOnTheShuffleWithoutASeed) {
  ExpectDisjointShardsCoveringTheTrainingSet("");
}

double TestAccuracy(const std::string& out, long long* samples) {
  std::istringstream lines(out);
  std::string line;
  double acc = -1;
  while (std::getline(lines, line)) {
    long long epoch;
    double a;
    if (std::sscanf(line.c_str(), "epoch %lld test_accuracy %lf (%lld test samples)", &epoch, &a,
                    samples) == 3)
      acc = a;
  }
  return acc;
}

TEST(KeelTrainUnderLaunch, LenetEvaluatesAShardPerRankAndReportsTheGlobalAccuracy) {
  if (!HaveMnist()) GTEST_SKIP() << "no MNIST in " << MnistDir();
  const std::string mnist = MnistDir();
  std::string dir = MakeTempDir();
  const std::string train = BinPath("keel") + " train --model=lenet --data=mnist:" + mnist +
                            " --epochs=1 --fetch_frequency=1000 --seed=2";
  // Two ranks on 64 samples each see the samples one rank sees on 128 per step.
  auto two = RunCommand(Launch(2, dir) + train + " --batch_size=64");
  ASSERT_EQ(two.exit_code, 0) << two.output << Logs(dir);
  auto one = RunCommand("FLAGS_cpu_math_threads=1 " + train + " --batch_size=128");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  long long n2 = 0, n1 = 0;
  double a2 = TestAccuracy(two.output, &n2), a1 = TestAccuracy(one.output, &n1);
  EXPECT_EQ(n2, 2000) << two.output;  // 1,000 per rank, summed
  EXPECT_EQ(n1, 2000) << one.output;
  EXPECT_GT(a1, 0.5) << one.output;
  EXPECT_NEAR(a2, a1, 1.5e-3) << two.output << one.output;  // within a sample or two
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
