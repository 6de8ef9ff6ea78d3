// The ranking rule of top_k and arg_max, shared by the CPU kernels (ops/metric_ops.cc) and their
// CUDA twins: larger first, NaN larger than any number (so a NaN logit shows up instead of
// hiding), ties to the lower index.
#pragma once

#include <cstdint>

#include "ops/functors/hd.h"

namespace keel {
namespace fn {

// v is NaN (never for integers).
template <typename T>
KEEL_HD bool IsNaN(T v) {
  return v != v;
}

// a ranks before b by value: larger, NaN largest of all. A strict weak order even with NaNs.
template <typename T>
KEEL_HD bool Greater(T a, T b) {
  if (IsNaN(b)) return false;
  return IsNaN(a) || a > b;
}

// Element (a, ia) ranks before (b, ib): by value, then the lower index. A strict total order.
template <typename T>
KEEL_HD bool RanksBefore(T a, int64_t ia, T b, int64_t ib) {
  if (Greater(a, b)) return true;
  if (Greater(b, a)) return false;
  return ia < ib;
}

}  // namespace fn
}  // namespace keel
