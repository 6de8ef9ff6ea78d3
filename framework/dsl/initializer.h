// Initializers append the op that fills a parameter to the startup program.
#pragma once

#include <functional>
#include <string>

#include "framework/ir/program.h"

namespace keel {
namespace initializer {

// Appends to `startup` the op(s) that initialize `param` (already declared there).
using Initializer = std::function<void(Block& startup, const VarDesc& param)>;

Initializer Constant(float value = 0.0f);
Initializer Uniform(float low = -1.0f, float high = 1.0f, int seed = 0);
Initializer Normal(float mean = 0.0f, float std = 1.0f, int seed = 0);
// Glorot: uniform in +-sqrt(6 / (fan_in + fan_out)), or normal with std sqrt(2 / (fan_in +
// fan_out)). Fans default to the param's shape (fc: [in, out]; conv: [out, in, kh, kw]).
Initializer Xavier(bool uniform = true, int fan_in = 0, int fan_out = 0, int seed = 0);
// He: uniform in +-sqrt(6 / fan_in), or normal with std sqrt(2 / fan_in).
Initializer MSRA(bool uniform = false, int fan_in = 0, int seed = 0);

}  // namespace initializer
}  // namespace keel
