// TensorDataset: examples held in memory as columns, one tensor per field whose first dim counts
// the examples (PyTorch's TensorDataset). Example i is row i of every column: a column [n, d...]
// gives a field of shape [d...], a column [n] one of shape [1].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/data/dataset.h"

namespace keel {

class TensorDataset : public Dataset {
 public:
  // One name per column; the columns are CPU tensors with the same first dim. A keel::Error
  // names the column otherwise.
  TensorDataset(std::vector<std::string> names, std::vector<Tensor> columns);

  int64_t size() const override { return n_; }
  Example Get(int64_t index) const override;
  std::vector<std::string> names() const override { return names_; }

 private:
  std::vector<std::string> names_;
  std::vector<Tensor> columns_;
  int64_t n_ = 0;
};

}  // namespace keel
