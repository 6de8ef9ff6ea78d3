// SummaryWriter: training scalars as TensorBoard event files, like PyTorch's
// torch.utils.tensorboard.SummaryWriter.
//
//   keel::SummaryWriter tb("runs/exp1");
//   tb.AddScalar("train/loss", loss, step);
//   tensorboard --logdir runs       # then open http://localhost:6006
//
// A file is a sequence of TFRecords, each
//   uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
// (little-endian), whose data is a serialized Event (framework/summary/event.proto); the first
// event names the file version. Records are appended whole with one write each, so a reader
// never sees half of one unless the process dies inside that write (TensorBoard then skips the
// truncated tail).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel {

class SummaryWriter {
 public:
  // Creates `logdir` (and its parents) and a new file in it named
  // events.out.tfevents.<unix seconds>.<host>.<pid>.<n><filename_suffix>; TensorBoard reads every
  // file of a folder as one run. A keel::Error names the folder or file when it cannot be made.
  explicit SummaryWriter(const std::string& logdir, const std::string& filename_suffix = "");
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  // One scalar at `step`; wall_time < 0 means now. A tag must be non-empty; a keel::Error names
  // the file when the write fails (disk full, ...).
  void AddScalar(const std::string& tag, double value, int64_t step, double wall_time = -1);
  // Data is handed to the kernel per record; Flush also fsyncs it.
  void Flush();

  const std::string& path() const { return path_; }

 private:
  void WriteRecord(const std::string& data);

  std::string path_;
  int fd_ = -1;
};

namespace summary {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `n` bytes.
uint32_t Crc32c(const void* data, size_t n);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t MaskedCrc32c(const void* data, size_t n);
// One TFRecord around `data`.
std::string FrameRecord(const std::string& data);

}  // namespace summary
}  // namespace keel
