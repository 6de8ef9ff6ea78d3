// The seed MLP's synthetic data as a Dataset: x float32 [features] uniform in [0, 1), y int64 [1]
// = [sum of the first half of x > sum of the second half] (models::SyntheticMlpData's rule).
// Example i of SyntheticMlpDataset(n, seed) is row i of SyntheticMlpData(seed).Next(n, ...), so
// a loader without shuffling reproduces the seed's stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/data/dataset.h"

namespace keel {

class SyntheticMlpDataset : public Dataset {
 public:
  SyntheticMlpDataset(int64_t n, uint64_t seed, int64_t features = 32);

  int64_t size() const override { return n_; }
  Example Get(int64_t index) const override;
  // The seed MLP's data var names, so batches feed models::mlp directly.
  std::vector<std::string> names() const override { return {"x", "y"}; }

 private:
  int64_t n_, features_;
  Tensor x_, y_;  // [n, features], [n, 1]
};

}  // namespace keel
