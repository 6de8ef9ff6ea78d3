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

// Uniform random tensor in [lo, hi).
Tensor R(const DDim& d, double lo = -1, double hi = 1, uint64_t seed = 1,
         DType dt = DType::kFloat32);

// An op case: name (printed on failure), op type, input slots, output slots and counts, attrs.
OpCase Op(std::string name, std::string type,
          std::vector<std::pair<std::string, std::vector<Tensor>>> inputs,
          std::vector<std::pair<std::string, int>> outputs = {{"Out", 1}},
          std::map<std::string, Attribute> attrs = {});

}  // namespace keel::testing
