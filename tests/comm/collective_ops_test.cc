// Every collective op on 2, 3 and 4 real processes, over shared memory and over Gloo on loopback,
// for f32, f64, i32 and i64, on two rings; and the failures: a rank that never arrives, ranks
// running different collectives, a peer that exits mid-job.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "tests/util/files.h"
#include "tests/util/op_test_util.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

// Both CPU backends: shared memory (what auto picks on one host) and Gloo over TCP.
TEST(CollectiveOps, AllMatchOnTwoThreeAndFourRanks) {
  for (std::string backend : {"shm", "gloo"}) {
    for (int n : {2, 3, 4}) {
      std::string dir = MakeTempDir();
      auto r = RunCommand("FLAGS_cpu_math_threads=1 FLAGS_cpu_comm_backend=" + backend + " " +
                          BinPath("keel") + " launch --nproc_per_node=" + std::to_string(n) +
                          " --log_dir=" + dir + " " + BinPath("collective_worker"));
      EXPECT_EQ(r.exit_code, 0) << backend << ", " << n << " ranks:\n" << r.output;
      EXPECT_NE(r.output.find("rank 0: all collectives match"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("rank 0: " + backend + " rings"), std::string::npos) << r.output;
      auto logs = RunCommand("cat " + dir + "/workerlog.*");
      for (int k = 0; k < n; ++k)
        EXPECT_NE(logs.output.find("rank " + std::to_string(k) + ": all collectives match"),
                  std::string::npos)
            << logs.output;
      RunCommand("rm -rf " + dir);
    }
  }
}

struct WorkerRun {
  CommandResult result;
  double seconds;
};

// The worker under keel launch on shm rings (`env` may override that), in KEEL_TEST_MODE `mode`
// ("": every collective); the output includes every rank's log.
WorkerRun RunWorker(const std::string& mode, const std::string& env = "", int nproc = 2) {
  std::string dir = MakeTempDir();
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand("KEEL_TEST_MODE=" + mode + " FLAGS_cpu_comm_backend=shm " + env + " " +
                      BinPath("keel") + " launch --nproc_per_node=" + std::to_string(nproc) +
                      " --log_dir=" + dir + " " + BinPath("collective_worker") + "; rc=$?; cat " +
                      dir + "/workerlog.*; exit $rc");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RunCommand("rm -rf " + dir);
  return {r, secs};
}

// The worker's fused all-reduces (coalesce_tensor, then an all-reduce of the buffer in place) run
// without copies on shared-memory rings, to the bits the copying path gives; with zero-copy off,
// or off on one rank only, they copy and still match.
TEST(ShmRing, FusedAllReducesRunWithoutCopiesUnlessARankTurnsItOff) {
  for (int n : {2, 3}) {
    for (std::string env : {"", "FLAGS_shm_zero_copy_mb=0", "KEEL_TEST_NO_ZERO_COPY_RANK=1"}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + env);
      const CommandResult r = RunWorker("", "FLAGS_cpu_math_threads=1 " + env, n).result;
      EXPECT_EQ(r.exit_code, 0) << r.output;
      for (int k = 0; k < n; ++k) {
        const std::string rank = "rank " + std::to_string(k) + ": ";
        EXPECT_NE(r.output.find(rank + "all collectives match"), std::string::npos) << r.output;
        EXPECT_NE(r.output.find(rank + (env.empty() ? "48" : "0") +
                                " of 48 fused all-reduces "
                                "without copies"),
                  std::string::npos)
            << r.output;
      }
    }
  }
}

