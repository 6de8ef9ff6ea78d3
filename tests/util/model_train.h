// Training a built-in model for a few steps in a test, to compare its parameters across settings.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "framework/io/safetensors.h"
#include "framework/runtime/tensor.h"

namespace keel::testing {

// Model `name` (models::BuildModel, seed `seed`) trained `steps` steps at `batch` on a CPU
// executor with `threads` workers; returns its persistables in the program's order. `around_step`,
// when given, is called with each step's run (to measure around it) and must call it once.
std::vector<Tensor> TrainBuiltInModel(
    const std::string& name, int64_t batch, int threads, int steps, uint64_t seed,
    const std::function<void(const std::function<void()>& run)>& around_step = nullptr);

// ASSERTs two trainings' parameters (as saved, in the same order) agree: the same names and shapes
// and float32 values within 1e-5 relative (collectives sum in another order than one rank does).
void ExpectSameParameters(const NamedTensors& got, const NamedTensors& ref);

}  // namespace keel::testing
