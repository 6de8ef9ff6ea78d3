// The seed's model: a 3-layer MLP with tanh and a softmax cross-entropy loss, and its synthetic
// data (x uniform in [0, 1) of 32 floats, y in {0, 1}: whether the first half of x outweighs the
// second, a rule the model can learn).
#pragma once

#include <cstdint>
#include <random>

#include "framework/data/tensor_dataset.h"
#include "framework/dsl/layers.h"
#include "framework/runtime/tensor.h"

namespace keel {
namespace models {

// Returns mean(cross_entropy(softmax(fc(tanh(fc(tanh(fc(x))))))), y). Inside a
// TensorParallelGuard of degree T the first hidden layer is column-parallel and the second
// row-parallel (hid must divide by T). With pp_degree > 1 (at most 3) its layers sit on pipeline
// stages (framework/dsl/pipeline.h): layer k of 3 on stage k * pp_degree / 3, the loss with the
// last layer.
Var mlp(Var x, Var y, int hid = 1280, int classes = 2, int pp_degree = 1);

// Draws batches of the seed's synthetic data from its own engine, so a seed fixes the stream.
class SyntheticMlpData {
 public:
  explicit SyntheticMlpData(uint64_t seed, int64_t features = 32, int classes = 2)
      : rng_(seed), features_(features), classes_(classes) {}
  // Fills x [batch, features] float32 and y [batch, 1] int64.
  void Next(int64_t batch, Tensor* x, Tensor* y);

 private:
  std::mt19937_64 rng_;
  int64_t features_;
  int classes_;
};

// The seed's synthetic data as a Dataset: x float32 [features] uniform in [0, 1), y int64 [1]
// = [sum of the first half of x > sum of the second half]. Example i is row i of
// SyntheticMlpData(seed, features).Next(n, ...), drawn once up front, so a loader without
// shuffling reproduces the seed's stream; fields "x" and "y" feed mlp() directly.
class SyntheticMlpDataset : public TensorDataset {
 public:
  SyntheticMlpDataset(int64_t n, uint64_t seed, int64_t features = 32);
};

}  // namespace models
}  // namespace keel
