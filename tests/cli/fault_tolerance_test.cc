// Jobs under faults, end to end through `keel launch` and `keel train` with real processes:
// elastic restarts that end with the uninterrupted run's parameters, a stopped worker named as the
// root cause, no orphan after the launcher is killed, no shared-memory segment after a rank dies
// before mapping it, a flood of strangers against the store during rendezvous and saves, save
// directories checked before the first step, exact resume through --load_dir, and restarts of
// ranks whose save_dirs are their own.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "framework/io/checkpoint.h"
#include "tests/util/files.h"
#include "tests/util/process.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;

// "step N loss X" lines of a training log, by step.
std::map<int, std::string> LossLines(const std::string& text) {
  std::map<int, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("step ", 0) != 0) continue;
    std::istringstream words(line);
    std::string w, loss;
    int step = -1;
    words >> w >> step >> w >> loss;
    if (step >= 0) out[step] = loss;
  }
  return out;
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    mark_ = UniqueMark(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    EXPECT_EQ(KillAll("KEEL_TEST_MARK=" + mark_), 0) << "processes of the test outlived it";
    fs::remove_all(dir_);
  }
  std::string Env() const { return "env KEEL_TEST_MARK=" + mark_ + " "; }
  std::string dir_, mark_;
};

// The restart test: a worker killed at a random step under --max_restarts=2
// --save_every=10; the job completes and its final parameters equal an uninterrupted run's.
TEST_F(FaultTest, RestartedJobEndsWithTheUninterruptedRunsParameters) {
  const std::string train = Keel() +
                            " train --model=mlp --optimizer=adam --seed=5 --steps=200 "
                            "--batch_size=64 --save_every=10";
  auto straight = RunCommand(Keel() + " launch --nproc_per_node=2 --log_dir=" + dir_ + "/l1 " +
                             train + " --save_dir=" + dir_ + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;

  std::random_device rd;
  const int kill_step = 20 + static_cast<int>(rd() % 130);
  SCOPED_TRACE("rank 1 killed after step " + std::to_string(kill_step));
  Background job = StartBackground(Env() + Keel() + " launch --nproc_per_node=2 --max_restarts=2 " +
                                       "--log_dir=" + dir_ + "/l2 " + train +
                                       " --save_dir=" + dir_ + "/restarted",
                                   dir_ + "/out.txt");
  ASSERT_TRUE(WaitForText(job.output_path, "step " + std::to_string(kill_step) + " ", 120))
      << ReadText(job.output_path);
  std::vector<pid_t> rank1 = FindProcesses("KEEL_TEST_MARK=" + mark_, 1, "keel");
  ASSERT_EQ(rank1.size(), 1u);
  kill(rank1[0], SIGKILL);
  int status = WaitFor(job.pid, 300);
  std::string out = ReadText(job.output_path);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_TRUE(Contains(out, "keel launch: restart 1 of 2: worker rank 1")) << out;
  EXPECT_TRUE(Contains(out, "SIGKILL")) << out;
  EXPECT_TRUE(Contains(out, "resumed from " + dir_ + "/restarted at step")) << out;
  EXPECT_EQ(CheckpointTensorBytes(dir_ + "/restarted"), CheckpointTensorBytes(dir_ + "/straight"));
  for (const auto& e : fs::directory_iterator(dir_ + "/restarted"))  // no temp files
    EXPECT_TRUE(e.path().filename() == kPersistablesFile ||
                e.path().filename() == kPreviousPersistablesFile)
        << "left behind: " << e.path();
  std::optional<TrainingState> st = ReadTrainingState(dir_ + "/restarted");
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->step, 200);
  // The losses printed after the restart are the straight run's.
  std::map<int, std::string> a = LossLines(straight.output), b = LossLines(out);
  for (int s = kill_step + 1; s < 200; s += 7) EXPECT_EQ(a[s], b[s]) << "step " << s;
}

