// WriteFileAtomic / ReadFile: the only two places keel touches file bytes directly.
//
// Invariant: the target name only ever names a complete file. Bytes go to a temp file in the same
// directory (same filesystem, so rename is atomic), which is fsync'ed before the rename and removed
// on every failure path; the directory is fsync'ed afterwards so the rename itself survives a
// crash.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "framework/error.h"
#include "framework/io/io.h"

namespace keel {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// ".<base>.tmp.<pid>.<random>" next to the target, so rename never crosses filesystems.
std::string TempPathFor(const std::string& dir_prefix, const std::string& base) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (counter++ * 0x9E3779B97F4A7C15ull);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(r));
  return dir_prefix + "." + base + ".tmp." + std::to_string(::getpid()) + "." + hex;
}

// Writes all of [data, data+size) to fd, retrying short writes and EINTR. Returns 0 or an errno.
int WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

void WriteFileAtomic(const std::string& path, const std::string& bytes) {
  KEEL_ENFORCE(!path.empty(), "WriteFileAtomic: empty path");
  size_t slash = path.rfind('/');
  std::string dir_prefix = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  KEEL_ENFORCE(!base.empty() && base != "." && base != "..", path,
               ": cannot write a file here (the path names a directory)");
  std::string dir = dir_prefix.empty() ? "." : dir_prefix;

  const std::string tmp = TempPathFor(dir_prefix, base);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    int e = errno;
    KEEL_THROW(path, ": cannot create temp file ", tmp, ": ", ErrnoText(e));
  }
  // Every failure below removes the temp file, so nothing is left behind.
  auto fail = [&](const char* step, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    KEEL_THROW(path, ": ", step, " failed (temp file ", tmp, "): ", ErrnoText(err));
  };
  if (int e = WriteAll(fd, bytes.data(), bytes.size())) fail("write", e);
  if (::fsync(fd) != 0) fail("fsync", errno);
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0) fail("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename over the target", errno);

  // Make the rename durable. EINVAL: the filesystem cannot fsync directories; nothing to do.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    int e = errno;
    KEEL_THROW(path, ": written, but cannot open its directory ", dir,
               " to fsync it: ", ErrnoText(e));
  }
  if (::fsync(dfd) != 0 && errno != EINVAL) {
    int e = errno;
    ::close(dfd);
    KEEL_THROW(path, ": written, but fsync of directory ", dir, " failed: ", ErrnoText(e));
  }
  ::close(dfd);
}

std::string ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    KEEL_THROW(path, ": cannot open: ", ErrnoText(e));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    KEEL_THROW(path, ": cannot stat: ", ErrnoText(e));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    KEEL_THROW(path, ": is a directory, expected a file");
  }
  // Read straight into the result; st_size is a hint (+1 so EOF needs no regrow), not trusted.
  std::string out;
  size_t len = 0;
  out.resize(S_ISREG(st.st_mode) && st.st_size > 0 ? static_cast<size_t>(st.st_size) + 1 : 4096);
  for (;;) {
    if (len == out.size()) out.resize(out.size() * 2);
    ssize_t n = ::read(fd, &out[len], out.size() - len);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      KEEL_THROW(path, ": read failed: ", ErrnoText(e));
    }
    if (n == 0) break;
    len += static_cast<size_t>(n);
  }
  out.resize(len);
  ::close(fd);
  return out;
}

}  // namespace keel