// Send / Recv on both CPU backends (collective_worker's RunP2P): buffered sends received in
// another order, 80 MiB (more than the store could carry), more transfers than shared memory lets
// wait (the sender waits for room), a sender that returns right after its last send, and a
// receive from a rank that exited, which fails at once naming it. Shared-memory rings move the
// bytes through memory the sender shares, not through the store (their log says so).
TEST(PointToPoint, TransfersMatchOnSharedMemoryAndGlooRings) {
  for (std::string backend : {"shm", "gloo"}) {
    SCOPED_TRACE(backend);
    const WorkerRun w =
        RunWorker("p2p", "FLAGS_cpu_math_threads=1 FLAGS_cpu_comm_backend=" + backend);
    const std::string& out = w.result.output;
    EXPECT_EQ(w.result.exit_code, 0) << out;
    EXPECT_LT(w.seconds, 60) << out;
    ExpectContainsAll(
        out, {"rank 0: p2p transfers match", "rank 1: p2p sent its last transfer and returns",
              "rank 0: the receive after rank 1 exited failed: receive from rank 1 "
              "(tag 13, transfer #2)",
              backend == "shm" ? "point-to-point transfers through shared memory (not the store)"
                               : "point-to-point transfers over gloo (native"});
    if (backend == "shm") {
      EXPECT_NE(out.find(") exited without sending it"), std::string::npos) << out;
    }
    for (const char* line : {"ping-pong", "failed: "}) {
      const size_t at = out.find(line);
      if (at != std::string::npos)
        std::printf("%s\n", out.substr(at, out.find('\n', at) - at).c_str());
    }
  }
}

// A zero-copy all-reduce does not wait for a rank that arrived and then stalls (its ring thread
// asleep, or off its CPU): rank 1 is held after arriving until rank 0's all-reduce has returned,
// which it can only if rank 0 (and rank 2) take rank 1's pieces; rank 1 then finds its tensor
// reduced, to the same bits. (When each rank reduced a fixed slice between two barriers, rank 0
// waited for rank 1, whose hold then failed after 60 s naming the file.) Rank 0 releases rank 1
// only 2.5 s into the second all-reduce: the collective watch must not call that a mismatch (a
// wait's post ends with the wait, not with the collective).
TEST(ShmRing, ZeroCopyAllReduceTakesTheSharesOfARankThatStalls) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    const std::string dir = MakeTempDir();
    const std::string file = dir + "/release";
    const WorkerRun w = RunWorker("pieces_nap",
                                  "FLAGS_cpu_math_threads=1 KEEL_TEST_RELEASE_FILE=" + file +
                                      " KEEL_FAULT_DELAY=shm_pieces@1:60000@" + file,
                                  n);
    RunCommand("rm -rf " + dir);
    const std::string& out = w.result.output;
    EXPECT_EQ(w.result.exit_code, 0) << out;
    for (int k = 0; k < n; ++k)
      for (int round : {0, 1})
        EXPECT_NE(out.find("rank " + std::to_string(k) + ": all-reduce " + std::to_string(round) +
                           " returned, right"),
                  std::string::npos)
            << out;
    EXPECT_EQ(out.find("did not appear"), std::string::npos) << out;
    EXPECT_EQ(out.find("mismatch"), std::string::npos) << out;
  }
}

TEST(ShmRing, ABadZeroCopySizeOrOneForGlooIsAnErrorNamingTheFlag) {
  for (std::string env : {"FLAGS_shm_zero_copy_mb=-1 FLAGS_cpu_comm_backend=shm",
                          "FLAGS_shm_zero_copy_mb=64 FLAGS_cpu_comm_backend=gloo"}) {
    const CommandResult r = RunWorker("", "FLAGS_cpu_math_threads=1 " + env).result;
    EXPECT_NE(r.exit_code, 0) << env << "\n" << r.output;
    EXPECT_NE(r.output.find("--shm_zero_copy_mb"), std::string::npos) << env << "\n" << r.output;
  }
}

TEST(ShmRing, LeavesNoNameInDevShm) {
  auto f = RunWorker("shm_names");
  EXPECT_NE(f.result.output.find("rank 0: shm rings, 0 shm names left"), std::string::npos)
      << f.result.output;
}

TEST(ShmRing, RanksRunningDifferentCollectivesFailNamingBoth) {
  auto f = RunWorker("mismatch");
  const std::string& out = f.result.output;
  EXPECT_NE(f.result.exit_code, 0) << out;
  EXPECT_LT(f.seconds, 20) << out;
  EXPECT_NE(out.find("the ranks run different programs"), std::string::npos) << out;
  // Whichever rank finds the mismatch first names both collectives (the launcher then stops the
  // other, which may not get to say it too).
  const bool rank0_saw = out.find(
                             "rank 1 runs broadcast #1 (float32, 32 bytes, root 0) while this "
                             "rank runs allreduce #1 (float32, 32 bytes)") != std::string::npos;
  const bool rank1_saw = out.find(
                             "rank 0 runs allreduce #1 (float32, 32 bytes) while this rank "
                             "runs broadcast #1 (float32, 32 bytes, root 0)") != std::string::npos;
  EXPECT_TRUE(rank0_saw || rank1_saw) << out;
  EXPECT_EQ(out.find("ran to the end"), std::string::npos) << out;
}