// Ranks whose save_dirs are their own (as nodes without a shared file system have): only rank
// 0's holds checkpoints. After rank 1 is killed, the restarted rank 1 finds none in its folder
// and receives rank 0's; both resume from step 30 and the job ends with the uninterrupted run's
// parameters and losses. (Across two hosts: tests/cli/multihost_test.cc.)
TEST_F(FaultTest, RanksWithSaveDirsOfTheirOwnResumeFromRankZerosCheckpoint) {
  const std::string train = Keel() +
                            " train --model=mlp --optimizer=adam --seed=5 --steps=60 "
                            "--batch_size=64 --save_every=10";
  auto straight = RunCommand(Keel() + " launch --nproc_per_node=2 --log_dir=" + dir_ + "/l1 " +
                             train + " --save_dir=" + dir_ + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  auto r = RunCommand(Env() + "KEEL_FAULT_POINT=trainer_step_34@1 " + Keel() +
                      " launch --nproc_per_node=2 --max_restarts=1 --log_dir=" + dir_ +
                      "/l2 sh -c '" + train + " --save_dir=" + dir_ + "/rank$RANK'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "keel launch: restart 1 of 1: worker rank 1")) << r.output;
  EXPECT_TRUE(Contains(r.output, "has no checkpoint in " + dir_ + "/rank1: it is sent rank 0 on "))
      << r.output;
  EXPECT_TRUE(Contains(r.output, "'s checkpoint (step 30, " + dir_ + "/rank0/" + kPersistablesFile))
      << r.output;
  EXPECT_TRUE(Contains(r.output, "resumed from " + dir_ + "/rank0 at step 30")) << r.output;
  EXPECT_TRUE(Contains(ReadText(dir_ + "/l2/workerlog.1"), "resuming from rank 0 on "));
  EXPECT_EQ(CheckpointTensorBytes(dir_ + "/rank0"), CheckpointTensorBytes(dir_ + "/straight"));
  std::map<int, std::string> a = LossLines(straight.output), b = LossLines(r.output);
  for (int s = 30; s < 60; ++s) EXPECT_EQ(a[s], b[s]) << "step " << s;
}

// Checkpoints no rank can read (rank 0's latest and previous both damaged, rank 1's folder
// empty) fail every rank before any step, naming rank 0's node and folder, instead of a start
// from step 0 on one rank and a resume attempt on the other.
TEST_F(FaultTest, CheckpointsNoRankCanReadFailEveryRankNamingTheNode) {
  const std::string train = Keel() + " train --model=mlp --mlp_hidden=64 --seed=5 --save_every=10";
  auto first = RunCommand(Keel() + " launch --nproc_per_node=2 --log_dir=" + dir_ + "/l1 " + train +
                          " --steps=20 --save_dir=" + dir_ + "/rank0");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  for (const std::string& file : {kPersistablesFile, kPreviousPersistablesFile}) {
    const std::string path = dir_ + "/rank0/" + file;
    std::string bytes = ReadText(path);
    bytes[bytes.size() - 3] ^= 0x40;
    fs::remove(path);  // the two may be hard links of one file
    WriteText(path, bytes);
  }
  auto r =
      RunCommand(Env() + Keel() + " launch --nproc_per_node=2 --log_dir=" + dir_ + "/l2 sh -c '" +
                 train + " --steps=30 --auto_resume --save_dir=" + dir_ + "/rank$RANK'");
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (int rank : {0, 1}) {
    const std::string log = ReadText(dir_ + "/l2/workerlog." + std::to_string(rank));
    EXPECT_TRUE(
        Contains(log, "no rank has a readable checkpoint to resume from: rank 0 on node 0 (") &&
        Contains(log, ") cannot read its checkpoint in " + dir_ + "/rank0: " + dir_ + "/rank0/" +
                          kPersistablesFile))
        << log;
    EXPECT_FALSE(Contains(log, "step 0 ")) << log;
  }
}

TEST_F(FaultTest, GivesUpAfterMaxRestartsNamingTheLastCause) {
  auto r =
      RunCommand(Env() + Keel() + " launch --nproc_per_node=2 --max_restarts=2 --log_dir=" + dir_ +
                 " sh -c 'echo attempt=$KEEL_RESTART_COUNT; "
                 "if [ $RANK = 1 ]; then exit 3; fi; sleep 30'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  for (const char* line : {"restart 1 of 2: worker rank 1", "restart 2 of 2: worker rank 1",
                           "giving up after 2 restart(s)", "exited with code 3", "attempt=0",
                           "attempt=1", "attempt=2"})
    EXPECT_TRUE(Contains(r.output, line)) << line << "\n" << r.output;
}

// A rank in state T (SIGSTOP) makes its peer time out; the launcher names the stopped rank as
// the root cause, not the peer that timed out.
TEST_F(FaultTest, AStoppedWorkerIsNamedAsTheRootCause) {
  Background job = StartBackground(
      Env() + "FLAGS_comm_timeout_s=4 " + Keel() + " launch --nproc_per_node=2 --log_dir=" + dir_ +
          " " + Keel() + " train --model=mlp --mlp_hidden=64 --steps=1000000",
      dir_ + "/out.txt");
  ASSERT_TRUE(WaitForText(job.output_path, "step 5 ", 60)) << ReadText(job.output_path);
  std::vector<pid_t> rank1 = FindProcesses("KEEL_TEST_MARK=" + mark_, 1, "keel");
  ASSERT_EQ(rank1.size(), 1u);
  kill(rank1[0], SIGSTOP);
  auto t0 = std::chrono::steady_clock::now();
  int status = WaitFor(job.pid, 90);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string out = ReadText(job.output_path);
  ASSERT_NE(status, -1) << "the launcher did not end\n" << out;
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_LT(took, 40) << out;
  EXPECT_TRUE(
      Contains(out, "worker rank 1 (local 1, pid " + std::to_string(rank1[0]) + ") is stopped"))
      << out;
  EXPECT_TRUE(Contains(out, "keel launch: worker rank 1 (local 1, pid " + std::to_string(rank1[0]) +
                                ") was stopped (state T)"))
      << out;
}

// A node whose only worker is stopped has nobody to fail: its launcher gives up on the worker
// after --stopped_timeout_s (by default the comm timeout) instead of waiting forever.
TEST_F(FaultTest, ANodeWhoseOnlyWorkerIsStoppedEnds) {
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand(Env() + Keel() + " launch --stopped_timeout_s=2 --log_dir=" + dir_ +
                      " sh -c 'kill -STOP $$; echo never'");
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(took, 20) << r.output;
  EXPECT_TRUE(Contains(r.output, "has been stopped for")) << r.output;
  EXPECT_TRUE(Contains(r.output, "was stopped (state T) for")) << r.output;
}

// SIGKILL of the launcher: its direct children die with it (PDEATHSIG), and so must their
// children (here under an `sh -c` wrapper): the sentinel kills every worker's process group.
TEST_F(FaultTest, KillingTheLauncherLeavesNoOrphans) {
  Background job = StartBackground(Env() + Keel() + " launch --nproc_per_node=2 --log_dir=" + dir_ +
                                       " sh -c 'sleep 600; echo unreachable'",
                                   dir_ + "/out.txt");
  auto sleepers = [&] { return FindProcesses("KEEL_TEST_MARK=" + mark_, -1, "sleep"); };
  for (int i = 0; i < 500 && sleepers().size() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(sleepers().size(), 2u);
  kill(job.pid, SIGKILL);
  WaitFor(job.pid, 10);
  for (int i = 0; i < 300 && !sleepers().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(sleepers().empty()) << "workers' children outlived the launcher";
}

std::set<std::string> ShmSegments() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("keel", 0) == 0) names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

// Rank 1 dies after rank 0 created the ring's shared memory and before mapping it; the launcher
// then stops rank 0 while it waits. Nothing may be left in /dev/shm.
TEST_F(FaultTest, ARankKilledBeforeMappingSharedMemoryLeavesNoSegment) {
  std::set<std::string> before = ShmSegments();
  auto r = RunCommand(Env() + "KEEL_FAULT_POINT=shm_before_map@1 " + Keel() +
                      " launch --nproc_per_node=2 --log_dir=" + dir_ + " " + Keel() +
                      " train --model=mlp --mlp_hidden=16 --steps=3");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "worker rank 1 (local 1")) << r.output;
  std::set<std::string> after = ShmSegments();
  for (const std::string& name : after)
    EXPECT_TRUE(before.count(name)) << "/dev/shm/" << name << " was left behind";
}

