// Two hosts in one machine: two network namespaces joined by a veth pair, each running its own
// `keel launch` node. A 2-node job over Gloo trains to the 1-node result; a cut link fails both
// nodes within FLAGS_comm_timeout_s naming the collective; a remote worker killed mid-training
// (saving every step) ends the other node quickly. Needs root (CI has it); skipped with a message
// otherwise. Every namespace, veth and process the test creates is removed, pass or fail, and the
// names are unique per run.
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

}  // namespace
}  // namespace keel::testing
