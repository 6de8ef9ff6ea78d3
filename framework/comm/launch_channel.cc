#include "framework/comm/launch_channel.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "framework/error.h"

namespace keel {

namespace {

// The descriptor an environment variable names; -1 when unset or not a number.
int FdFromEnvironment(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  long fd = std::strtol(v, &end, 10);
  if (end == nullptr || *end != '\0' || fd < 3 || fd > (1 << 20)) return -1;
  return static_cast<int>(fd);
}

}  // namespace

int InheritedStoreSocket(int port) {
  const int fd = FdFromEnvironment("KEEL_STORE_LISTEN_FD");
  if (fd < 0 || port <= 0) return -1;
  int listening = 0, type = 0;
  socklen_t len = sizeof(listening);
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) return -1;
  len = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return -1;
  sockaddr_in addr{};
  len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      addr.sin_family != AF_INET || ntohs(addr.sin_port) != port)
    return -1;
  // This process's programs (a data loader's shell, a subprocess) must not inherit the port.
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
}

void TellLauncher(const std::string& event, int rank) {
  static std::once_flag once;
  static int fd = -1;
  std::call_once(once, [] {
    // "<fd>:<inode of the pipe>": a process that inherited the variable but not the pipe (its fd
    // number now another file) is not fooled.
    const char* v = std::getenv("KEEL_LAUNCH_STATUS_FD");
    if (v == nullptr) return;
    char* end = nullptr;
    const long candidate = std::strtol(v, &end, 10);
    if (end == nullptr || *end != ':' || candidate < 3 || candidate > (1 << 20)) return;
    const unsigned long long inode = std::strtoull(end + 1, &end, 10);
    struct stat st;
    if (*end != '\0' || ::fstat(static_cast<int>(candidate), &st) != 0 || !S_ISFIFO(st.st_mode) ||
        st.st_ino != inode)
      return;
    const int flags = ::fcntl(static_cast<int>(candidate), F_GETFL);
    if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY) return;
    ::fcntl(static_cast<int>(candidate), F_SETFL, flags | O_NONBLOCK);
    ::fcntl(static_cast<int>(candidate), F_SETFD, FD_CLOEXEC);
    fd = static_cast<int>(candidate);
  });
  if (fd < 0) return;
  const std::string line = StrCat(event, " ", rank, "\n");
  // One short write to a pipe is atomic; a full pipe or a launcher gone drops the line (SIGPIPE
  // is ignored once communication starts, CommContext::Init).
  ssize_t n;
  do {
    n = ::write(fd, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
}

}  // namespace keel
