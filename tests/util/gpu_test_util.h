// Helpers shared by the GPU tests (tests/gpu/, ctest label `gpu`): skipping without a device, the
// error measure of CPU/GPU twin comparisons, random inputs and op cases.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "framework/runtime/place.h"
#include "tests/util/grad_checker.h"

// Skips the calling test, saying why, when this machine has no CUDA device (or keel was built
// without CUDA).
#define SKIP_WITHOUT_GPU() \
  if (!::keel::CudaAvailable()) GTEST_SKIP() << "no CUDA device visible: GPU test not run"

namespace keel::testing {

// max |a - b| / max(|b|, 1) over the elements: relative for large values, absolute near zero. A
// NaN on one side only (a poisoned element no kernel wrote) is infinitely wrong; NaN on both
// sides (where the CPU twin gives NaN too) is no error.
double MaxRelErr(const Tensor& a, const Tensor& b);

// Losses of `steps` training steps of built-in model `model` on `place` (seed 5, the same data on
// every place); lr 0: the model's default rate.
std::vector<double> TrainLosses(const std::string& model, const Place& place, int steps,
                                int64_t batch, float lr = 0);

// The GPU trains `model` like the CPU, in two ways (cuDNN's deterministic convolutions):
// - step by step from the same state: before each of 30 steps the GPU takes the CPU's
//   persistables (parameters, optimizer and batch-norm state), both run the step on the same
//   batch, the losses agree to 1e-4 (relative, absolute below 1) and every persistable
//   afterwards to `state_tol` (the smaller of NormRelErr and MaxRelErr; printed: the largest);
// - free-running: 30 steps from the same start, the losses agree to 1e-4 for the first two steps
//   and to `trajectory_tol` after.
// Rounding sets the tolerances, as measured on an H200: a ReLU input within rounding of zero
// takes the other side of the kink on one place (one element in ResNet's 65,536 flipped, a 0.8%
// whole-tensor error in its gradient, which batch norm's backward spreads over the channel);
// training amplifies such differences (ResNet-20 at its default rate took a 1e-5 difference
// between two GPU runs to 4e-3 in one step, so callers pass it a smaller rate); and Adam turns a
// gradient that is zero in exact arithmetic (a key projection's bias) into steps of up to lr.
void ExpectGpuTrainsLikeCpu(const std::string& model, int64_t batch, float lr,
                            double trajectory_tol, double state_tol = 1e-3);

// ||a - b|| / ||b|| (2-norms; ||a - b|| where b is all zeros): the usual measure for a whole
// tensor, where the element-wise one is too strict on entries that cancel (gradients of
// batch-norm, Adam's update of a near-zero gradient).
double NormRelErr(const Tensor& a, const Tensor& b);

// Uniform random tensor in [lo, hi).
Tensor R(const DDim& d, double lo = -1, double hi = 1, uint64_t seed = 1,
         DType dt = DType::kFloat32);

// An op case: name (printed on failure), op type, input slots, output slots and counts, attrs.
OpCase Op(std::string name, std::string type,
          std::vector<std::pair<std::string, std::vector<Tensor>>> inputs,
          std::vector<std::pair<std::string, int>> outputs = {{"Out", 1}},
          std::map<std::string, Attribute> attrs = {});

}  // namespace keel::testing
