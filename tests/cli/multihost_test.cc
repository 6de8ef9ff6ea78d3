// Two hosts in one machine: two network namespaces joined by a veth pair, each running its own
// `keel launch` node. A 2-node job over Gloo trains to the 1-node result; a cut link fails both
// nodes within FLAGS_comm_timeout_s naming the collective; a remote worker killed mid-training
// (saving every step) ends the other node quickly; with a save_dir of its own on each node (no
// shared file system), the ranks agree on the checkpoint to resume from and the node that lacks
// it receives it. Needs root (CI has it); skipped with a message otherwise. Every namespace, veth
// and process the test creates is removed, pass or fail, and the names are unique per run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "framework/io/checkpoint.h"
#include "tests/util/files.h"
#include "tests/util/process.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;

// Two namespaces "keel<id>a"/"keel<id>b" with veth ends "kv<id>a"/"kv<id>b" on 10.X.Y.1 and .2.
class TwoHosts {
 public:
  TwoHosts() {
    if (geteuid() != 0) {
      why_not_ = "not root: network namespaces need CAP_SYS_ADMIN";
      return;
    }
    std::random_device rd;
    const unsigned id = (static_cast<unsigned>(getpid()) * 7919u + rd()) % 1000000u;
    const std::string tag = std::to_string(id);
    const unsigned subnet = rd();
    for (int i = 0; i < 2; ++i) {
      ns_[i] = "keel" + tag + (i ? "b" : "a");
      veth_[i] = "kv" + tag + (i ? "b" : "a");
      ip_[i] = "10." + std::to_string(200 + subnet % 50) + "." +
               std::to_string((subnet >> 8) % 250) + "." + std::to_string(i + 1);
    }
    const std::vector<std::string> steps = {
        "ip netns add " + ns_[0],
        "ip netns add " + ns_[1],
        "ip link add " + veth_[0] + " type veth peer name " + veth_[1],
        "ip link set " + veth_[0] + " netns " + ns_[0],
        "ip link set " + veth_[1] + " netns " + ns_[1],
        "ip -n " + ns_[0] + " addr add " + ip_[0] + "/24 dev " + veth_[0],
        "ip -n " + ns_[1] + " addr add " + ip_[1] + "/24 dev " + veth_[1],
        "ip -n " + ns_[0] + " link set " + veth_[0] + " up",
        "ip -n " + ns_[1] + " link set " + veth_[1] + " up",
        "ip -n " + ns_[0] + " link set lo up",
        "ip -n " + ns_[1] + " link set lo up",
    };
    for (const std::string& step : steps) {
      CommandResult r = RunCommand(step);
      if (r.exit_code != 0) {
        why_not_ = "cannot set up network namespaces ('" + step + "': " + r.output + ")";
        return;
      }
    }
  }
  ~TwoHosts() {
    for (int i = 0; i < 2; ++i) {
      if (ns_[i].empty()) continue;
      RunCommand("for p in $(ip netns pids " + ns_[i] + " 2>/dev/null); do kill -9 $p; done");
    }
    for (int i = 0; i < 2; ++i) {
      if (ns_[i].empty()) continue;
      RunCommand("ip netns del " + ns_[i] + " 2>/dev/null");
      RunCommand("ip link del " + veth_[i] + " 2>/dev/null");  // if it never moved
    }
  }
  const std::string& why_not() const { return why_not_; }
  std::string In(int i) const { return "ip netns exec " + ns_[i] + " "; }
  const std::string& ip(int i) const { return ip_[i]; }
  std::string CutLink() const {
    return RunCommand("ip -n " + ns_[0] + " link set " + veth_[0] + " down").output;
  }

