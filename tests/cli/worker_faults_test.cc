// Workers that fail without failing: a rank that exits 0 before the rendezvous (its peers would
// wait there until the comm timeout, and the launcher blamed one of them), and a rank whose
// training thread hangs while its process lives (the straggler monitor never named it). Real
// processes under keel launch, with tests/workers/fault_worker.cc.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "tests/util/files.h"
#include "tests/util/process.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

class WorkerFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    mark_ = UniqueMark(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    EXPECT_EQ(KillAll("KEEL_TEST_MARK=" + mark_), 0) << "processes of the test outlived it";
    fs::remove_all(dir_);
  }
  std::string Env() const { return "env KEEL_TEST_MARK=" + mark_ + " FLAGS_cpu_math_threads=1 "; }
  std::string dir_, mark_;
};

// Rank 1 (then rank 0) returns 0 before fleet::init while its peer waits in the rendezvous for
// it: the launcher ends the job in seconds, not after the 60 s comm timeout, and names the rank
// that left, not the one that waited.
TEST_F(WorkerFaultTest, AWorkerThatExitsZeroBeforeTheRendezvousIsBlamedAtOnce) {
  for (int leaver : {1, 0}) {
    SCOPED_TRACE("rank " + std::to_string(leaver) + " leaves");
    const auto t0 = Clock::now();
    auto r =
        RunCommand(Env() + "FLAGS_comm_timeout_s=60 " + Keel() +
                   " launch --nproc_per_node=2 --log_dir=" + dir_ + " " + BinPath("fault_worker") +
                   " --steps=3 --exit0_before_init_rank=" + std::to_string(leaver));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const int waiter = 1 - leaver;
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_LT(seconds, 20) << r.output;
    EXPECT_TRUE(Contains(r.output, "keel launch: worker rank " + std::to_string(leaver) +
                                       " (local " + std::to_string(leaver) + ", pid "))
        << r.output;
    EXPECT_TRUE(Contains(r.output,
                         "exited with code 0 before joining the job's rendezvous, "
                         "while rank(s) " +
                             std::to_string(waiter) + " waited for it there"))
        << r.output;
    EXPECT_FALSE(Contains(r.output, "keel launch: worker rank " + std::to_string(waiter) +
                                        " (local " + std::to_string(waiter) + ", pid "))
        << "the rank that waited was blamed\n"
        << r.output;
  }
}

// Exiting 0 is no fault for workers that joined (they finished), nor for a plain command that
// never meets its peers.
TEST_F(WorkerFaultTest, WorkersThatFinishOrNeverUseTheRendezvousAreNotBlamed) {
  auto r = RunCommand(Env() + Keel() + " launch --nproc_per_node=2 --log_dir=" + dir_ + " " +
                      BinPath("fault_worker") + " --steps=20 --step_ms=20");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto plain = RunCommand(Env() + Keel() + " launch --nproc_per_node=2 --log_dir=" + dir_ +
                          " sh -c 'if [ $RANK = 1 ]; then exit 0; fi; sleep 1'");
  EXPECT_EQ(plain.exit_code, 0) << plain.output;
}

// Rank 0 finishes first and exits while rank 1 still uses the rendezvous store: keel launch
// serves the store, not rank 0, so rank 1 goes on (it failed with "closed by peer" when rank 0
// served it). Outside keel launch rank 0 serves it, and the same program fails on rank 1.
TEST_F(WorkerFaultTest, TheStoreOutlivesARankZeroThatFinishesFirst) {
  auto r = RunCommand(Env() + Keel() + " launch --nproc_per_node=2 --log_dir=" + dir_ + " " +
                      BinPath("fault_worker") + " --steps=2 --rank0_leaves_first");
  const std::string log1 = ReadText(dir_ + "/workerlog.1");
  EXPECT_EQ(r.exit_code, 0) << r.output << log1;
  EXPECT_TRUE(Contains(r.output, "rank 0 leaves first")) << r.output;
  EXPECT_TRUE(Contains(log1, "used the store after rank 0 (pid ")) << log1;
  EXPECT_TRUE(Contains(log1, ") was gone: add -> 1")) << log1;
}

// Rank 1's training thread sleeps after 5 steps while its process (and its monitor thread)
// lives: rank 0's monitor names it as hung within seconds, with its step count and who waits.
TEST_F(WorkerFaultTest, AHungTrainingThreadIsNamedByTheStragglerMonitor) {
  Background job = StartBackground(
      Env() + "FLAGS_straggler_report_interval_s=0.5 " + Keel() +
          " launch --nproc_per_node=2 --log_dir=" + dir_ + " " + BinPath("fault_worker") +
          " --steps=100000 --step_ms=5 --hang_rank=1 --hang_after=5 --hang_s=120",
      dir_ + "/out.txt");
  ASSERT_TRUE(WaitForText(dir_ + "/workerlog.1", "rank 1 hangs after 5 steps", 60))
      << ReadText(job.output_path) << ReadText(dir_ + "/workerlog.1");
  const auto t0 = Clock::now();
  const bool named = WaitForText(job.output_path, "straggler: rank 1 has finished no step for", 15);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  kill(job.pid, SIGTERM);
  WaitFor(job.pid, 30);
  const std::string out = ReadText(job.output_path);
  ASSERT_TRUE(named) << out;
  EXPECT_LT(seconds, 10) << out;
  EXPECT_TRUE(Contains(out,
                       "(hung?), after 5 step(s): it is in no collective, while rank(s) 0 "
                       "wait for it in theirs"))
      << out;
  EXPECT_FALSE(Contains(out, "straggler: rank 0 has finished no step")) << out;
}

}  // namespace
}  // namespace keel::testing
