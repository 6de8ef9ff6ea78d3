#include "models/mlp/mlp_model.h"

#include <memory>
#include <utility>
#include <vector>

#include "framework/dsl/pipeline.h"
#include "framework/error.h"

namespace keel {
namespace models {

Var mlp(Var x, Var y, int hid, int classes, int pp_degree) {
  KEEL_ENFORCE(pp_degree >= 1 && pp_degree <= 3, "mlp: pipeline degree ", pp_degree,
               " must be 1..3 (the mlp has 3 layers to place on stages)");
  // Without a pipeline no stage is marked: the ops are those of the plain model.
  std::unique_ptr<PipelineStageGuard> s;
  auto stage = [&](int layer) {
    s.reset();  // the previous stage's guard first: guards restore what they found
    s = std::make_unique<PipelineStageGuard>(layer * pp_degree / 3);
  };
  // Under a TensorParallelGuard the hidden layers split Megatron-style: column, then row.
  if (pp_degree > 1) stage(0);
  Var h1 = layers::fc(x, hid, "tanh", 1, {}, {}, true, layers::Parallel::kColumn);
  if (pp_degree > 1) stage(1);
  Var h2 = layers::fc(h1, hid, "tanh", 1, {}, {}, true, layers::Parallel::kRow);
  if (pp_degree > 1) stage(2);
  Var pred = layers::fc(h2, classes, "softmax");
  return layers::mean(layers::cross_entropy(pred, y));
}

void SyntheticMlpData::Next(int64_t batch, Tensor* x, Tensor* y) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> label(0, classes_ - 1);
  float* px = static_cast<float*>(x->Alloc(DType::kFloat32, {batch, features_}));
  int64_t* py = static_cast<int64_t*>(y->Alloc(DType::kInt64, {batch, 1}));
  for (int64_t i = 0; i < batch * features_; ++i) px[i] = u(rng_);
  if (classes_ != 2) {
    for (int64_t i = 0; i < batch; ++i) py[i] = label(rng_);
    return;
  }
  // Two classes: y = [sum of the first half of x > sum of the second half], a rule the MLP can
  // learn, so its loss falls from ln 2 instead of hovering there as with coin-flip labels.
  const int64_t half = features_ / 2;
  for (int64_t i = 0; i < batch; ++i) {
    const float* row = px + i * features_;
    float a = 0, b = 0;
    for (int64_t j = 0; j < half; ++j) a += row[j];
    for (int64_t j = half; j < features_; ++j) b += row[j];
    py[i] = a > b ? 1 : 0;
  }
}

namespace {

std::vector<Tensor> DrawColumns(int64_t n, uint64_t seed, int64_t features) {
  KEEL_ENFORCE(n >= 0 && features >= 2,
               "SyntheticMlpDataset: want n >= 0 and features >= 2, got n ", n, ", features ",
               features);
  Tensor x, y;
  SyntheticMlpData(seed, features).Next(n, &x, &y);
  return {std::move(x), std::move(y)};
}

}  // namespace

SyntheticMlpDataset::SyntheticMlpDataset(int64_t n, uint64_t seed, int64_t features)
    : TensorDataset({"x", "y"}, DrawColumns(n, seed, features)) {}

}  // namespace models
}  // namespace keel