TEST(ShmRing, APeerThatExitsIsNamedWithinSeconds) {
  // Rank 1 exits cleanly, so the launcher waits on rank 0, which must notice by itself, well
  // before the 300 s collective timeout.
  auto f = RunWorker("exit");
  const std::string& out = f.result.output;
  EXPECT_NE(f.result.exit_code, 0) << out;
  EXPECT_LT(f.seconds, 20) << out;
  EXPECT_NE(out.find("rank 1 (pid "), std::string::npos) << out;
  EXPECT_NE(out.find(") exited while this rank waited"), std::string::npos) << out;
  EXPECT_NE(out.find("c_allreduce_sum"), std::string::npos) << out;
}

TEST(ShmRing, APeerThatNeverComesIsATimeoutNamingIt) {
  auto f = RunWorker("stall", "FLAGS_comm_timeout_s=2");
  const std::string& out = f.result.output;
  EXPECT_NE(f.result.exit_code, 0) << out;
  EXPECT_LT(f.seconds, 20) << out;
  EXPECT_NE(out.find("timed out after 2 s"), std::string::npos) << out;
  EXPECT_NE(out.find("rank(s) 1 did not arrive"), std::string::npos) << out;
}

TEST(CollectiveOps, ARankThatNeverArrivesIsATimeoutNotAHang) {
  // Rank 0 of a 2-rank job alone: the store serves, but rank 1 never comes.
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand("KEEL_JOB_TOKEN=t RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                      std::to_string(FreePort()) +
                      " "
                      "FLAGS_comm_timeout_s=3 timeout 60 " +
                      BinPath("collective_worker"));
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(secs, 30) << r.output;
  EXPECT_NE(r.output.find("did not appear within"), std::string::npos) << r.output;
  // The first meeting: fleet::init compares the ring configuration.
  EXPECT_NE(r.output.find("rank 0 waited for rank 1 to compare the ring configuration"),
            std::string::npos)
      << r.output;
}

// The worker started by hand on Gloo rings, without keel launch (so that nobody stops a rank when
// another dies): ranks 1..n-1 in the background, rank 0 in front, in KEEL_TEST_MODE `mode`.
struct HandRun {
  CommandResult rank0;  // rank 0's exit code and output
  std::string all;      // rank 0's output, then every other rank's
};
HandRun RunByHand(const std::string& mode, int n, int comm_timeout_s) {
  const std::string dir = MakeTempDir();
  const std::string env =
      "KEEL_JOB_TOKEN=t WORLD_SIZE=" + std::to_string(n) +
      " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(FreePort()) +
      " FLAGS_cpu_comm_backend=gloo FLAGS_comm_timeout_s=" + std::to_string(comm_timeout_s) +
      " KEEL_TEST_MODE=" + mode + " ";
  const std::string worker = " timeout 60 " + BinPath("collective_worker");
  std::string cmd;
  for (int r = 1; r < n; ++r)
    cmd += "(RANK=" + std::to_string(r) + " " + env + worker + " > " + dir + "/rank" +
           std::to_string(r) + ".txt 2>&1 &); ";
  // A second for the others to finish writing what they say.
  HandRun h;
  h.rank0 = RunCommand(cmd + "RANK=0 " + env + worker + "; rc=$?; sleep 1; exit $rc");
  h.all = h.rank0.output;
  for (int r = 1; r < n; ++r)
    h.all += "\n--- rank " + std::to_string(r) + "\n" +
             ReadText(dir + "/rank" + std::to_string(r) + ".txt");
  RunCommand("rm -rf " + dir);
  return h;
}

