// Lookups and bit-for-bit comparisons of named tensors (a safetensors file's, a checkpoint's), for
// the multi-process tests that compare one job's state with another's.
#pragma once

#include <string>

#include "framework/io/safetensors.h"

namespace keel::testing {

// The tensor named `name` in `t`, or nullptr.
const Tensor* FindTensor(const NamedTensors& t, const std::string& name);

// Every tensor of `want` is in `got` with its dims and bytes (`got` may hold more); failures name
// the tensor and say it is missing from `got_what`.
void ExpectHoldsBitForBit(const NamedTensors& got, const NamedTensors& want,
                          const std::string& got_what);

}  // namespace keel::testing
