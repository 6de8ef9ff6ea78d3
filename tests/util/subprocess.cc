#include "tests/util/subprocess.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>

namespace keel::testing {

CommandResult RunCommand(const std::string& cmd) {
  CommandResult r;
  std::string full = "(" + cmd + ") 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = pclose(p);
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
    // A shell reports a child killed by signal N as exit code 128 + N.
    r.signaled = r.exit_code > 128 && r.exit_code < 160;
  } else {
    r.signaled = WIFSIGNALED(status);
  }
  return r;
}

std::string BinPath(const std::string& name) {
#ifdef KEEL_BINARY_DIR
  return std::string(KEEL_BINARY_DIR) + "/bin/" + name;
#else
  return "build/bin/" + name;
#endif
}

std::string MakeTempDir() {
  char tmpl[] = "/tmp/keel_test_XXXXXX";
  char* d = mkdtemp(tmpl);
  return d ? std::string(d) : std::string("/tmp");
}

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace keel::testing