// Rank 1 dies (SIGKILL) with most of a 256 MiB broadcast from rank 0 unread, so rank 0's send is
// half written when the connection breaks. Gloo fails the connection but never wakes a wait for
// a send it had begun writing: rank 0 would wait out the comm timeout (120 s here). Started by
// hand, with no launcher to stop rank 0 when rank 1 dies, rank 0 must end by itself, naming the
// broken connection.
TEST(GlooRing, APeerKilledInTheMiddleOfASendEndsTheSendersWait) {
  const HandRun h = RunByHand("killed_mid_send", 2, 120);
  EXPECT_EQ(h.rank0.exit_code, 1) << h.all;
  EXPECT_NE(h.rank0.output.find("the connection to rank 1 failed"), std::string::npos) << h.all;
  EXPECT_EQ(h.rank0.output.find("the broadcast returned"), std::string::npos) << h.all;
}

// The same for a point-to-point send: rank 0 queues 256 MiB for rank 1 and returns from main; its
// exit waits for queued sends to be received (up to the comm timeout, 120 s here), but gives up on
// this one as soon as the connection to rank 1 is found failed.
TEST(GlooRing, AnExitDoesNotWaitForASendToAPeerKilledInTheMiddleOfIt) {
  const HandRun h = RunByHand("killed_mid_p2p", 2, 120);
  EXPECT_EQ(h.rank0.exit_code, 0) << h.all;
  EXPECT_NE(h.rank0.output.find("rank 0: sent, exiting"), std::string::npos) << h.all;
  EXPECT_NE(h.rank0.output.find("the connection to rank 1 failed"), std::string::npos) << h.all;
}

// A rank whose wait is ended because a connection failed must close its other connections
// before Gloo goes on: woken in a broadcast before it received anything, rank 1 would otherwise
// forward its own stale tensor to rank 3, whose broadcast would return it as a success.
TEST(GlooRing, ARankWokenByAFailedConnectionForwardsNothingStale) {
  const HandRun h = RunByHand("stale_relay", 4, 30);
  EXPECT_NE(h.all.find("the connection to rank 2 failed"), std::string::npos) << h.all;
  EXPECT_EQ(h.all.find("rank 3: the broadcast returned 0"), std::string::npos) << h.all;
}

// A rank that leaves cleanly closes its connections too, which Gloo then fails: its peers must
// not take that for a failure. Rank 2 leaves once its part is done while rank 0 waits for rank 1,
// 2.5 s late: in a broadcast (rank 0's wait is probed), and with a point-to-point send that rank
// 0's exit waits to see received. A ring left cleanly says goodbye on its probes' slot, to every
// peer whose connection still stands (staggered_leavers: on 4 ranks, one that leaves after
// another has left).
TEST(GlooRing, APeerThatLeftCleanlyIsNotAFailedConnection) {
  for (std::string mode : {"early_leaver", "p2p_early_leaver", "staggered_leavers"}) {
    SCOPED_TRACE(mode);
    const int n = mode == "staggered_leavers" ? 4 : 3;
    const WorkerRun w = RunWorker(mode, "FLAGS_cpu_comm_backend=gloo", n);
    const std::string& out = w.result.output;
    EXPECT_EQ(w.result.exit_code, 0) << out;
    for (int r = 0; r < n; ++r) {
      if (mode == "p2p_early_leaver" && r == 2) continue;  // it takes no part
      EXPECT_NE(out.find("rank " + std::to_string(r) + ": done, 1"), std::string::npos) << out;
    }
    EXPECT_EQ(out.find("failed"), std::string::npos) << out;
  }
}

// The probe that ends the wait above must not end a wait on a sound ring: rank 0 waits 3 s for
// rank 1's all-reduce (the watch asks the probe every 250 ms after the first second) and both
// finish it.
TEST(GlooRing, ALongWaitOnASoundRingCompletes) {
  const WorkerRun w = RunWorker("late", "FLAGS_cpu_comm_backend=gloo");
  const std::string& out = w.result.output;
  EXPECT_EQ(w.result.exit_code, 0) << out;
  EXPECT_NE(out.find("rank 0: fault mode late ran to the end"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1: fault mode late ran to the end"), std::string::npos) << out;
  EXPECT_EQ(out.find("broken"), std::string::npos) << out;
}

TEST(CollectiveOps, AHandStartedMultiRankJobWithoutATokenIsRefused) {
  auto r = RunCommand(
      "env -u KEEL_JOB_TOKEN -u OMPI_MCA_orte_precondition_transports RANK=0 "
      "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
      std::to_string(FreePort()) + " timeout 60 " + BinPath("collective_worker"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("KEEL_JOB_TOKEN"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::testing
