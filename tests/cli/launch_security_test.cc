// keel launch and rank 0's port: the launcher holds the port from before the first attempt to the
// end of the last, so a local process that tries to take it between a failed attempt and its
// restart cannot (it used to, and then saw the job token in every rank's hello); a port taken
// before the job starts ends the job at once naming the port without spending restarts; the
// launcher serves the store there itself; and no process of the job shows the token on its
// command line.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/files.h"
#include "tests/util/process.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A process of this test that wants rank 0's port: it binds 127.0.0.1:port (SO_REUSEADDR, as any
// server would) and, once it has it, accepts every connection and records what arrives.
class Squatter {
 public:
  explicit Squatter(int port) : port_(port) {}
  ~Squatter() { Stop(); }
  // One attempt to take the port; true when it is ours from now on.
  bool TryBind() {
    if (!Bind()) return false;
    thread_ = std::thread([this] { Record(); });
    return true;
  }
  // Tries to take the port every few milliseconds until it has it or Stop() is called, or
  // job_over() says the job has ended (its port is then free, of course). A port taken just as
  // the job ends (job_over() false before the bind, true half a second after it) is handed back
  // and does not count: a squat during the job leaves the job unable to finish that soon.
  void KeepTrying(std::function<bool()> job_over) {
    thread_ = std::thread([this, job_over] {
      while (!stop_ && !bound_ && !job_over()) {
        if (Bind()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          if (job_over()) {
            ::close(fd_);
            fd_ = -1;
            return;
          }
          bound_ = true;
          Record();
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool bound() const { return bound_ || fd_ >= 0; }
  std::string recorded() {
    std::lock_guard<std::mutex> lk(mu_);
    return recorded_;
  }

 private:
  bool Bind() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(fd, 64) != 0) {
      ::close(fd);
      return false;
    }
    fd_ = fd;
    return true;
  }
  void Record() {
    std::vector<int> conns;
    while (!stop_) {
      std::vector<pollfd> fds = {{fd_, POLLIN, 0}};
      for (int c : conns) fds.push_back({c, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) conns.push_back(c);
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        char buf[4096];
        ssize_t k = ::recv(fds[i].fd, buf, sizeof(buf), 0);
        if (k > 0) {
          std::lock_guard<std::mutex> lk(mu_);
          recorded_.append(buf, static_cast<size_t>(k));
        }
      }
    }
    for (int c : conns) ::close(c);
  }

  int port_, fd_ = -1;
  std::atomic<bool> stop_{false}, bound_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string recorded_;
};

class LaunchSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    mark_ = UniqueMark(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    EXPECT_EQ(KillAll("KEEL_TEST_MARK=" + mark_), 0) << "processes of the test outlived it";
    fs::remove_all(dir_);
  }
  // keel launch with this test's mark, a fixed token and a short comm timeout.
  std::string Launch(const std::string& flags) const {
    return "env KEEL_TEST_MARK=" + mark_ + " KEEL_JOB_TOKEN=" + kToken +
           " FLAGS_cpu_math_threads=1 FLAGS_comm_timeout_s=20 " + Keel() +
           " launch --nproc_per_node=2 --log_dir=" + dir_ + " " + flags;
  }
  static constexpr const char* kToken = "squat-test-token-83c1e0";
  std::string dir_, mark_;
};

// The attack: rank 1 fails, and while the launcher restarts the job (rank 0 comes back
// two seconds late) a local process tries to take rank 0's port. It never gets it, the restart
// trains, and nothing of the token reaches it.
TEST_F(LaunchSecurityTest, NobodyCanTakeRankZerosPortBetweenRestarts) {
  const int port = FreePort();
  Background job = StartBackground(
      Launch("--max_restarts=1 --master_port=" + std::to_string(port) + " " +
             BinPath("fault_worker") + " --steps=3 --fail_rank=1 --rank0_late_on_restart_s=2"),
      dir_ + "/out.txt");
  // The banner comes once the launcher holds the port.
  ASSERT_TRUE(WaitForText(job.output_path, "keel launch: 2 worker(s)", 30))
      << ReadText(job.output_path);
  Squatter squatter(port);
  squatter.KeepTrying([&] { return Contains(ReadText(job.output_path), "rank 0 of 2 done"); });
  // Until the last attempt has trained (after the job the port is free again, of course).
  const bool trained = WaitForText(job.output_path, "rank 0 of 2 done", 120);
  squatter.Stop();
  const int status = WaitFor(job.pid, 60);
  const std::string out = ReadText(job.output_path);
  EXPECT_TRUE(trained) << out;
  EXPECT_FALSE(squatter.bound()) << "a local process took rank 0's port during the job\n" << out;
  EXPECT_FALSE(Contains(squatter.recorded(), kToken)) << "the squatter saw the job token";
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(Contains(out, "restart 1 of 1")) << out;
  EXPECT_TRUE(Contains(out, "rank 0 of 2 done")) << out;
}

// A port taken before the job starts is the launcher's error, naming it; no worker starts, so
// nothing reaches the process on the port and no restart is spent on it.
TEST_F(LaunchSecurityTest, ATakenPortFailsAtOnceNamingItWithoutSpendingRestarts) {
  const int port = FreePort();
  Squatter squatter(port);
  ASSERT_TRUE(squatter.TryBind());
  const auto t0 = Clock::now();
  auto r = RunCommand(Launch("--max_restarts=2 --master_port=" + std::to_string(port) + " " +
                             BinPath("fault_worker") + " --steps=3"));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  squatter.Stop();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(seconds, 10) << r.output;
  EXPECT_TRUE(Contains(r.output, "cannot listen on 127.0.0.1:" + std::to_string(port))) << r.output;
  EXPECT_TRUE(Contains(r.output, "another process holds port " + std::to_string(port))) << r.output;
  EXPECT_FALSE(Contains(r.output, "restart")) << r.output;
  EXPECT_TRUE(squatter.recorded().empty()) << "a worker reached the squatter";
}

// The launcher serves the store itself: a rank 0 told nothing of it (KEEL_LAUNCH_STORE_PORT
// dropped) tries to serve one of its own on the port the launcher holds and fails naming the
// port; the job ends with rank 0 named, and the restarts are spent on it.
TEST_F(LaunchSecurityTest, ARankZeroThatTriesToServeTheLaunchersPortFailsNamingIt) {
  auto r = RunCommand(Launch("--max_restarts=1 sh -c 'exec env -u KEEL_LAUNCH_STORE_PORT " +
                             BinPath("fault_worker") + " --steps=3'"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "worker rank 0 (local 0, pid ")) << r.output;
  EXPECT_TRUE(Contains(r.output, "store: cannot listen on 127.0.0.1:")) << r.output;
}

// The token reaches the workers through their environment (readable by their user only), never
// through a command line (readable by everyone): not the launcher's, the sentinel's nor a
// worker's. Here the launcher draws the token itself.
TEST_F(LaunchSecurityTest, NoProcessOfTheJobShowsTheTokenOnItsCommandLine) {
  Background job = StartBackground("env -u KEEL_JOB_TOKEN KEEL_TEST_MARK=" + mark_ +
                                       " FLAGS_cpu_math_threads=1 " + Keel() +
                                       " launch --nproc_per_node=2 --log_dir=" + dir_ + " " +
                                       BinPath("fault_worker") + " --steps=100000 --step_ms=5",
                                   dir_ + "/out.txt");
  ASSERT_TRUE(WaitForText(job.output_path, "rank 0 step 3", 60)) << ReadText(job.output_path);
  std::string token;
  for (pid_t pid : FindProcesses("KEEL_TEST_MARK=" + mark_, 1)) {
    const std::string env =
        std::string(1, '\0') + ReadText("/proc/" + std::to_string(pid) + "/environ");
    const std::string key("\0KEEL_JOB_TOKEN=", 16);
    const size_t at = env.find(key);
    if (at != std::string::npos)
      token = env.substr(at + key.size(), env.find('\0', at + key.size()) - at - key.size());
  }
  std::map<pid_t, std::string> cmdlines;
  for (pid_t pid : FindProcesses("KEEL_TEST_MARK=" + mark_))
    cmdlines[pid] = ReadText("/proc/" + std::to_string(pid) + "/cmdline");
  kill(job.pid, SIGTERM);
  WaitFor(job.pid, 30);
  ASSERT_EQ(token.size(), 32u) << "no drawn token in rank 1's environment";
  // The launcher, its sentinel and two workers at least.
  EXPECT_GE(cmdlines.size(), 4u);
  for (const auto& [pid, cmdline] : cmdlines)
    EXPECT_FALSE(Contains(cmdline, token)) << "pid " << pid << ": " << cmdline;
}

}  // namespace
}  // namespace keel::testing
