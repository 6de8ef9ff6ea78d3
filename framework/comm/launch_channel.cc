#include "framework/comm/launch_channel.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "framework/error.h"

namespace keel {

namespace {

// The write end of keel launch's status pipe, validated once (close-on-exec, non-blocking); -1
// when this process is not a launched worker.
int StatusFd() {
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
  return fd;
}

}  // namespace

bool LauncherServesStore(int port) {
  const char* v = std::getenv("KEEL_LAUNCH_STORE_PORT");
  if (v == nullptr || port <= 0 || StatusFd() < 0) return false;
  char* end = nullptr;
  const long p = std::strtol(v, &end, 10);
  return end != v && *end == '\0' && p == port;
}

void TellLauncher(const std::string& event, int rank) {
  const int fd = StatusFd();
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
