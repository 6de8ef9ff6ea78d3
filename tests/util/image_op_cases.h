// conv2d and pool2d op cases that several test files build (the CPU op tests, channels last, the
// GPU twins): the same shapes, attrs and random inputs wherever they are used.
#pragma once

#include <string>
#include <vector>

#include "tests/util/grad_checker.h"

namespace keel::testing {

// One conv2d: Input [N, C, H, W] (NCHW), Filter [M, C / groups, kh, kw].
struct ConvParams {
  std::string name;
  DDim x, filter;
  std::vector<int> strides, paddings, dilations;
  int groups;
};

// The NCHW conv2d case of `p` in dtype dt: Input and Filter uniform in [-1, 1) (seeds 101 and
// 102; the 16-bit types round float32's values), one Output.
OpCase ConvCase(const ConvParams& p, DType dt);

// A pool2d case: X [N, C, H, W] uniform in [-2, 2) (seed 21; 16-bit types rounded from float32),
// pooling_type `type`, ksize k, strides s, paddings p and the flags; one Out.
OpCase PoolCase(std::string name, const DDim& x, const std::string& type, std::vector<int> k,
                std::vector<int> s, std::vector<int> p, bool global = false, bool exclusive = true,
                bool ceil_mode = false, DType dt = DType::kFloat32);

// Uniform in [lo, hi) in any float type (the 16-bit types: float32's values rounded).
Tensor RandomFloats(const DDim& dims, DType dt, double lo, double hi, uint64_t seed);

}  // namespace keel::testing