 private:
  std::string ns_[2], veth_[2], ip_[2];
  std::string why_not_;
};

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    hosts_ = std::make_unique<TwoHosts>();
    if (!hosts_->why_not().empty()) GTEST_SKIP() << "two-host tests skipped: " << hosts_->why_not();
    dir_ = MakeTempDir();
    mark_ = UniqueMark("multihost");
  }
  void TearDown() override {
    hosts_.reset();
    if (!dir_.empty()) {
      KillAll("KEEL_TEST_MARK=" + mark_);
      fs::remove_all(dir_);
    }
  }
  // `keel launch` of node `i` (one worker) in its namespace, in the background.
  Background Node(int i, const std::string& env, const std::string& train, int port) {
    return StartBackground(hosts_->In(i) + "env KEEL_TEST_MARK=" + mark_ + " KEEL_JOB_TOKEN=" +
                               mark_ + " FLAGS_cpu_comm_backend=gloo " + env + " " + Keel() +
                               " launch --nnodes=2 --node_rank=" + std::to_string(i) +
                               " --cluster_node_ips=" + hosts_->ip(0) + "," + hosts_->ip(1) +
                               " --started_port=" + std::to_string(port) + " --log_dir=" + dir_ +
                               "/log" + std::to_string(i) + " " + train,
                           dir_ + "/node" + std::to_string(i) + ".txt");
  }
  std::unique_ptr<TwoHosts> hosts_;
  std::string dir_, mark_;
};

