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

// Gradient rules of z = f(x, y): DX(dz, x, y) = dz * df/dx, DY(dz, x, y) = dz * df/dy.
// kDxIsDout: dx = dz (no need to read x or y).
struct AddGrad {
  static constexpr bool kDxIsDout = true;
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
