// MNIST from its IDX files (http://yann.lecun.com/exdb/mnist/), gzipped or not.
//
//   images: magic 2051 (0x00000803: ubyte, rank 3), count, rows, cols, then count*rows*cols bytes
//   labels: magic 2049 (0x00000801: ubyte, rank 1), count, then count bytes, each in 0..9
//
// Both files are read and validated in the constructor (magic, dims, exact file length, equal
// counts, label range); every violation is a keel::Error naming the file. Fields: "image" float32
// [1, rows, cols] with pixels scaled to [0, 1] (or normalized: (p - 0.1307) / 0.3081), and
// "label" int64 [1].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/data/dataset.h"

namespace keel {

class MnistDataset : public Dataset {
 public:
  static constexpr float kMean = 0.1307f;
  static constexpr float kStd = 0.3081f;

  // Examples [begin, end) of the files (end = -1: to the last), so one file pair gives a train
  // split (0, 8000) and a test split (8000, -1).
  MnistDataset(const std::string& images_path, const std::string& labels_path, int64_t begin = 0,
               int64_t end = -1, bool normalize = false);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Example Get(int64_t index) const override;
  std::vector<std::string> names() const override { return {"image", "label"}; }

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // Number of examples in the files, before [begin, end) is applied.
  int64_t file_count() const { return file_count_; }
  uint8_t label(int64_t index) const { return labels_[index]; }

 private:
  std::string images_path_;
  int64_t rows_ = 0, cols_ = 0, file_count_ = 0;
  bool normalize_;
  std::vector<uint8_t> pixels_;  // size() * rows * cols
  std::vector<uint8_t> labels_;
};

}  // namespace keel
