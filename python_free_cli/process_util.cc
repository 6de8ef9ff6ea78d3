#include "python_free_cli/process_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "framework/base/strings.h"
#include "framework/error.h"

namespace keel {
namespace cli {

const char* SignalName(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return "signal";
  }
}

std::string LogTail(const std::string& path, int n) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  off_t size = std::max<off_t>(0, lseek(fd, 0, SEEK_END));
  off_t from = std::max<off_t>(0, size - 65536);
  std::string text(static_cast<size_t>(size - from), '\0');
  ssize_t got = pread(fd, text.data(), text.size(), from);
  close(fd);
  text.resize(got > 0 ? static_cast<size_t>(got) : 0);
  size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') --pos;
  for (int lines = 0; pos > 0; --pos)
    if (text[pos - 1] == '\n' && ++lines == n) break;
  return text.substr(pos);
}

int OpenHigh(const std::string& path, int flags, mode_t mode) {
  int fd = open(path.c_str(), flags | O_CLOEXEC, mode);
  KEEL_ENFORCE(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  if (fd <= 2) {  // keep 0-2 free so dup2 in the child never meets itself
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    close(fd);
    fd = high;
  }
  return fd;
}

std::vector<int> FreePorts(int count, int exclude) {
  std::vector<int> fds, ports;
  auto close_all = [&] {
    for (int fd : fds) close(fd);
  };
  while (static_cast<int>(ports.size()) < count) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      close_all();
      KEEL_THROW("cannot open a socket to find a free port: ", std::strerror(errno));
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      int err = errno;
      close_all();
      KEEL_THROW("cannot find a free port (bind to port 0): ", std::strerror(err),
                 "; pass --started_port");
    }
    int port = ntohs(addr.sin_port);
    if (port != exclude) ports.push_back(port);
  }
  close_all();
  return ports;
}

std::string ResolveExecutable(const std::string& cmd, const char* env_path) {
  auto runnable = [](const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
  };
  if (cmd.find('/') != std::string::npos) {
    struct stat st;
    KEEL_ENFORCE(stat(cmd.c_str(), &st) == 0, "cannot run command '", cmd,
                 "': ", std::strerror(errno));
    KEEL_ENFORCE(S_ISREG(st.st_mode), "cannot run command '", cmd, "': not a regular file");
    KEEL_ENFORCE(access(cmd.c_str(), X_OK) == 0, "cannot run command '", cmd,
                 "': not executable (chmod +x?)");
    return cmd;
  }
  std::string path = env_path ? env_path : "/usr/local/bin:/usr/bin:/bin";
  for (const std::string& dir : StrSplit(path, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + cmd;
    if (runnable(candidate)) return candidate;
  }
  KEEL_THROW("cannot run command '", cmd, "': not found in PATH (", path, ")");
}

int CpuCount() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::vector<int> AffinityCpus() {
  std::vector<int> cpus;
  // A mask as large as the kernel's: it refuses a smaller one (EINVAL) on machines of more than
  // CPU_SETSIZE (1024) CPUs.
  for (size_t sets = 1; sets <= 1024 && cpus.empty(); sets *= 2) {
    std::vector<cpu_set_t> mask(sets);
    const size_t bytes = sets * sizeof(cpu_set_t);
    if (sched_getaffinity(0, bytes, mask.data()) != 0) {
      if (errno == EINVAL) continue;
      break;
    }
    for (int c = 0; c < static_cast<int>(sets) * CPU_SETSIZE; ++c)
      if (CPU_ISSET_S(c, bytes, mask.data())) cpus.push_back(c);
  }
  if (cpus.empty())
    for (int c = 0; c < CpuCount(); ++c) cpus.push_back(c);
  return cpus;
}

std::string RandomToken() {
  std::random_device rd;  // /dev/urandom (getrandom) on Linux
  static const char* kHex = "0123456789abcdef";
  std::string token;
  for (int i = 0; i < 4; ++i) {
    uint32_t v = rd();
    for (int b = 0; b < 8; ++b, v >>= 4) token += kHex[v & 0xF];
  }
  return token;
}

namespace {

// `fd` moved above 2 (close-on-exec), so that dup2 onto stdio in a child never meets it.
int AboveStdio(int fd) {
  if (fd < 0 || fd > 2) return fd;
  int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  close(fd);
  return high;
}

}  // namespace

int ListenOn(const std::string& host, int port, bool loopback_only) {
  const std::string where = StrCat(host, ":", port);
  int fd = AboveStdio(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  KEEL_ENFORCE(fd >= 0, "cannot open a socket for rank 0's rendezvous store at ", where, ": ",
               std::strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(loopback_only ? INADDR_LOOPBACK : INADDR_ANY);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 512) != 0) {
    const int err = errno;
    close(fd);
    KEEL_THROW("cannot listen on ", where, " for rank 0's rendezvous store: ", std::strerror(err),
               err == EADDRINUSE
                   ? StrCat(": another process holds port ", port,
                            " (choose another --master_port/--started_port, or leave them unset "
                            "on a single node)")
                   : std::string(),
               "; no worker was started");
  }
  return fd;
}

void PipeAboveStdio(int fds[2]) {
  KEEL_ENFORCE(pipe2(fds, O_CLOEXEC) == 0, "pipe: ", std::strerror(errno));
  fds[0] = AboveStdio(fds[0]);
  fds[1] = AboveStdio(fds[1]);
  KEEL_ENFORCE(fds[0] >= 0 && fds[1] >= 0, "pipe: ", std::strerror(errno));
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
}

std::vector<ProcState> ProcessesOfGroups(const std::set<pid_t>& groups) {
  std::vector<ProcState> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string path = std::string("/proc/") + e->d_name + "/stat";
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[512];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) continue;
    buf[n] = '\0';
    // pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
    char* close_paren = std::strrchr(buf, ')');
    if (close_paren == nullptr) continue;
    char state = 0;
    int ppid = 0, pgrp = 0;
    if (std::sscanf(close_paren + 1, " %c %d %d", &state, &ppid, &pgrp) != 3) continue;
    if (groups.count(pgrp))
      out.push_back({state, static_cast<pid_t>(std::atoi(e->d_name)), static_cast<pid_t>(pgrp)});
  }
  closedir(d);
  return out;
}
}  // namespace cli
}  // namespace keel
