// framework/base: strings split, joined and trimmed the way keel's parsers rely on (every
// separator splits), endpoints checked the same way everywhere, and whole reads and writes on a
// file descriptor (short writes finished, a timeout, a gone peer an EPIPE rather than a SIGPIPE).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "framework/base/endpoint.h"
#include "framework/base/fd_io.h"
#include "framework/base/strings.h"
#include "framework/error.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;
using Strings = std::vector<std::string>;

TEST(Strings, SplitKeepsEveryEntryEmptyOnesIncluded) {
  EXPECT_EQ(StrSplit("a,b,c", ','), (Strings{"a", "b", "c"}));
  EXPECT_EQ(StrSplit("a,,b,", ','), (Strings{"a", "", "b", ""}));
  EXPECT_EQ(StrSplit("", ','), (Strings{""}));
  EXPECT_EQ(StrSplit("/usr/bin::/bin", ':'), (Strings{"/usr/bin", "", "/bin"}));
  EXPECT_EQ(StrSplit("no separator", ','), (Strings{"no separator"}));
}

TEST(Strings, JoinIsSplitsInverse) {
  for (const std::string s : {"a,b,c", "a,,b,", "", ","})
    EXPECT_EQ(StrJoin(StrSplit(s, ','), ","), s);
  EXPECT_EQ(StrJoin(Strings{}, ", "), "");
  EXPECT_EQ(StrJoin(Strings{"x", "y"}, ", "), "x, y");
  EXPECT_EQ(StrJoin(std::vector<int>{1, -2, 30}, ","), "1,-2,30");
  EXPECT_EQ(StrJoin(std::vector<int>{}, ","), "");
}

TEST(Strings, TrimRemovesSpacesAndTabsOnly) {
  EXPECT_EQ(StrTrim("  a b\t"), "a b");
  EXPECT_EQ(StrTrim(" \t "), "");
  EXPECT_EQ(StrTrim(""), "");
  EXPECT_EQ(StrTrim("\nx\n"), "\nx\n");
}

TEST(Endpoint, ParsesHostAndPort) {
  HostPort hp = ParseEndpoint("x", "10.0.0.1:6170");
  EXPECT_EQ(hp.host, "10.0.0.1");
  EXPECT_EQ(hp.port, 6170);
  EXPECT_EQ(ParseEndpoint("x", "node-3.cluster:1").host, "node-3.cluster");
  EXPECT_EQ(ParseEndpoint("x", "[::1]:65535").host, "[::1]");  // the last ':' splits
}

TEST(Endpoint, MalformedEndpointsAreErrorsNamingTheSource) {
  EXPECT_EQ(ErrorOf([] { ParseEndpoint("PADDLE_CURRENT_ENDPOINT", "10.0.0.1"); }),
            "PADDLE_CURRENT_ENDPOINT='10.0.0.1' is not host:port");
  EXPECT_EQ(ErrorOf([] { ParseEndpoint("x", "h:99999"); }),
            "x='h:99999': port '99999' is not in 1..65535");
  for (const char* bad : {"h:12a", "h:", "h:0", "h:-1", "h:+80", ":80", "a b:80", "a,b:80",
                          "a/b:80", "::1:80", "[::1:80"}) {
    std::string e = ErrorOf([&] { ParseEndpoint("x", bad); });
    EXPECT_EQ(e.rfind(std::string("x='") + bad + "'", 0), 0u) << bad << ": " << e;
  }
}

TEST(Endpoint, CheckHostAndParsePort) {
  EXPECT_EQ(ErrorOf([] { CheckHost("--node_ip", "127.0.0.1"); }), "");
  EXPECT_EQ(ErrorOf([] { CheckHost("--node_ip", "a b"); }),
            "--node_ip: 'a b' is not a host name or address");
  EXPECT_NE(ErrorOf([] { CheckHost("--node_ip", ""); }), "");
  EXPECT_EQ(ParsePort("MASTER_PORT", "29500"), 29500);
  EXPECT_EQ(ErrorOf([] { ParsePort("MASTER_PORT", "80x"); }),
            "MASTER_PORT: port '80x' is not in 1..65535");
}

// A pipe's two ends, closed at the end of the test.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() { EXPECT_EQ(::pipe(fds), 0); }
  ~Pipe() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
};

TEST(FdIo, WriteAllFinishesWritesLargerThanThePipe) {
  Pipe p;
  std::string data(1 << 20, 'x');  // far more than a pipe holds: written in many pieces
  for (size_t i = 0; i < data.size(); i += 4093) data[i] = static_cast<char>(i);
  std::string got(data.size(), '\0');
  std::thread reader([&] { EXPECT_TRUE(ReadAll(p.fds[0], got.data(), got.size())); });
  size_t written = 0;
  EXPECT_TRUE(WriteAll(p.fds[1], data.data(), data.size(), &written));
  reader.join();
  EXPECT_EQ(written, data.size());
  EXPECT_EQ(got, data);
}

TEST(FdIo, ReadAllStopsAtEndOfFileAndAtTheTimeout) {
  Pipe p;
  char buf[8];
  ASSERT_TRUE(WriteAll(p.fds[1], "abc", 3));
  EXPECT_FALSE(ReadAll(p.fds[0], buf, sizeof(buf), /*timeout_ms=*/50));  // 3 of 8, then nothing
  ::close(p.fds[1]);
  p.fds[1] = -1;
  EXPECT_FALSE(ReadAll(p.fds[0], buf, sizeof(buf)));  // end of file
}

TEST(FdIo, WritingToAGonePeerIsAnErrorNotADeadProcess) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ::close(sv[1]);
  EXPECT_FALSE(SendAll(sv[0], "x", 1));  // without MSG_NOSIGNAL this test would die of SIGPIPE
  EXPECT_EQ(errno, EPIPE);
  ::close(sv[0]);

  Pipe p;
  ::close(p.fds[0]);
  p.fds[0] = -1;
  // A pipe has no MSG_NOSIGNAL: WriteAll to a pipe without a reader gets EPIPE only where
  // SIGPIPE is ignored, as the callers that write to pipes arrange (keel launch blocks it).
  sighandler_t old = ::signal(SIGPIPE, SIG_IGN);
  EXPECT_FALSE(WriteAll(p.fds[1], "x", 1));
  EXPECT_EQ(errno, EPIPE);
  ::signal(SIGPIPE, old);
}

}  // namespace
}  // namespace keel
