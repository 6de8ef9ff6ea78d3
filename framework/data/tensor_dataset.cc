#include "framework/data/tensor_dataset.h"

#include <cstring>
#include <utility>

#include "framework/error.h"

namespace keel {

TensorDataset::TensorDataset(std::vector<std::string> names, std::vector<Tensor> columns)
    : names_(std::move(names)), columns_(std::move(columns)) {
  KEEL_ENFORCE(!columns_.empty() && names_.size() == columns_.size(),
               "TensorDataset: ", names_.size(), " names for ", columns_.size(),
               " columns (want one per column)");
  for (size_t c = 0; c < columns_.size(); ++c) {
    const Tensor& t = columns_[c];
    KEEL_ENFORCE(t.initialized() && t.place().is_cpu() && t.dims().size() >= 1,
                 "TensorDataset: column '", names_[c], "' must be a CPU tensor of rank >= 1");
    if (c == 0) n_ = t.dims()[0];
    KEEL_ENFORCE(t.dims()[0] == n_, "TensorDataset: column '", names_[c], "' holds ", t.dims()[0],
                 " examples, column '", names_[0], "' ", n_);
  }
}

Example TensorDataset::Get(int64_t index) const {
  KEEL_ENFORCE(0 <= index && index < n_, "TensorDataset: index ", index, " outside [0, ", n_, ")");
  Example ex;
  ex.reserve(columns_.size());
  for (const Tensor& col : columns_) {
    DDim row;
    for (int d = 1; d < col.dims().size(); ++d) row.push_back(col.dims()[d]);
    if (row.empty()) row.push_back(1);
    Tensor t(col.dtype(), row);
    const size_t bytes = t.numel() * SizeOf(col.dtype());
    std::memcpy(t.raw_data(), static_cast<const char*>(col.raw_data()) + index * bytes, bytes);
    ex.push_back(std::move(t));
  }
  return ex;
}

}  // namespace keel
