// The store's handshake keeps the job token off the wire: a process that records every byte
// between the ranks and rank 0 (a proxy, a squatter on rank 0's port) never sees it, a recorded
// handshake cannot be replayed, a wrong token is refused, and a listener that does not know the
// token cannot pose as the store.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "framework/comm/store.h"
#include "framework/error.h"
#include "tests/util/files.h"
#include "tests/util/process.h"
#include "tests/util/subprocess.h"

namespace keel {
namespace {

using std::chrono::milliseconds;
using testing::BinPath;
using testing::Contains;

constexpr char kToken[] = "job-secret-5f1c9a7e2b";

// A listening socket on 127.0.0.1 (a free port).
int ListenLocal(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::listen(fd, 64), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

// One frame: a little-endian u32 length, then the bytes.
std::string Frame(const std::string& payload) {
  std::string f(4, '\0');
  for (int i = 0; i < 4; ++i) f[i] = static_cast<char>((payload.size() >> (8 * i)) & 0xff);
  return f + payload;
}

// Reads one frame (at most 4 KiB) within 5 s; "" on failure.
std::string ReadFrameOf(int fd, std::string* recorded) {
  auto read_n = [&](size_t n) {
    std::string out;
    while (out.size() < n) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) return std::string();
      char buf[4096];
      ssize_t k = ::recv(fd, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (k <= 0) return std::string();
      out.append(buf, static_cast<size_t>(k));
    }
    return out;
  };
  std::string len = read_n(4);
  if (len.size() != 4) return "";
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= static_cast<uint32_t>(static_cast<unsigned char>(len[i])) << (8 * i);
  if (n > 4096) return "";
  std::string body = read_n(n);
  *recorded += len + body;
  return body;
}

// Relays connections from its own port to 127.0.0.1:`target`, recording every byte both ways.
class RecordingProxy {
 public:
  explicit RecordingProxy(int target) : target_(target) {
    listen_fd_ = ListenLocal(&port_);
    thread_ = std::thread([this] { Run(); });
  }
  ~RecordingProxy() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }
  std::string recorded() {
    std::lock_guard<std::mutex> lk(mu_);
    return recorded_;
  }
  // What each connection's client sent, by connection.
  std::vector<std::string> sent_by_clients() {
    std::lock_guard<std::mutex> lk(mu_);
    return client_bytes_;
  }

 private:
  void Run() {
    struct Pair {
      int fd[2];     // the client's connection, the server's
      bool open[2];  // whether each still sends
      size_t index;  // into client_bytes_
    };
    std::vector<Pair> pairs;
    while (!stop_) {
      std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}};
      for (const Pair& p : pairs)
        for (int dir = 0; dir < 2; ++dir) fds.push_back({p.open[dir] ? p.fd[dir] : -1, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      for (size_t i = 0; i < pairs.size(); ++i) {
        Pair& p = pairs[i];
        for (int dir = 0; dir < 2; ++dir) {
          if (!fds[1 + 2 * i + dir].revents) continue;
          char buf[65536];
          ssize_t k = ::recv(p.fd[dir], buf, sizeof(buf), 0);
          if (k <= 0) {
            p.open[dir] = false;
            ::shutdown(p.fd[1 - dir], SHUT_WR);
            continue;
          }
          std::lock_guard<std::mutex> lk(mu_);
          recorded_.append(buf, static_cast<size_t>(k));
          if (dir == 0) client_bytes_[p.index].append(buf, static_cast<size_t>(k));
          ::send(p.fd[1 - dir], buf, static_cast<size_t>(k), MSG_NOSIGNAL);
        }
      }
      if (fds[0].revents & POLLIN) {
        int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        int s = testing::ConnectLocal(target_);
        if (s < 0) {  // the server is not up yet: the client retries
          ::close(c);
          continue;
        }
        std::lock_guard<std::mutex> lk(mu_);
        pairs.push_back({{c, s}, {true, true}, client_bytes_.size()});
        client_bytes_.emplace_back();
      }
    }
    for (const Pair& p : pairs) {
      ::close(p.fd[0]);
      ::close(p.fd[1]);
    }
  }

