#include "tests/util/subprocess.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"

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

std::string Keel() { return BinPath("keel"); }

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

int ConnectLocal(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  ::close(fd);
  return -1;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::map<std::string, std::string> CheckpointTensorBytes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (auto& [name, t] : LoadSafetensors(dir + "/" + kPersistablesFile))
    out[name] = std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
  return out;
}

bool HaveTensorboard() {
  return std::system("/usr/bin/env python3 -c 'import tensorboard' >/dev/null 2>&1") == 0;
}

std::map<std::string, std::map<int64_t, double>> ReadTensorboardScalars(const std::string& dir) {
  auto r = RunCommand("/usr/bin/env python3 " + std::string(KEEL_SOURCE_DIR) +
                      "/tests/summary/read_tfevents.py " + dir + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, std::map<int64_t, double>> out;
  std::istringstream in(r.output);
  std::string tag;
  int64_t step;
  double value;
  while (in >> tag >> step >> value) out[tag][step] = value;
  return out;
}

}  // namespace keel::testing
