// WriteFileAtomic / ReadFile: the only two places keel touches file bytes directly.
//
// Invariant: the target name only ever names a complete file, and a writer killed at any point
// leaves no temp file that later writes keep. Bytes go to an unnamed O_TMPFILE file in the target's
// directory (same filesystem, so the final rename is atomic), which is fsync'ed, given a temp name
// with linkat and renamed over the target; a kill before the link leaves nothing at all. Where the
// filesystem has no O_TMPFILE the temp file is named from the start. Temp names carry the writer's
// host and pid, ".<base>.tmp.<random>.<pid>@<host>", and every write first removes the temps of
// `base` that writers on this host left when they died. The directory is fsync'ed after the rename
// so the rename itself survives a crash.
//
// SIGXFSZ (a file size limit, `ulimit -f`) would kill the writer without a word: it is ignored
// (unless the program installed a handler), so the write fails with EFBIG and a keel::Error that
// names the file and the limit.
#include "framework/io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>

#include "framework/base/fd_io.h"
#include "framework/error.h"
#include "framework/fault_point.h"

namespace keel {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string h(buf);
  for (char& c : h)
    if (c == '/' || c == '@') c = '_';
  return h;
}

std::string RandomHex() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (counter++ * 0x9E3779B97F4A7C15ull);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(r));
  return hex;
}

bool PidAlive(long pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH);
}

void SplitPath(const std::string& path, std::string* dir_prefix, std::string* base) {
  size_t slash = path.rfind('/');
  *dir_prefix = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  *base = slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

// Checked on every write (one syscall): the program may have reset the disposition since.
void IgnoreSigxfsz() {
  struct sigaction old;
  if (sigaction(SIGXFSZ, nullptr, &old) == 0 && old.sa_handler == SIG_DFL)
    std::signal(SIGXFSZ, SIG_IGN);
}

std::string FileSizeLimitText() {
  rlimit rl;
  if (::getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return "";
  return StrCat(" (the file size limit, ulimit -f, is ", static_cast<uint64_t>(rl.rlim_cur),
                " bytes)");
}

std::string TempNameFor(const std::string& base) {
  return StrCat(".", base, ".tmp.", RandomHex(), ".", ::getpid(), "@", HostName());
}

bool IsStaleTempOf(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  // ...<random>.<pid>@<host>, read from the right (the host has no '@').
  std::string rest = name.substr(prefix.size());
  size_t at = rest.rfind('@');
  size_t dot = at == std::string::npos || at == 0 ? std::string::npos : rest.rfind('.', at - 1);
  if (dot == std::string::npos) return false;
  std::string pid_text = rest.substr(dot + 1, at - dot - 1);
  if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos ||
      pid_text.size() > 9)
    return false;
  if (rest.substr(at + 1) != HostName()) return false;  // another host's writer: not ours to judge
  return !PidAlive(std::stol(pid_text));
}

int RemoveStaleTemps(const std::string& dir, const std::string& prefix) {
  DIR* d = ::opendir(dir.empty() ? "." : dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (!IsStaleTempOf(name, prefix)) continue;
    std::string path = (dir.empty() ? "" : dir + "/") + name;
    std::error_code ec;
    if (std::filesystem::remove_all(path, ec) > 0 && !ec) {
      ++removed;
      LOG(INFO) << "removed " << path << ", left by a writer that died";
    }
  }
  ::closedir(d);
  return removed;
}

void WriteFileAtomic(const std::string& path, const std::string& bytes) {
  KEEL_ENFORCE(!path.empty(), "WriteFileAtomic: empty path");
  std::string dir_prefix, base;
  SplitPath(path, &dir_prefix, &base);
  KEEL_ENFORCE(!base.empty() && base != "." && base != "..", path,
               ": cannot write a file here (the path names a directory)");
  const std::string dir = dir_prefix.empty() ? "." : dir_prefix;
  IgnoreSigxfsz();
  RemoveStaleTemps(dir_prefix.empty() ? "" : dir_prefix.substr(0, dir_prefix.size() - 1),
                   "." + base + ".tmp.");

  const std::string tmp = dir_prefix + TempNameFor(base);
  // An unnamed file first: a kill before linkat leaves nothing behind.
  bool named = false;
  int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
  if (fd < 0) {
    int e = errno;
    if (e != EOPNOTSUPP && e != EISDIR && e != EINVAL && e != ENOENT)
      KEEL_THROW(path, ": cannot create a file in ", dir, ": ", ErrnoText(e));
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      e = errno;
      KEEL_THROW(path, ": cannot create temp file ", tmp, ": ", ErrnoText(e));
    }
    named = true;
  }
  // Every failure below removes the temp file, so nothing is left behind.
  auto fail = [&](const char* step, int err) {
    if (fd >= 0) ::close(fd);
    if (named) ::unlink(tmp.c_str());
    KEEL_THROW(path, ": ", step, " failed: ", ErrnoText(err),
               err == EFBIG ? FileSizeLimitText() : std::string(),
               err == ENOSPC ? StrCat(" (", bytes.size(), " bytes to write)") : std::string());
  };
  if (!WriteAll(fd, bytes.data(), bytes.size())) fail("write", errno);
  FaultPoint("write_file_atomic");
  if (::fsync(fd) != 0) fail("fsync", errno);
  if (!named) {
    std::string self = StrCat("/proc/self/fd/", fd);
    if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) != 0)
      fail("link of the written file", errno);
    named = true;
  }
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0) fail("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename over the target", errno);
  SyncDirectory(dir, path);
}

