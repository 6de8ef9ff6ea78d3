// Per-channel statistics math that batch_norm's CPU math (batch_norm_ops.cc) and its cuDNN one
// (batch_norm_ops.cu) share, so the CPU tests cover the GPU's moving-stat update.
#pragma once

#include "ops/functors/hd.h"

namespace keel {
namespace fn {

// moving = momentum * moving + (1 - momentum) * batch, in double, stored as T.
template <typename T>
KEEL_HD T MovingStat(double momentum, T moving, double batch) {
  return static_cast<T>(momentum * static_cast<double>(moving) + (1 - momentum) * batch);
}

// 1 / sqrt(var + epsilon), in double.
KEEL_HD double InvStd(double var, double epsilon) { return 1.0 / Sqrt(var + epsilon); }

// The biased batch variance back from the inverse std cuDNN saves: 1 / inv_std^2 - epsilon. Exact
// to about float's precision times (var + epsilon), so near 0 the error is absolute.
KEEL_HD double VarianceFromInvStd(double inv_std, double epsilon) {
  return 1.0 / (inv_std * inv_std) - epsilon;
}

}  // namespace fn
}  // namespace keel
