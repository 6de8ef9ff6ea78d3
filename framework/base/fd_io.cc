#include "framework/base/fd_io.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

namespace keel {
namespace {

// The loop WriteAll and SendAll share; `put` is write(2) or send(2).
template <typename Put>
bool PutAll(const char* data, size_t n, size_t* written, Put put) {
  size_t done = 0;
  bool ok = true;
  while (done < n) {
    ssize_t k = put(data + done, n - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = ENOSPC;
      ok = false;
      break;
    }
    done += static_cast<size_t>(k);
  }
  if (written != nullptr) *written = done;
  return ok;
}

}  // namespace

bool WriteAll(int fd, const void* data, size_t n, size_t* written) {
  return PutAll(static_cast<const char*>(data), n, written,
                [fd](const char* p, size_t k) { return ::write(fd, p, k); });
}

bool SendAll(int fd, const void* data, size_t n) {
  return PutAll(static_cast<const char*>(data), n, nullptr,
                [fd](const char* p, size_t k) { return ::send(fd, p, k, MSG_NOSIGNAL); });
}

bool ReadAll(int fd, void* buf, size_t n, int64_t timeout_ms, std::string* why) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto fail = [why](std::string what) {
    if (why != nullptr) *why = std::move(what);
    return false;
  };
  char* out = static_cast<char*>(buf);
  size_t got = 0;
  while (got < n) {
    if (timeout_ms >= 0) {
      int64_t left =
          timeout_ms -
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      if (left <= 0) return fail("timed out after " + std::to_string(timeout_ms) + " ms");
      pollfd p{fd, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return fail(std::string("poll: ") + std::strerror(errno));
      if (r == 0) return fail("timed out after " + std::to_string(timeout_ms) + " ms");
    }
    ssize_t k = ::read(fd, out + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) return fail("closed by the peer");
    if (k < 0) return fail(std::string("read: ") + std::strerror(errno));
    got += static_cast<size_t>(k);
  }
  return true;
}

}  // namespace keel
