// Binary element-wise math with Paddle's axis broadcasting, shared by CPU and CUDA kernels.
//
// Broadcasting: Y's dims (trailing 1s dropped) equal X's dims [axis, axis + rank(Y)); X is viewed
// as [pre, n, post] around them, so element i of X pairs with Y[(i / post) % n].
#pragma once

#include <cstdint>

#include "ops/functors/hd.h"

namespace keel {
namespace fn {

struct BroadcastMid {
  int64_t pre = 1, n = 1, post = 1;
  // The Y index paired with flat X index i.
  KEEL_HD int64_t YIndex(int64_t i) const { return (i / post) % n; }
};

struct Add {
  template <typename T>
  KEEL_HD T operator()(T a, T b) const {
    return a + b;
  }
};
struct Sub {
  template <typename T>
  KEEL_HD T operator()(T a, T b) const {
    return a - b;
  }
};
struct Mul {
  template <typename T>
  KEEL_HD T operator()(T a, T b) const {
    return a * b;
  }
};
struct Div {
  template <typename T>
  KEEL_HD T operator()(T a, T b) const {
    return a / b;
  }
};

// The larger of a and b, NaN if either is (the first NaN met): max pooling propagates NaN as
// PyTorch does, where std::max(a, NaN) would drop it.
template <typename T>
KEEL_HD T MaxOrNan(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return b > a ? b : a;
}

// a == b, with NaN equal to NaN: finds the element a NaN maximum came from.
template <typename T>
KEEL_HD bool SameOrBothNan(T a, T b) {
  return a == b || (a != a && b != b);
}

// w * v with 0 * anything = 0 (the x log x convention): a zero weight on an infinite term, such
// as a soft label of 0 on a -inf logit, contributes nothing instead of NaN.
template <typename T>
KEEL_HD T WeightTimes(T w, T v) {
  return w == T(0) ? T(0) : w * v;
}

// Gradient rules of z = f(x, y): DX(dz, x, y) = dz * df/dx, DY(dz, x, y) = dz * df/dy.
// kDxIsDout: dx = dz (no need to read x or y); kDyIsDout: dy = dz where Y has dz's shape.
struct AddGrad {
  static constexpr bool kDxIsDout = true;
  static constexpr bool kDyIsDout = true;
  template <typename T>
  KEEL_HD static T DX(T g, T, T) {
    return g;
  }
  template <typename T>
  KEEL_HD static T DY(T g, T, T) {
    return g;
  }
};
struct SubGrad {
  static constexpr bool kDxIsDout = true;
  static constexpr bool kDyIsDout = false;
  template <typename T>
  KEEL_HD static T DX(T g, T, T) {
    return g;
  }
  template <typename T>
  KEEL_HD static T DY(T g, T, T) {
    return -g;
  }
};
struct MulGrad {
  static constexpr bool kDxIsDout = false;
  static constexpr bool kDyIsDout = false;
  template <typename T>
  KEEL_HD static T DX(T g, T, T y) {
    return g * y;
  }
  template <typename T>
  KEEL_HD static T DY(T g, T x, T) {
    return g * x;
  }
};
struct DivGrad {
  static constexpr bool kDxIsDout = false;
  static constexpr bool kDyIsDout = false;
  template <typename T>
  KEEL_HD static T DX(T g, T, T y) {
    return g / y;
  }
  template <typename T>
  KEEL_HD static T DY(T g, T x, T y) {
    return -g * x / (y * y);
  }
};

}  // namespace fn
}  // namespace keel
