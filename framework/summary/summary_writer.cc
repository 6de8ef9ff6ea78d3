#include "framework/summary/summary_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "framework/base/fd_io.h"
#include "framework/error.h"
#include "framework/io/atomic_file.h"
#include "framework/summary/event.pb.h"

namespace keel {

namespace summary {

namespace {

// Table for the reflected Castagnoli polynomial, one byte at a time. Own code rather than a
// library: 20 lines, and Debian's crc32c package is not otherwise a keel dependency.
struct Crc32cTable {
  uint32_t t[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};

void PutLE(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t Crc32c(const void* data, size_t n) {
  static const Crc32cTable table;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table.t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(const void* data, size_t n) {
  uint32_t crc = Crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string FrameRecord(const std::string& data) {
  std::string out;
  out.reserve(data.size() + 16);
  PutLE(&out, data.size(), 8);
  PutLE(&out, MaskedCrc32c(out.data(), 8), 4);
  out += data;
  PutLE(&out, MaskedCrc32c(data.data(), data.size()), 4);
  return out;
}

}  // namespace summary

namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// mkdir -p; a keel::Error names the first component that cannot be made.
void MakeDirs(const std::string& dir) {
  KEEL_ENFORCE(!dir.empty(), "SummaryWriter: the log directory is empty");
  for (size_t pos = 1;; ++pos) {
    pos = dir.find('/', pos);
    std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
      KEEL_THROW("SummaryWriter: cannot create log directory ", part, ": ", std::strerror(errno));
    if (pos == std::string::npos) break;
  }
  struct stat st;
  KEEL_ENFORCE(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
               "SummaryWriter: log directory ", dir, " is not a directory");
}

}  // namespace

SummaryWriter::SummaryWriter(const std::string& logdir, const std::string& filename_suffix) {
  MakeDirs(logdir);
  static std::atomic<int> counter{0};
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  path_ = logdir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(NowSeconds())) +
          "." + host + "." + std::to_string(::getpid()) + "." + std::to_string(counter++) +
          filename_suffix;
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  KEEL_ENFORCE(fd_ >= 0, "SummaryWriter: cannot create ", path_, ": ", std::strerror(errno));
  summary::Event e;
  e.set_wall_time(NowSeconds());
  e.set_file_version("brain.Event:2");
  WriteRecord(e.SerializeAsString());
}

SummaryWriter::~SummaryWriter() {
  if (fd_ >= 0) {
    ::fsync(fd_);
    ::close(fd_);
  }
}

void SummaryWriter::AddScalar(const std::string& tag, double value, int64_t step,
                              double wall_time) {
  KEEL_ENFORCE(!tag.empty(), "SummaryWriter::AddScalar: empty tag (file ", path_, ")");
  summary::Event e;
  e.set_wall_time(wall_time < 0 ? NowSeconds() : wall_time);
  e.set_step(step);
  summary::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  WriteRecord(e.SerializeAsString());
}

void SummaryWriter::Flush() {
  KEEL_ENFORCE(::fsync(fd_) == 0 || errno == EINVAL, "SummaryWriter: fsync of ", path_, ": ",
               std::strerror(errno));
}

void SummaryWriter::WriteRecord(const std::string& data) {
  const std::string rec = summary::FrameRecord(data);
  // O_APPEND; a short write is retried, so the error reported is the one that stopped it (EFBIG
  // at the file size limit, ENOSPC on a full disk), and what of the record landed is dropped.
  IgnoreSigxfsz();
  size_t done = 0;
  if (WriteAll(fd_, rec.data(), rec.size(), &done)) return;
  const int err = errno;
  if (done > 0 && ::ftruncate(fd_, ::lseek(fd_, 0, SEEK_END) - static_cast<off_t>(done)) != 0) {
    // Could not drop the partial record: readers stop at it, as at a crash mid-write.
  }
  KEEL_THROW("SummaryWriter: writing ", path_, ": ", std::strerror(err),
             err == EFBIG ? FileSizeLimitText() : std::string());
}

}  // namespace keel