TEST_F(MultiHostTest, TwoNodesOverGlooMatchTheOneNodeResult) {
  const std::string train =
      Keel() + " train --model=mlp --mlp_hidden=64 --optimizer=adam --seed=3 --steps=30";
  auto one = RunCommand("FLAGS_cpu_comm_backend=gloo " + Keel() +
                        " launch --nproc_per_node=2 --log_dir=" + dir_ + "/log " + train +
                        " --save_dir=" + dir_ + "/one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  Background a = Node(0, "", train + " --save_dir=" + dir_ + "/two", 29400);
  Background b = Node(1, "", train, 29400);
  int sa = WaitFor(a.pid, 180), sb = WaitFor(b.pid, 180);
  ASSERT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << ReadText(a.output_path);
  ASSERT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << ReadText(b.output_path);
  EXPECT_TRUE(Contains(ReadText(a.output_path), "2 worker(s)")) << ReadText(a.output_path);
  EXPECT_EQ(CheckpointTensorBytes(dir_ + "/two"), CheckpointTensorBytes(dir_ + "/one"));
}

TEST_F(MultiHostTest, ACutLinkFailsBothNodesWithinTheCommTimeoutNamingTheCollective) {
  const int timeout_s = 6;
  const std::string train = Keel() + " train --model=mlp --mlp_hidden=64 --steps=100000000";
  const std::string env = "FLAGS_comm_timeout_s=" + std::to_string(timeout_s);
  Background a = Node(0, env, train, 29410);
  Background b = Node(1, env, train, 29410);
  ASSERT_TRUE(WaitForText(a.output_path, "step 10 ", 120)) << ReadText(a.output_path);
  hosts_->CutLink();
  auto t0 = std::chrono::steady_clock::now();
  int sa = WaitFor(a.pid, 120), sb = WaitFor(b.pid, 120);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string oa = ReadText(a.output_path), ob = ReadText(b.output_path);
  ASSERT_NE(sa, -1) << "node 0 did not end\n" << oa;
  ASSERT_NE(sb, -1) << "node 1 did not end\n" << ob;
  EXPECT_FALSE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << oa;
  EXPECT_FALSE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << ob;
  // The comm timeout, the launcher's grace period and some slack.
  EXPECT_LT(took, timeout_s + 5 + 20) << oa << ob;
  EXPECT_TRUE(Contains(oa, "allreduce")) << oa;
  EXPECT_TRUE(Contains(ob, "allreduce")) << ob;
}

TEST_F(MultiHostTest, ARemoteWorkerKilledMidTrainingEndsTheOtherNodeQuickly) {
  // Saving every step: the kill lands in or around a save. A long comm timeout shows that the
  // end comes from the dead peer, not from a timeout.
  const std::string train = Keel() +
                            " train --model=mlp --mlp_hidden=64 --steps=100000000 "
                            "--save_every=1 --save_dir=" +
                            dir_ + "/ckpt";
  Background a = Node(0, "FLAGS_comm_timeout_s=300", train, 29420);
  Background b = Node(1, "FLAGS_comm_timeout_s=300", train, 29420);
  ASSERT_TRUE(WaitForText(a.output_path, "step 20 ", 120)) << ReadText(a.output_path);
  std::vector<pid_t> remote = FindProcesses("KEEL_TEST_MARK=" + mark_, 1, "keel");
  ASSERT_EQ(remote.size(), 1u);
  kill(remote[0], SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  int sa = WaitFor(a.pid, 120), sb = WaitFor(b.pid, 120);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string oa = ReadText(a.output_path), ob = ReadText(b.output_path);
  ASSERT_NE(sa, -1) << oa;
  ASSERT_NE(sb, -1) << ob;
  EXPECT_FALSE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << oa;
  EXPECT_LT(took, 30) << oa;
  EXPECT_TRUE(Contains(ob, "worker rank 1 (local 0, pid " + std::to_string(remote[0]) +
                               ") was killed by signal SIGKILL"))
      << ob;
  // The last complete checkpoint is readable.
  std::optional<TrainingState> st = ReadTrainingState(dir_ + "/ckpt");
  ASSERT_TRUE(st.has_value());
  EXPECT_GE(st->step, 20);
}

// Each node saves into a folder of its own (no shared file system), so only rank 0's node holds
// checkpoints. Rank 1 is killed after its 25th step; both nodes restart, rank 1 finds nothing in
// its folder and receives rank 0's checkpoint, both resume from step 20, and the job ends with the
// uninterrupted run's parameters.
TEST_F(MultiHostTest, NodeLocalSaveDirsRestartBothNodesFromRankZerosCheckpoint) {
  const std::string train = Keel() +
                            " train --model=mlp --mlp_hidden=64 --optimizer=adam --seed=3 "
                            "--steps=40 --save_every=10";
  auto straight = RunCommand("FLAGS_cpu_comm_backend=gloo " + Keel() +
                             " launch --nproc_per_node=2 --log_dir=" + dir_ + "/log " + train +
                             " --save_dir=" + dir_ + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string kill = "KEEL_FAULT_POINT=trainer_step_24@1";
  Background a =
      Node(0, kill, "--max_restarts=1 " + train + " --save_dir=" + dir_ + "/node0", 29430);
  Background b =
      Node(1, kill, "--max_restarts=1 " + train + " --save_dir=" + dir_ + "/node1", 29430);
  int sa = WaitFor(a.pid, 240), sb = WaitFor(b.pid, 240);
  std::string oa = ReadText(a.output_path), ob = ReadText(b.output_path);
  const std::string log1 = ReadText(dir_ + "/log1/workerlog.0");
  ASSERT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << oa;
  ASSERT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << ob << log1;
  EXPECT_TRUE(Contains(ob, "restart 1 of 1: worker rank 1")) << ob;
  const std::string node0 = "rank 0 on node 0 (" + hosts_->ip(0) + ")";
  const std::string node1 = "rank 1 on node 1 (" + hosts_->ip(1) + ")";
  const std::string sent =
      node0 + "'s checkpoint (step 20, " + dir_ + "/node0/" + kPersistablesFile;
  EXPECT_TRUE(Contains(oa, node1 + " has no checkpoint in " + dir_ + "/node1: it is sent " + sent))
      << oa;
  EXPECT_TRUE(Contains(oa, "resumed from " + dir_ + "/node0 at step 20")) << oa;
  EXPECT_TRUE(
      Contains(log1, node1 + " has no checkpoint in " + dir_ + "/node1: resuming from " + sent))
      << log1;
  EXPECT_EQ(CheckpointTensorBytes(dir_ + "/node0"), CheckpointTensorBytes(dir_ + "/straight"));
}

// Rank 0's latest checkpoint is damaged, so its own folder offers the previous one (step 20),
// while rank 1's node holds a sound copy of step 30. Both resume from step 30, which rank 0
// receives from rank 1, and the job ends with the uninterrupted run's parameters.
TEST_F(MultiHostTest, ADamagedLatestCheckpointOnOneNodeIsReplacedByTheOtherNodesNewerOne) {
  const std::string train = Keel() +
                            " train --model=mlp --mlp_hidden=64 --optimizer=adam --seed=3 "
                            "--save_every=10";
  const std::string one = "FLAGS_cpu_comm_backend=gloo " + Keel() +
                          " launch --nproc_per_node=2 --log_dir=" + dir_ + "/log " + train;
  auto straight = RunCommand(one + " --steps=40 --save_dir=" + dir_ + "/straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  auto first = RunCommand(one + " --steps=30 --save_dir=" + dir_ + "/node0");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  fs::copy(dir_ + "/node0", dir_ + "/node1", fs::copy_options::recursive);
  const std::string latest = dir_ + "/node0/" + kPersistablesFile;
  std::string bytes = ReadText(latest);
  bytes[bytes.size() - 3] ^= 0x40;  // a flipped bit in the tensor data
  fs::remove(latest);               // the previous checkpoint is a hard link of it: a new file
  WriteText(latest, bytes);

  const std::string resume = train + " --steps=40 --auto_resume --save_dir=" + dir_;
  Background a = Node(0, "", resume + "/node0", 29440);
  Background b = Node(1, "", resume + "/node1", 29440);
  int sa = WaitFor(a.pid, 180), sb = WaitFor(b.pid, 180);
  std::string oa = ReadText(a.output_path), ob = ReadText(b.output_path);
  ASSERT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << oa;
  ASSERT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << ob;
  EXPECT_TRUE(Contains(oa, "the latest checkpoint is damaged")) << oa;
  const std::string from = dir_ + "/node1/" + kPersistablesFile + " (sent by rank 1)";
  EXPECT_TRUE(Contains(oa, "rank 0 on node 0 (" + hosts_->ip(0) + ") has step 20 in " + dir_ +
                               "/node0/" + kPreviousPersistablesFile +
                               ": it is sent rank 1 on "
                               "node 1 (" +
                               hosts_->ip(1) + ")'s checkpoint (step 30"))
      << oa;
  EXPECT_TRUE(Contains(oa, "resumed from " + from + " at step 30")) << oa;
  EXPECT_TRUE(fs::exists(latest + ".damaged"));
  EXPECT_EQ(CheckpointTensorBytes(dir_ + "/node0"), CheckpointTensorBytes(dir_ + "/straight"));
}

// A checkpoint no node has is an error on every node before any step, naming each node and the
// folder it looked in.
TEST_F(MultiHostTest, ALoadDirNoNodeHasFailsEveryNodeNamingThem) {
  const std::string train =
      Keel() + " train --model=mlp --mlp_hidden=64 --steps=40 --load_dir=" + dir_ + "/nowhere";
  Background a = Node(0, "", train, 29450);
  Background b = Node(1, "", train, 29450);
  int sa = WaitFor(a.pid, 120), sb = WaitFor(b.pid, 120);
  std::string oa = ReadText(a.output_path), ob = ReadText(b.output_path);
  ASSERT_NE(sa, -1) << oa;
  ASSERT_NE(sb, -1) << ob;
  EXPECT_FALSE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << oa;
  EXPECT_FALSE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << ob;
  const std::string why = "--load_dir=" + dir_ + "/nowhere: no " + kPersistablesFile +
                          " there on any node (rank 0 on node 0 (" + hosts_->ip(0) + ") in " +
                          dir_ + "/nowhere, rank 1 on node 1 (" + hosts_->ip(1) + ") in " + dir_ +
                          "/nowhere)";
  for (const std::string& log :
       {ReadText(dir_ + "/log0/workerlog.0"), ReadText(dir_ + "/log1/workerlog.0")}) {
    EXPECT_TRUE(Contains(log, why)) << log;
    EXPECT_FALSE(Contains(log, "step 0 ")) << log;
  }
}

}  // namespace
}  // namespace keel::testing
