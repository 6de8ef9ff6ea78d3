// Element-wise comparisons (into bool) and logical ops, shared by the CPU kernels
// (ops/control_ops.cc) and their CUDA twins (ops/control_ops.cu).
#pragma once

#include "ops/functors/hd.h"

namespace keel {
namespace fn {

struct LessThan {
  template <typename T>
  KEEL_HD bool operator()(T a, T b) const {
    return a < b;
  }
};
struct LessEqual {
  template <typename T>
  KEEL_HD bool operator()(T a, T b) const {
    return a <= b;
  }
};
struct GreaterThan {
  template <typename T>
  KEEL_HD bool operator()(T a, T b) const {
    return a > b;
  }
};
struct GreaterEqual {
  template <typename T>
  KEEL_HD bool operator()(T a, T b) const {
    return a >= b;
  }
};
struct Equal {
  template <typename T>
  KEEL_HD bool operator()(T a, T b) const {
    return a == b;
  }
};
struct NotEqual {
  template <typename T>
  KEEL_HD bool operator()(T a, T b) const {
    return a != b;
  }
};

// out = a && b (kAnd) or a || b.
template <bool kAnd>
struct Logical {
  KEEL_HD bool operator()(bool a, bool b) const { return kAnd ? (a && b) : (a || b); }
};

}  // namespace fn
}  // namespace keel