// A child that keeps up to `n` connections open to 127.0.0.1:port, renewing them, until killed.
pid_t Flood(int port, int n) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  std::vector<int> fds;
  while (true) {
    int fd = ConnectLocal(port);
    if (fd >= 0) {
      fds.push_back(fd);
    } else {
      usleep(2000);
    }
    if (static_cast<int>(fds.size()) >= n) {
      for (int f : fds) ::close(f);
      fds.clear();
    }
  }
}

// 1100 idle connections at a time against rank 0's store, from before rendezvous to after the
// last save, in a job whose processes may open 256 files: training completes and saves.
TEST_F(FaultTest, AFloodOfStrangersDuringRendezvousAndSavesLeavesTrainingIntact) {
  const int port = FreePort();
  pid_t flooder = Flood(port, 1100);
  auto r = RunCommand(
      Env() + "sh -c 'ulimit -n 256; exec " + Keel() + " launch --nproc_per_node=2 --master_port=" +
      std::to_string(port) + " --log_dir=" + dir_ + "/log " + Keel() +
      " train --model=mlp --mlp_hidden=256 --steps=300 --save_every=10 --save_dir=" + dir_ +
      "/ckpt'");
  kill(flooder, SIGKILL);
  waitpid(flooder, nullptr, 0);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "store: refused")) << "the flood never reached the store";
  std::optional<TrainingState> st = ReadTrainingState(dir_ + "/ckpt");
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->step, 300);
}

