#include "framework/data/synthetic_dataset.h"

#include <algorithm>

#include "framework/error.h"
#include "models/mlp/mlp_model.h"

namespace keel {

SyntheticMlpDataset::SyntheticMlpDataset(int64_t n, uint64_t seed, int64_t features)
    : n_(n), features_(features) {
  KEEL_ENFORCE(n >= 0 && features >= 2,
               "SyntheticMlpDataset: want n >= 0 and features >= 2, got n ", n, ", features ",
               features);
  // Drawn once up front: Get(i) must not depend on the order examples are asked for.
  models::SyntheticMlpData(seed, features).Next(n, &x_, &y_);
}

Example SyntheticMlpDataset::Get(int64_t index) const {
  KEEL_ENFORCE(0 <= index && index < n_, "SyntheticMlpDataset: index ", index, " outside [0, ", n_,
               ")");
  Tensor x(DType::kFloat32, {features_});
  std::copy_n(x_.data<float>() + index * features_, features_, x.data<float>());
  Tensor y(DType::kInt64, {1});
  y.data<int64_t>()[0] = y_.data<int64_t>()[index];
  return {std::move(x), std::move(y)};
}

}  // namespace keel
