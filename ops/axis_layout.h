// How kernels view a shape around an axis, shared by the CPU (.cc) and CUDA (.cu) op files: no
// Eigen, no device code. Kernels check the axis themselves: grad ops share the forward's attrs
// but not always its shape function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/error.h"
#include "framework/runtime/ddim.h"
#include "ops/functors/elementwise_functors.h"

namespace keel {

// "[1, 2]"
inline std::string IntsStr(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// `axis` (negative counts from the end) must index a dim of input `slot`, of shape d; `what`
// names the attr ("axis", "dim") in the error.
inline void CheckAxisInRange(const char* what, int axis, const char* slot, const DDim& d) {
  KEEL_ENFORCE(axis >= -d.size() && axis < d.size(), what, " ", axis, " is outside [", -d.size(),
               ", ", d.size(), ") for ", slot, " ", d.str());
}

// Normalizes a possibly negative axis against `rank`.
inline int CanonicalAxis(int axis, int rank) { return axis < 0 ? axis + rank : axis; }

// dims = [pre, n, post] around the axis: row (i, j) is the n elements at i * n * post + j with
// stride post, so post == 1 (the last axis, the common case) gives contiguous rows.
struct AxisSplit {
  int64_t pre, n, post;
};
inline AxisSplit SplitAt(const DDim& d, int axis) {
  KEEL_ENFORCE(axis >= -d.size() && axis < d.size(), "axis ", axis, " is outside [", -d.size(),
               ", ", d.size(), ") for shape ", d.str());
  int a = CanonicalAxis(axis, d.size());
  return AxisSplit{d.prod(0, a), d[a], d.prod(a + 1, d.size())};
}

// Paddle's elementwise broadcasting. Y's rank once trailing 1s are dropped (Y [C, 1] broadcasts
// like Y [C]; Y [1] is a scalar).
inline int TrimmedRank(const DDim& y) {
  int r = y.size();
  while (r > 0 && y[r - 1] == 1) --r;
  return r;
}

// axis -1 aligns Y with X's trailing dims.
inline int ResolveAxis(int axis, const DDim& x, const DDim& y) {
  return axis == -1 ? x.size() - y.size() : axis;
}

// X as (pre, n, post) around the dims Y covers.
inline fn::BroadcastMid GetMid(const DDim& x, const DDim& y, int axis) {
  const int a = ResolveAxis(axis, x, y), yr = TrimmedRank(y);
  // a <= rank(X) - yr, not a + yr <= rank(X): an axis near INT_MAX must not wrap around.
  KEEL_ENFORCE(yr <= x.size() && a >= 0 && a <= x.size() - yr, "axis ", axis, " places Y ", y.str(),
               " outside X ", x.str());
  return fn::BroadcastMid{x.prod(0, a), y.prod(0, yr), x.prod(a + yr, x.size())};
}

}  // namespace keel
