// The data pipeline's table of contents.
//
//   Dataset              random access to examples: size(), Get(i), names()
//     MnistDataset       IDX image + label files, gzipped or not        (mnist_dataset.h)
//     CsvDataset         numeric CSV with a header row and a label column (csv_dataset.h)
//     TensorDataset      examples held in memory as columns             (tensor_dataset.h)
//   DataLoader           shuffles, shards across ranks, batches, prefetches (data_loader.h)
//   ReadFileBytes/GunzipBytes/GzipBytes                                  (gzip.h)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/runtime/tensor.h"

namespace keel {

// One example: a CPU tensor per field, in the order of Dataset::names(). For MNIST that is
// image float32 [1, 28, 28] and label int64 [1].
using Example = std::vector<Tensor>;

// Random access to a fixed set of examples.
//
// Contract: every example has names().size() fields, and field k has the same dtype and shape in
// every example (the loader stacks them into [B, ...]). Get must be safe to call from several
// threads at once (the DataLoader's workers do), and may throw keel::Error for bad data.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Example Get(int64_t index) const = 0;
  // The field names, which become the keys of a loader's batches ("image", "label").
  virtual std::vector<std::string> names() const = 0;
};

}  // namespace keel
