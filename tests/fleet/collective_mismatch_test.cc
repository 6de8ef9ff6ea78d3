// A collective that only some ranks call (a metric inside `if (fleet::is_first_worker())`, a
// step one rank skips) fails within seconds on every rank, naming each rank's call in the user's
// words, over shared memory and over Gloo; ranks that are merely late are left alone. Real
// processes under `keel launch` (tests/workers/mismatch_worker.cc); the report's text itself is
// tested in tests/comm/collective_watch_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

struct Outcome {
  CommandResult result;
  double seconds = 0;
  std::string log[3];
};

// --comm_timeout_s=60: without the watch every case below would fail only after a minute.
Outcome RunCase(const std::string& c, const std::string& backend, int nproc = 2) {
  const std::string dir = MakeTempDir();
  const auto t0 = std::chrono::steady_clock::now();
  Outcome o;
  o.result = RunCommand(
      "FLAGS_cpu_math_threads=1 FLAGS_comm_timeout_s=60 FLAGS_cpu_comm_backend=" + backend +
      " timeout 150 " + BinPath("keel") + " launch --nproc_per_node=" + std::to_string(nproc) +
      " --log_dir=" + dir + "/log " + BinPath("mismatch_worker") + " --case=" + c);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < nproc; ++r) {
    std::ifstream in(dir + "/log/workerlog." + std::to_string(r));
    o.log[r].assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  RunCommand("rm -rf " + dir);
  return o;
}

// Every rank failed with the report, which names `call0` on rank 0 and `call1` on rank 1, soon
// (the worker lingers 4 s after its error; the comm timeout is 60 s).
void ExpectReported(const Outcome& o, const std::string& call0, const std::string& call1) {
  const std::string all =
      o.result.output + "\n--- rank 0\n" + o.log[0] + "\n--- rank 1\n" + o.log[1];
  EXPECT_NE(o.result.exit_code, 0) << all;
  EXPECT_LT(o.seconds, 30) << all;
  for (int r = 0; r < 2; ++r) {
    const std::string& log = o.log[r];
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(Contains(log,
                         "collective mismatch: ranks 0 and 1 wait in collective calls that "
                         "cannot complete together"))
        << all;
    EXPECT_TRUE(Contains(log, "  rank 0: " + call0)) << all;
    EXPECT_TRUE(Contains(log, "  rank 1: " + call1)) << all;
    // In the user's words: neither fleet's internal ring id nor store keys.
    EXPECT_FALSE(Contains(log, "2147483647")) << all;
    EXPECT_FALSE(Contains(log, "keel/")) << all;
    EXPECT_FALSE(Contains(log, "timed out")) << all;
  }
}

TEST(CollectiveMismatch, AMetricOnRankZeroAgainstABarrierOnRankOneFailsAtOnceNamingBoth) {
  for (const char* backend : {"shm", "gloo"}) {
    SCOPED_TRACE(backend);
    // fleet call #1 is fleet::init's comparison of the ring configuration.
    ExpectReported(RunCase("sum_vs_barrier", backend),
                   "fleet::metrics::sum (fleet call #2; setting up fleet's eager ring)",
                   "fleet::barrier_worker (fleet call #2)");
  }
}

TEST(CollectiveMismatch, AMetricAgainstABarrierOnFleetsEagerRingFailsAtOnce) {
  for (const char* backend : {"shm", "gloo"}) {
    SCOPED_TRACE(backend);
    ExpectReported(RunCase("warm_sum_vs_barrier", backend),
                   "fleet::metrics::sum (fleet call #3; on fleet's eager ring, collective #2)",
                   "fleet::barrier_worker (fleet call #3)");
  }
}

TEST(CollectiveMismatch, AMetricOnRankZeroAgainstATrainingStepOnRankOneFailsAtOnce) {
  for (const char* backend : {"shm", "gloo"}) {
    SCOPED_TRACE(backend);
    // Calls: init's check, minimize's two program checks, the metric every rank made.
    const Outcome o = RunCase("sum_vs_step", backend);
    ExpectReported(o, "fleet::metrics::sum (fleet call #5; on fleet's eager ring, collective #2)",
                   "op c_allreduce_sum of ");
    for (int r = 0; r < 2; ++r)
      EXPECT_TRUE(Contains(o.log[r], " in run 3 of its program (ring 0, collective #")) << o.log[r];
  }
}

// Three ranks on Gloo: rank 0 in the metric, ranks 1 and 2 in the step's all-reduce. The rank
// that finds the mismatch closes its ring's connections; the other rank in the all-reduce then
// finds a failed connection under its wait, and must still say why: the report, not the broken
// connection.
TEST(CollectiveMismatch, OnThreeGlooRanksEveryRankGivesTheReportNotTheClosedConnection) {
  const Outcome o = RunCase("sum_vs_step", "gloo", 3);
  const std::string all = o.result.output + "\n--- rank 0\n" + o.log[0] + "\n--- rank 1\n" +
                          o.log[1] + "\n--- rank 2\n" + o.log[2];
  EXPECT_NE(o.result.exit_code, 0) << all;
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(Contains(o.log[r], "collective mismatch: ranks 0 and 1 wait in collective calls"))
        << all;
    EXPECT_FALSE(Contains(o.log[r], "rank " + std::to_string(r) + ": ") &&
                 Contains(o.log[r], "failed: the connection"))
        << all;
  }
}

// Rank 1's program returns while rank 0 sets up fleet's eager ring, a wait on the store that a
// rank which exited cannot otherwise end before the comm timeout.
TEST(CollectiveMismatch, AMetricThatARankWhichExitedNeverMadeFailsAtOnce) {
  for (const char* backend : {"shm", "gloo"}) {
    SCOPED_TRACE(backend);
    const Outcome o = RunCase("sum_after_peer_exit", backend);
    const std::string all =
        o.result.output + "\n--- rank 0\n" + o.log[0] + "\n--- rank 1\n" + o.log[1];
    EXPECT_NE(o.result.exit_code, 0) << all;
    EXPECT_LT(o.seconds, 30) << all;
    EXPECT_TRUE(Contains(o.log[1], "sum_after_peer_exit ok")) << all;
    EXPECT_TRUE(Contains(o.log[0],
                         "collective mismatch: rank 1 exited while rank 0 waits in a collective "
                         "call it would have to join:\n"
                         "  rank 0: fleet::metrics::sum (fleet call #2; setting up fleet's eager "
                         "ring)\n"
                         "  rank 1: exited after fleet call #1 (its program returned or called "
                         "exit)"))
        << all;
  }
}

TEST(CollectiveMismatch, RanksThatAreOnlyLateAreLeftToMeet) {
  for (const char* backend : {"shm", "gloo"}) {
    SCOPED_TRACE(backend);
    const Outcome o = RunCase("slow_peer", backend);
    EXPECT_EQ(o.result.exit_code, 0) << o.result.output << o.log[0] << o.log[1];
    EXPECT_TRUE(Contains(o.log[0], "slow_peer ok")) << o.log[0];
    EXPECT_TRUE(Contains(o.log[1], "slow_peer ok")) << o.log[1];
  }
}

}  // namespace
}  // namespace keel::testing
