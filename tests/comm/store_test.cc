// The rendezvous store: set/get/add/wait with timeouts, barriers that name missing ranks, refusal
// of strangers, and survival of hostile traffic (huge hellos, floods of silent connections, fd
// exhaustion) without locking the job's ranks out.
#include "framework/comm/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include "framework/error.h"
#include "tests/util/subprocess.h"

namespace keel {
namespace {

using std::chrono::milliseconds;

TEST(Store, SetGetAddCheckDelete) {
  StoreServer server("127.0.0.1", 0, "tok");
  StoreClient a("127.0.0.1", server.port(), "tok", milliseconds(2000));
  StoreClient b("127.0.0.1", server.port(), "tok", milliseconds(2000));
  a.Set("k", std::string("v\0w", 3));
  EXPECT_EQ(b.Get("k"), std::string("v\0w", 3));
  EXPECT_EQ(a.Add("n", 2), 2);
  EXPECT_EQ(b.Add("n", 5), 7);
  EXPECT_TRUE(a.Check("k"));
  a.Delete("k");
  EXPECT_FALSE(b.Check("k"));
}

TEST(Store, GetWaitsForALaterSet) {
  StoreServer server("127.0.0.1", 0, "tok");
  StoreClient a("127.0.0.1", server.port(), "tok", milliseconds(5000));
  std::thread t([&] {
    StoreClient b("127.0.0.1", server.port(), "tok", milliseconds(5000));
    std::this_thread::sleep_for(milliseconds(200));
    b.Set("late", "here");
  });
  EXPECT_EQ(a.Get("late"), "here");
  t.join();
}

TEST(Store, GetTimesOutNamingTheKey) {
  StoreServer server("127.0.0.1", 0, "tok");
  StoreClient a("127.0.0.1", server.port(), "tok", milliseconds(300));
  auto t0 = std::chrono::steady_clock::now();
  try {
    a.Get("never");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(Store, AWaitEndsAtOnceWhenARanksConnectionCloses) {
  StoreServer server("127.0.0.1", 0, "tok");
  StoreClient waiter("127.0.0.1", server.port(), "tok", milliseconds(30000),
                     StoreIdentity{/*rank=*/0, /*nranks=*/3});
  std::thread t([&] {
    StoreClient peer("127.0.0.1", server.port(), "tok", milliseconds(30000),
                     StoreIdentity{/*rank=*/2, /*nranks=*/3});
    peer.Set("present", "1");
    std::this_thread::sleep_for(milliseconds(300));
  });  // peer's connection closes here
  auto t0 = std::chrono::steady_clock::now();
  try {
    waiter.GetUnlessPeerGone("never", milliseconds(30000));
    FAIL() << "the wait outlived the peer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 closed its store connection"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  t.join();
  EXPECT_EQ(server.gone(), std::vector<int>{2});
  // A key already there is still served; a plain Get ignores who is gone.
  EXPECT_EQ(waiter.GetUnlessPeerGone("present", milliseconds(1000)), "1");
  EXPECT_THROW(waiter.Get("never", milliseconds(200)), Error);
}

TEST(Store, ConnectingToNobodyTimesOut) {
  int port;
  {
    StoreServer s("127.0.0.1", 0, "t");
    port = s.port();
  }
  EXPECT_THROW(StoreClient("127.0.0.1", port, "t", milliseconds(300)), Error);
}

TEST(Store, WrongTokenIsRefused) {
  StoreServer server("127.0.0.1", 0, "right");
  try {
    StoreClient c("127.0.0.1", server.port(), "wrong", milliseconds(2000));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server.refused(), 1);
  StoreClient ok("127.0.0.1", server.port(), "right", milliseconds(2000));  // still serving
  ok.Set("a", "b");
}

int RawConnect(int port) {
  int fd = testing::ConnectLocal(port);
  EXPECT_GE(fd, 0) << "cannot connect to port " << port;
  return fd;
}

TEST(Store, OversizedAndGarbageFramesAreRefusedNotTrusted) {
  StoreServer server("127.0.0.1", 0, "tok");
  {
    int fd = RawConnect(server.port());
    unsigned char huge[4] = {0xff, 0xff, 0xff, 0xff};  // a 4 GiB frame
    ASSERT_EQ(::send(fd, huge, 4, 0), 4);
    char buf[8];
    EXPECT_LE(::recv(fd, buf, sizeof(buf), 0), 0);  // the server hangs up
    ::close(fd);
  }
  {
    int fd = RawConnect(server.port());
    const char junk[] = "\x05\x00\x00\x00hello";
    ASSERT_GT(::send(fd, junk, sizeof(junk) - 1, 0), 0);
    char buf[8];
    EXPECT_LE(::recv(fd, buf, sizeof(buf), 0), 0);
    ::close(fd);
  }
  for (int i = 0; i < 50 && server.refused() < 2; ++i)
    std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(server.refused(), 2);
  StoreClient ok("127.0.0.1", server.port(), "tok", milliseconds(2000));
  ok.Set("still", "works");
  EXPECT_EQ(ok.Get("still"), "works");
}

TEST(Store, WrongTokenFailsAtOnceWithoutRetrying) {
  StoreServer server("127.0.0.1", 0, "right");
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(StoreClient("127.0.0.1", server.port(), "wrong", milliseconds(20000)), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// Resident memory of this process (the server runs in it), in bytes.
int64_t Rss() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// A hello may claim 64 MiB: nothing is allocated for it before its bytes arrive (the old server
// zero-filled the claimed size, +512 MB for 8 such connections), and it is refused at once.
TEST(Store, HugeHelloClaimsAllocateNothingAndAreRefused) {
  StoreServer server("127.0.0.1", 0, "tok");
  const int64_t before = Rss();
  std::vector<int> fds;
  for (int i = 0; i < 8; ++i) {
    int fd = RawConnect(server.port());
    unsigned char claim[4] = {0x00, 0x00, 0x00, 0x04};  // 64 MiB
    ASSERT_EQ(::send(fd, claim, 4, 0), 4);
    ASSERT_EQ(::send(fd, "KEEL", 4, 0), 4);
    fds.push_back(fd);
  }
  for (int i = 0; i < 100 && server.refused() < 8; ++i)
    std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(server.refused(), 8);
  EXPECT_LT(Rss() - before, int64_t{64} << 20) << "the claimed sizes were allocated";
  for (int fd : fds) {
    char buf[8];
    EXPECT_LE(::recv(fd, buf, sizeof(buf), 0), 0);  // hung up on
    ::close(fd);
  }
}

// A connection that says nothing is dropped after kHelloTimeoutMs, and costs no thread meanwhile.
TEST(Store, SilentConnectionsAreDroppedAfterTheHelloTimeout) {
  StoreServer server("127.0.0.1", 0, "tok");
  int fd = RawConnect(server.port());
  for (int i = 0; i < 100 && server.pending() < 1; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(server.pending(), 1);
  char buf[8];
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_LE(::recv(fd, buf, sizeof(buf), 0), 0);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(s, kHelloTimeoutMs / 1000.0 - 1);
  EXPECT_LT(s, kHelloTimeoutMs / 1000.0 + 3);
  ::close(fd);
}

// A child process opens `n` connections to `port` and holds them until killed.
pid_t Flood(int port, int n) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  for (int i = 0; i < n; ++i)
    if (testing::ConnectLocal(port) < 0) usleep(1000);
  pause();
  _exit(0);
}

int OpenFds() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += fcntl(fd, F_GETFD) != -1;
  return n;
}

// 1100 idle connections against a server whose process may hold only ~40 more fds: the server
// keeps at most kMaxPendingConnections strangers, survives EMFILE, the process can still open
// files (a checkpoint), and a rank that connects during the flood gets in.
TEST(Store, FloodOfSilentConnectionsUnderAnFdLimitLeavesTheJobIntact) {
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  StoreServer server("127.0.0.1", 0, "tok");
  StoreClient rank0("127.0.0.1", server.port(), "tok", milliseconds(5000), {0, 2, 0});
  rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(OpenFds() + 40);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  pid_t flooder = Flood(server.port(), 1100);
  std::this_thread::sleep_for(milliseconds(1500));
  EXPECT_LE(server.pending(), kMaxPendingConnections);
  // The process still has fds for its own files.
  {
    std::string path = "/tmp/keel_store_flood_" + std::to_string(getpid());
    std::ofstream f(path);
    EXPECT_TRUE(f.good()) << "no fd left to write a file";
    std::remove(path.c_str());
  }
  // A late rank joins during the flood and the barrier completes.
  std::thread late([&] {
    StoreClient rank1("127.0.0.1", server.port(), "tok", milliseconds(30000), {1, 2, 0});
    rank1.Barrier("b", 2, milliseconds(30000));
  });
  rank0.Barrier("b", 2, milliseconds(30000));
  late.join();
  kill(flooder, SIGKILL);
  waitpid(flooder, nullptr, 0);
  setrlimit(RLIMIT_NOFILE, &saved);
  // Still serving afterwards.
  StoreClient after("127.0.0.1", server.port(), "tok", milliseconds(5000));
  after.Set("k", "v");
  EXPECT_EQ(after.Get("k"), "v");
  EXPECT_GT(server.refused(), 0);
}

TEST(Store, BarrierNamesTheRanksThatNeverArrived) {
  StoreServer server("127.0.0.1", 0, "tok");
  StoreClient r0("127.0.0.1", server.port(), "tok", milliseconds(5000), {0, 3, 0});
  StoreClient r1("127.0.0.1", server.port(), "tok", milliseconds(5000), {1, 3, 0});
  StoreClient r2("127.0.0.1", server.port(), "tok", milliseconds(5000), {2, 3, 0});
  std::thread t([&] { EXPECT_THROW(r1.Barrier("x", 3, milliseconds(800)), Error); });
  try {
    r0.Barrier("x", 3, milliseconds(800));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 2 never arrived"), std::string::npos) << e.what();
  }
  t.join();
}

TEST(Store, BarrierFailsAtOnceWhenAMissingRankExits) {
  StoreServer server("127.0.0.1", 0, "tok");
  StoreClient r0("127.0.0.1", server.port(), "tok", milliseconds(5000), {0, 2, 0});
  auto r1 = std::make_unique<StoreClient>("127.0.0.1", server.port(), "tok", milliseconds(5000),
                                          StoreIdentity{1, 2, 0});
  std::thread closer([&] {
    std::this_thread::sleep_for(milliseconds(300));
    r1.reset();  // rank 1 exits without arriving
  });
  auto t0 = std::chrono::steady_clock::now();
  try {
    r0.Barrier("y", 2, milliseconds(60000));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 closed its store connection"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  closer.join();
}

TEST(Store, BarrierReleasesEveryRank) {
  StoreServer server("127.0.0.1", 0, "tok");
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&, r] {
      StoreClient c("127.0.0.1", server.port(), "tok", milliseconds(5000), {r, 4, 0});
      for (int round = 0; round < 20; ++round)
        c.Barrier("round" + std::to_string(round), 4, milliseconds(5000));
    });
  for (auto& t : ranks) t.join();
}

TEST(Store, GetTimeoutSaysWhichRanksHaveNoConnection) {
  StoreServer server("127.0.0.1", 0, "tok");
  StoreClient r0("127.0.0.1", server.port(), "tok", milliseconds(300), {0, 3, 0});
  { StoreClient r2("127.0.0.1", server.port(), "tok", milliseconds(300), {2, 3, 0}); }
  try {
    r0.Get("from_rank1");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rank(s) 1 never connected"), std::string::npos) << m;
    EXPECT_NE(m.find("rank(s) 2 closed their store connection"), std::string::npos) << m;
  }
}

// A worker of restart N meets the store of an earlier round (still shutting down): it retries
// until the timeout, then says so.
TEST(Store, AnotherRestartGenerationIsRetriedThenNamed) {
  StoreServer server("127.0.0.1", 0, "tok", /*generation=*/1);
  try {
    StoreClient c("127.0.0.1", server.port(), "tok", milliseconds(600), {1, 2, 2});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("restart generation 1"), std::string::npos) << e.what();
  }
  StoreClient ok("127.0.0.1", server.port(), "tok", milliseconds(600), {1, 2, 1});
}

struct EnvVar {
  EnvVar(const char* name, const char* value) : name(name) {
    const char* old = std::getenv(name);
    had = old != nullptr;
    if (had) saved = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~EnvVar() {
    if (had)
      setenv(name.c_str(), saved.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
  std::string name, saved;
  bool had = false;
};

TEST(Store, MultiRankJobsNeedATokenOnlyTheJobKnows) {
  EnvVar no_token("KEEL_JOB_TOKEN", nullptr);
  EnvVar no_ompi("OMPI_MCA_orte_precondition_transports", nullptr);
  EXPECT_EQ(JobTokenFromEnvironment(1), "");
  try {
    JobTokenFromEnvironment(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KEEL_JOB_TOKEN"), std::string::npos) << e.what();
  }
  {
    EnvVar ompi("OMPI_MCA_orte_precondition_transports", "131be1b55061db5a-616e411ec4988a92");
    EnvVar job("OMPI_MCA_ess_base_jobid", "1483538433");
    EXPECT_EQ(JobTokenFromEnvironment(2), "ompi:131be1b55061db5a-616e411ec4988a92:1483538433");
  }
  EnvVar token("KEEL_JOB_TOKEN", "s3cret");
  EXPECT_EQ(JobTokenFromEnvironment(4), "s3cret");
}

}  // namespace
}  // namespace keel
