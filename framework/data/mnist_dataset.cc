#include "framework/data/mnist_dataset.h"

#include <cstring>

#include "framework/data/gzip.h"
#include "framework/error.h"

namespace keel {
namespace {

constexpr uint32_t kImagesMagic = 2051;  // 0x00000803: unsigned bytes, 3 dims
constexpr uint32_t kLabelsMagic = 2049;  // 0x00000801: unsigned bytes, 1 dim
constexpr int64_t kMaxSide = 1 << 16;    // rows and cols of any plausible image

uint32_t BigEndian32(const std::string& b, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data() + at);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Checks an IDX ubyte file's magic and that its length is exactly header + prod(dims); returns
// the dims. `kind` ("images", "labels") only words the messages.
std::vector<int64_t> ParseIdxHeader(const std::string& bytes, const std::string& path,
                                    uint32_t want_magic, int rank, const char* kind) {
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  KEEL_ENFORCE(bytes.size() >= 4, "MNIST ", kind, " file ", path, ": truncated: ", bytes.size(),
               " bytes, too short for the IDX magic number");
  const uint32_t magic = BigEndian32(bytes, 0);
  if (magic != want_magic) {
    const uint32_t other = want_magic == kImagesMagic ? kLabelsMagic : kImagesMagic;
    KEEL_THROW("MNIST ", kind, " file ", path, ": bad magic number ", magic, ", want ", want_magic,
               " (IDX unsigned-byte, ", rank, " dims)",
               magic == other ? "; this looks like the other file of the pair (swapped?)" : "");
  }
  KEEL_ENFORCE(bytes.size() >= header, "MNIST ", kind, " file ", path,
               ": truncated: ", bytes.size(), " bytes, the IDX header needs ", header);
  std::vector<int64_t> dims(rank);
  uint64_t body = 1;
  for (int i = 0; i < rank; ++i) {
    dims[i] = BigEndian32(bytes, 4 + 4 * i);
    // Each dim < 2^32 and there are at most 3, but the product could still overflow: cap it by
    // the file length, which it must equal anyway.
    if (body != 0 && static_cast<uint64_t>(dims[i]) > (uint64_t{1} << 62) / body) {
      KEEL_THROW("MNIST ", kind, " file ", path, ": header dims overflow (dim ", i, " = ", dims[i],
                 ")");
    }
    body *= static_cast<uint64_t>(dims[i]);
  }
  const uint64_t want = header + body;
  if (bytes.size() != want) {
    std::string shape;
    for (int i = 0; i < rank; ++i) shape += (i ? " x " : "") + std::to_string(dims[i]);
    KEEL_THROW("MNIST ", kind, " file ", path, ": file length ", bytes.size(),
               " does not match the header (", shape, " needs ", want,
               " bytes: ", bytes.size() < want ? "truncated" : "trailing data", ")");
  }
  return dims;
}

}  // namespace

MnistDataset::MnistDataset(const std::string& images_path, const std::string& labels_path,
                           int64_t begin, int64_t end, bool normalize)
    : images_path_(images_path), normalize_(normalize) {
  const std::string images = ReadMaybeGzippedFile(images_path);
  const std::vector<int64_t> idims = ParseIdxHeader(images, images_path, kImagesMagic, 3, "images");
  const std::string labels = ReadMaybeGzippedFile(labels_path);
  const std::vector<int64_t> ldims = ParseIdxHeader(labels, labels_path, kLabelsMagic, 1, "labels");

  rows_ = idims[1];
  cols_ = idims[2];
  KEEL_ENFORCE(rows_ > 0 && cols_ > 0 && rows_ <= kMaxSide && cols_ <= kMaxSide,
               "MNIST images file ", images_path, ": image size ", rows_, " x ", cols_,
               " outside 1..", kMaxSide);
  file_count_ = idims[0];
  KEEL_ENFORCE(ldims[0] == file_count_, "MNIST files disagree: ", images_path, " has ", file_count_,
               " images but ", labels_path, " has ", ldims[0], " labels");
  const auto* label_bytes = reinterpret_cast<const uint8_t*>(labels.data() + 8);
  for (int64_t i = 0; i < file_count_; ++i) {
    KEEL_ENFORCE(label_bytes[i] <= 9, "MNIST labels file ", labels_path, ": label ", i, " is ",
                 int{label_bytes[i]}, ", outside 0..9");
  }

  if (end < 0) end = file_count_;
  KEEL_ENFORCE(0 <= begin && begin <= end && end <= file_count_, "MNIST ", images_path, ": range [",
               begin, ", ", end, ") outside the file's ", file_count_, " examples");
  const size_t image_bytes = static_cast<size_t>(rows_ * cols_);
  const auto* pixel_bytes = reinterpret_cast<const uint8_t*>(images.data() + 16);
  pixels_.assign(pixel_bytes + begin * image_bytes, pixel_bytes + end * image_bytes);
  labels_.assign(label_bytes + begin, label_bytes + end);
}

Example MnistDataset::Get(int64_t index) const {
  KEEL_ENFORCE(0 <= index && index < size(), "MNIST ", images_path_, ": index ", index,
               " outside [0, ", size(), ")");
  Tensor image(DType::kFloat32, {1, rows_, cols_});
  float* dst = image.data<float>();
  const int64_t n = rows_ * cols_;
  const uint8_t* src = pixels_.data() + index * n;
  // p in [0, 1]; normalized: (p - mean) / std.
  const float scale = normalize_ ? 1.0f / (255.0f * kStd) : 1.0f / 255.0f;
  const float shift = normalize_ ? -kMean / kStd : 0.0f;
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale + shift;
  Tensor label(DType::kInt64, {1});
  label.data<int64_t>()[0] = labels_[index];
  return {std::move(image), std::move(label)};
}

}  // namespace keel