  int target_, port_ = 0, listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string recorded_;
  std::vector<std::string> client_bytes_;
};

TEST(StoreHandshake, TheTokenNeverCrossesTheWire) {
  StoreServer server("127.0.0.1", 0, kToken);
  RecordingProxy proxy(server.port());
  {
    StoreClient a("127.0.0.1", proxy.port(), kToken, milliseconds(5000), {0, 2, 0});
    StoreClient b("127.0.0.1", proxy.port(), kToken, milliseconds(5000), {1, 2, 0});
    a.Set("k", "v");
    EXPECT_EQ(b.Get("k"), "v");
    std::thread t([&] { b.Barrier("bar", 2, milliseconds(5000)); });
    a.Barrier("bar", 2, milliseconds(5000));
    t.join();
  }
  const std::string bytes = proxy.recorded();
  EXPECT_GT(bytes.size(), 100u) << "the proxy relayed nothing";
  EXPECT_FALSE(Contains(bytes, kToken)) << "the job token crossed the wire";
}

// A proxy that recorded a rank's handshake replays it: the server's fresh nonce makes the recorded
// proof worthless (the old hello carried the token itself, so a replay got in).
TEST(StoreHandshake, ARecordedHandshakeCannotBeReplayed) {
  StoreServer server("127.0.0.1", 0, kToken);
  std::vector<std::string> frames;
  {
    RecordingProxy proxy(server.port());
    StoreClient a("127.0.0.1", proxy.port(), kToken, milliseconds(5000));
    a.Set("secret", "value");
    frames = proxy.sent_by_clients();
  }
  ASSERT_EQ(frames.size(), 1u);
  const int refused_before = server.refused();
  int fd = testing::ConnectLocal(server.port());
  ASSERT_GE(fd, 0);
  // Replay what the client sent, the hello first, then the rest once the server has answered it.
  std::string recorded, ignored;
  uint32_t hello_len = 0;
  for (int i = 0; i < 4; ++i)
    hello_len |= static_cast<uint32_t>(static_cast<unsigned char>(frames[0][i])) << (8 * i);
  ASSERT_EQ(::send(fd, frames[0].data(), 4 + hello_len, MSG_NOSIGNAL),
            static_cast<ssize_t>(4 + hello_len));
  std::string challenge = ReadFrameOf(fd, &ignored);
  ASSERT_FALSE(challenge.empty()) << "no challenge";
  const std::string rest = frames[0].substr(4 + hello_len);
  ::send(fd, rest.data(), rest.size(), MSG_NOSIGNAL);
  std::string answer = ReadFrameOf(fd, &recorded);
  ::close(fd);
  EXPECT_TRUE(answer.empty() || answer[0] != 0) << "the replayed handshake was accepted";
  for (int i = 0; i < 100 && server.refused() == refused_before; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(server.refused(), refused_before + 1);
}

// A process on rank 0's port that does not know the token (a squatter) records what a rank sends
// and says yes to anything: it learns no token, and the rank refuses it at once, naming the port.
TEST(StoreHandshake, AListenerWithoutTheTokenSeesNoTokenAndIsRefused) {
  int port = 0;
  int listen_fd = ListenLocal(&port);
  std::string recorded;
  std::thread squatter([&] {
    pollfd p{listen_fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return;
    int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd < 0) return;
    std::string hello = ReadFrameOf(fd, &recorded);
    if (hello.empty()) {
      ::close(fd);
      return;
    }
    // What the store would answer: a challenge (code 6 and 16 bytes), then "ok" with a proof
    // that it cannot compute.
    std::string challenge = std::string(1, '\x06') + std::string(16, 'n');
    ::send(fd, Frame(challenge).data(), 4 + challenge.size(), MSG_NOSIGNAL);
    ReadFrameOf(fd, &recorded);
    std::string ok = std::string(1, '\0') + std::string(32, 'p');
    ::send(fd, Frame(ok).data(), 4 + ok.size(), MSG_NOSIGNAL);
    // Whatever comes next (a request would follow a trusted handshake).
    ReadFrameOf(fd, &recorded);
    ::close(fd);
  });
  auto t0 = std::chrono::steady_clock::now();
  try {
    StoreClient c("127.0.0.1", port, kToken, milliseconds(20000), {1, 2, 0});
    c.Set("keel/join/g0/rank1", "x");
    ADD_FAILURE() << "the client trusted a listener that does not know the token";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(Contains(what, "does not know the job token")) << what;
    EXPECT_TRUE(Contains(what, ":" + std::to_string(port))) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  squatter.join();
  ::close(listen_fd);
  EXPECT_FALSE(recorded.empty()) << "the squatter saw no handshake";
  EXPECT_FALSE(Contains(recorded, kToken)) << "the squatter learned the token";
  EXPECT_FALSE(Contains(recorded, "keel/join")) << "a request followed an unproven handshake";
}

TEST(StoreHandshake, AWrongTokenIsRefusedAtOnceAndTheStoreServesOn) {
  StoreServer server("127.0.0.1", 0, kToken);
  auto t0 = std::chrono::steady_clock::now();
  try {
    StoreClient c("127.0.0.1", server.port(), "another-jobs-token", milliseconds(20000));
    ADD_FAILURE() << "a wrong token got in";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "KEEL_JOB_TOKEN")) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(server.refused(), 1);
  StoreClient ok("127.0.0.1", server.port(), kToken, milliseconds(5000));
  ok.Set("a", "b");
  EXPECT_EQ(ok.Get("a"), "b");
}

// Two real ranks, rank 1 reaching rank 0's store through a recording proxy: rendezvous, ring
// setup (whose keys used to start with the token) and training cross it without the token.
TEST(StoreHandshake, ATwoRankJobSendsNoTokenToTheStore) {
  const int port = testing::FreePort();
  RecordingProxy proxy(port);
  const std::string common = std::string("KEEL_JOB_TOKEN=") + kToken +
                             " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
                             "FLAGS_cpu_math_threads=1 FLAGS_comm_timeout_s=60 ";
  const std::string dir = testing::MakeTempDir();
  testing::Background rank0 = testing::StartBackground(
      "env " + common + "RANK=0 LOCAL_RANK=0 MASTER_PORT=" + std::to_string(port) + " " +
          BinPath("mlp_dp_worker") + " --steps=3 --global_batch=8",
      dir + "/rank0.txt");
  testing::Background rank1 = testing::StartBackground(
      "env " + common + "RANK=1 LOCAL_RANK=1 MASTER_PORT=" + std::to_string(proxy.port()) + " " +
          BinPath("mlp_dp_worker") + " --steps=3 --global_batch=8",
      dir + "/rank1.txt");
  const int s0 = testing::WaitFor(rank0.pid, 120), s1 = testing::WaitFor(rank1.pid, 120);
  const std::string logs =
      testing::ReadText(dir + "/rank0.txt") + testing::ReadText(dir + "/rank1.txt");
  EXPECT_EQ(s0, 0) << logs;
  EXPECT_EQ(s1, 0) << logs;
  EXPECT_TRUE(Contains(logs, "rank 1 params")) << logs;
  const std::string bytes = proxy.recorded();
  EXPECT_TRUE(Contains(bytes, "keel/join")) << "rank 1 did not go through the proxy";
  EXPECT_FALSE(Contains(bytes, kToken)) << "the job token crossed the wire";
  testing::RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel
