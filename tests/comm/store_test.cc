// The rendezvous store: set/get/add/wait with timeouts, and refusal of strangers.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "framework/comm/store.h"
#include "framework/error.h"

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
  StoreClient waiter("127.0.0.1", server.port(), "tok", milliseconds(30000), /*rank=*/0);
  std::thread t([&] {
    StoreClient peer("127.0.0.1", server.port(), "tok", milliseconds(30000), /*rank=*/2);
    peer.Set("present", "1");
    std::this_thread::sleep_for(milliseconds(300));
  });  // peer's connection closes here
  auto t0 = std::chrono::steady_clock::now();
  try {
    waiter.GetUnlessPeerGone("never", milliseconds(30000));
    FAIL() << "the wait outlived the peer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("store connection of rank 2 has closed"),
              std::string::npos)
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
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
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
  for (int i = 0; i < 50 && server.refused() < 2; ++i) std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(server.refused(), 2);
  StoreClient ok("127.0.0.1", server.port(), "tok", milliseconds(2000));
  ok.Set("still", "works");
  EXPECT_EQ(ok.Get("still"), "works");
}

TEST(Store, EndpointParsing) {
  EXPECT_EQ(ParseEndpoint("10.0.0.1:6170", "x").second, 6170);
  EXPECT_THROW(ParseEndpoint("10.0.0.1", "PADDLE_CURRENT_ENDPOINT"), Error);
  EXPECT_THROW(ParseEndpoint("h:99999", "x"), Error);
  EXPECT_THROW(ParseEndpoint("h:12a", "x"), Error);
}

}  // namespace
}  // namespace keel