void SyncDirectory(const std::string& dir, const std::string& what) {
  // EINVAL: the filesystem cannot fsync directories; nothing to do.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    int e = errno;
    KEEL_THROW(what, ": written, but cannot open its directory ", dir,
               " to fsync it: ", ErrnoText(e));
  }
  if (::fsync(dfd) != 0 && errno != EINVAL) {
    int e = errno;
    ::close(dfd);
    KEEL_THROW(what, ": written, but fsync of directory ", dir, " failed: ", ErrnoText(e));
  }
  ::close(dfd);
}

void CheckCanWrite(const std::string& dir, uint64_t bytes, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  KEEL_ENFORCE(!ec, what, "=", dir, ": cannot create the directory: ", ec.message());
  KEEL_ENFORCE(std::filesystem::is_directory(dir, ec), what, "=", dir,
               ": exists and is not a directory");
  // A real write, as a save will do it (read-only mounts, permissions, quotas, full disks). The
  // probes of checks that were killed before removing theirs go first.
  RemoveStaleTemps(dir, ".keel-write-check.tmp.");
  const std::string probe = dir + "/" + TempNameFor("keel-write-check");
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    int e = errno;
    KEEL_THROW(what, "=", dir, ": cannot write there: ", ErrnoText(e));
  }
  FaultPoint("write_check");
  IgnoreSigxfsz();
  char block[4096] = {0};
  int werr = WriteAll(fd, block, sizeof(block)) ? 0 : errno;
  if (werr == 0 && ::fsync(fd) != 0) werr = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  KEEL_ENFORCE(werr == 0, what, "=", dir, ": a test write failed: ", ErrnoText(werr),
               werr == EFBIG ? FileSizeLimitText() : std::string());
  rlimit rl;
  if (::getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    KEEL_ENFORCE(bytes <= rl.rlim_cur, what, "=", dir, ": a save writes a file of about ", bytes,
                 " bytes, over the file size limit (ulimit -f) of ",
                 static_cast<uint64_t>(rl.rlim_cur), " bytes");
  struct statvfs vfs;
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (free_bytes < bytes)
      LOG(WARNING) << what << "=" << dir << ": only " << free_bytes << " bytes free, a save needs "
                   << "about " << bytes << "; saves will fail unless space is freed";
  }
}

std::string ReadFile(const std::string& path, size_t max_bytes) {
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
  const bool regular = S_ISREG(st.st_mode);
  if (max_bytes == 0) max_bytes = std::numeric_limits<size_t>::max();
  if (!regular) max_bytes = std::min(max_bytes, size_t{64} << 20);
  std::string out;
  size_t len = 0;
  out.resize(regular && st.st_size > 0 ? std::min(static_cast<size_t>(st.st_size), max_bytes) + 1
                                       : std::min<size_t>(4096, max_bytes + 1));
  for (;;) {
    if (len > max_bytes) {
      ::close(fd);
      KEEL_THROW(path, ": holds more than ", max_bytes, " bytes, the most read from ",
                 regular ? "such a file" : "a file that is not a regular file",
                 "; not read further");
    }
    if (len == out.size()) out.resize(std::min(out.size() * 2, max_bytes + 1));
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
