// The built-in models that `keel train --model=NAME` and `keel bench NAME` run without user C++:
// each builds (main, startup) programs with its optimizer and brings its training data.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/program_guard.h"
#include "framework/ir/program.h"

namespace keel {
namespace models {

// Appends backward and update ops for `loss` (default: optimizer::SGD(lr).minimize).
using MinimizeFn = std::function<void(Var loss, Program* startup)>;

struct ModelConfig {
  std::string name = "mlp";
  float lr = 0.01f;
  uint64_t seed = 0;       // 0: nondeterministic initialization and data
  uint64_t data_seed = 0;  // 0: the same as seed; ranks pass seed + rank to draw different data
  int hidden = 1280;       // mlp: width of the two hidden layers
  MinimizeFn minimize;     // empty: plain SGD
};

struct TrainableModel {
  std::unique_ptr<Program> main, startup;
  std::string loss;
  // What an inference model takes and gives: input vars and the prediction var.
  std::vector<std::string> inputs;
  std::string prediction;
  // Fills `feed` with the next training batch of `batch` samples.
  std::function<void(int64_t batch, FeedMap* feed)> next_batch;
};

// Builds a model by name; an unknown name is a keel::Error listing the known ones.
TrainableModel BuildModel(const ModelConfig& config);
std::vector<std::string> ModelNames();

}  // namespace models
}  // namespace keel