// --save_dir is checked before step 0, not found unusable after the whole run.
TEST_F(FaultTest, AnUnusableSaveDirFailsBeforeTheFirstStep) {
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand(Keel() +
                      " train --model=mlp --mlp_hidden=16 --steps=100000000 "
                      "--save_dir=/proc/keel_cannot_write_here");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "--save_dir=/proc/keel_cannot_write_here")) << r.output;
  EXPECT_FALSE(Contains(r.output, "step 0 ")) << r.output;
}

// `ulimit -f` smaller than a checkpoint: an error naming the limit before step 0, not a SIGXFSZ
// after the last.
TEST_F(FaultTest, AFileSizeLimitBelowTheCheckpointFailsBeforeTheFirstStep) {
  auto r = RunCommand("sh -c 'ulimit -f 8; exec " + Keel() +
                      " train --model=mlp --mlp_hidden=64 --steps=100000000 --save_dir=" + dir_ +
                      "/ckpt'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(r.signaled) << r.output;
  EXPECT_TRUE(Contains(r.output, "ulimit -f")) << r.output;
  EXPECT_FALSE(Contains(r.output, "step 0 ")) << r.output;
}

// --load_dir resumes step, data position and optimizer state: the resumed run prints the straight
// run's losses and ends with its parameters, for the synthetic stream and for MNIST's shuffled
// loader.
TEST_F(FaultTest, LoadDirResumesTheStraightRunBitForBit) {
  const std::string mnist = std::string(KEEL_SOURCE_DIR) + "/../shared/data/mnist";
  struct Case {
    std::string name, flags;
  };
  std::vector<Case> cases = {{"mlp", "--model=mlp --mlp_hidden=64 --optimizer=adam --seed=4"}};
  if (fs::exists(mnist))
    cases.push_back({"lenet", "--model=lenet --data=mnist:" + mnist + " --batch_size=32 --seed=9"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string base = Keel() + " train " + c.flags + " --save_dir=" + dir_ + "/" + c.name;
    auto straight = RunCommand(base + "_a --steps=30");
    ASSERT_EQ(straight.exit_code, 0) << straight.output;
    auto first = RunCommand(base + "_b --steps=12");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    auto resumed = RunCommand(base + "_c --steps=30 --load_dir=" + dir_ + "/" + c.name + "_b");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_TRUE(Contains(resumed.output, "at step 12")) << resumed.output;
    std::map<int, std::string> a = LossLines(straight.output), b = LossLines(resumed.output);
    EXPECT_EQ(b.count(11), 0u) << "the resumed run repeated step 11";
    for (int s = 12; s < 30; ++s) EXPECT_EQ(a[s], b[s]) << "step " << s;
    EXPECT_EQ(CheckpointTensorBytes(dir_ + "/" + c.name + "_c"),
              CheckpointTensorBytes(dir_ + "/" + c.name + "_a"));
  }
}

// LocalSGD (average every 3 steps after a 6-step synchronous warm-up) on two workers: a resume
// from a checkpoint in the warm-up (step 3) or at an average after it (step 9) ends where the
// straight run ends, bit for bit (the counters continue, the warm-up is not repeated); a
// --save_every that would land between averages is refused at start, and so is a resume from a
// final checkpoint taken between averages (step 8), and one of an optimizer with per-rank
// accumulators.
TEST_F(FaultTest, LocalSgdResumesExactlyInTheWarmupAndAfterIt) {
  const std::string train = Env() + Keel() + " launch --nproc_per_node=2 --log_dir=" + dir_ +
                            "/log " + Keel() +
                            " train --model=mlp --mlp_hidden=32 --optimizer=sgd --seed=4 "
                            "--local_sgd_steps=3 --local_sgd_warmup_steps=6 --progress=lines "
                            "--fetch_frequency=1 --save_dir=" +
                            dir_;
  auto straight = RunCommand(train + "/a --steps=18");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  for (const char* at : {"3", "9"}) {
    SCOPED_TRACE(std::string("resumed at step ") + at);
    const std::string first = dir_ + "/first" + at, resumed = dir_ + "/resumed" + at;
    auto r1 = RunCommand(train + "/first" + at + " --steps=" + at);
    ASSERT_EQ(r1.exit_code, 0) << r1.output;
    auto r2 = RunCommand(train + "/resumed" + at + " --steps=18 --load_dir=" + first);
    ASSERT_EQ(r2.exit_code, 0) << r2.output;
    EXPECT_TRUE(Contains(r2.output, std::string("at step ") + at)) << r2.output;
    std::map<int, std::string> a = LossLines(straight.output), b = LossLines(r2.output);
    for (int s = std::stoi(at); s < 18; ++s) EXPECT_EQ(b[s], a[s]) << "step " << s;
    EXPECT_EQ(CheckpointTensorBytes(resumed), CheckpointTensorBytes(dir_ + "/a"));
  }
  // The launcher's exit status, then rank 0's log (which holds the error).
  auto with_log = [&](const std::string& cmd) {
    return RunCommand(cmd + "; rc=$?; cat " + dir_ + "/log/workerlog.0; exit $rc");
  };
  auto every4 = with_log(train + "/every4 --steps=18 --save_every=4");
  EXPECT_NE(every4.exit_code, 0);
  EXPECT_TRUE(Contains(every4.output, "--save_every=4 with --local_sgd_steps=3")) << every4.output;
  auto mid = RunCommand(train + "/mid --steps=8");
  ASSERT_EQ(mid.exit_code, 0) << mid.output;
  EXPECT_TRUE(Contains(mid.output, "falls between two LocalSGD averages")) << mid.output;
  auto refused = with_log(train + "/from_mid --steps=18 --load_dir=" + dir_ + "/mid");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_TRUE(Contains(refused.output, "between two averages")) << refused.output;
  // Momentum's velocity is each rank's own under LocalSGD: a resume is refused, naming it.
  auto momentum = RunCommand(train + "/momentum --steps=9 --optimizer=momentum");
  ASSERT_EQ(momentum.exit_code, 0) << momentum.output;
  auto from_momentum = with_log(
      train + "/from_momentum --steps=18 --optimizer=momentum --load_dir=" + dir_ + "/momentum");
  EXPECT_NE(from_momentum.exit_code, 0);
  EXPECT_TRUE(Contains(from_momentum.output, "LocalSGD with momentum: its VelocityOut"))
      << from_momentum.output;
}

// A rank slowed down (stopped 60 ms of every 100) is logged by rank 0, by rank and with how far
// behind it is, long before the 300 s comm timeout.
TEST_F(FaultTest, AStragglerIsLoggedByRankWithHowFarBehind) {
  Background job =
      StartBackground(Env() + "FLAGS_straggler_report_interval_s=1 " + Keel() +
                          " launch --nproc_per_node=2 --log_dir=" + dir_ + " " + Keel() +
                          " train --model=mlp --mlp_hidden=256 --steps=100000000",
                      dir_ + "/out.txt");
  ASSERT_TRUE(WaitForText(job.output_path, "step 5 ", 60)) << ReadText(job.output_path);
  std::vector<pid_t> rank1 = FindProcesses("KEEL_TEST_MARK=" + mark_, 1, "keel");
  ASSERT_EQ(rank1.size(), 1u);
  bool logged = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (!logged && std::chrono::steady_clock::now() < deadline) {
    kill(rank1[0], SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    kill(rank1[0], SIGCONT);
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    logged = Contains(ReadText(job.output_path), "straggler: rank 1 computes");
  }
  kill(job.pid, SIGTERM);
  WaitFor(job.pid, 30);
  std::string out = ReadText(job.output_path);
  ASSERT_TRUE(logged) << out;
  EXPECT_TRUE(Contains(out, "ms per step behind")) << out;
  EXPECT_FALSE(Contains(out, "straggler: rank 0 computes")) << out;
  // Slow, not hung: it still finishes steps.
  EXPECT_FALSE(Contains(out, "has finished no step")) << out;
}

}  // namespace
}  // namespace keel::testing
