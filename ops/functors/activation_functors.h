// Element-wise activation math, one functor per formula, shared by CPU and CUDA kernels.
// Forward functors map x -> out; grad functors of ops whose grad reads Out map (out, dout) -> dx,
// those that read X map (x, dout) -> dx.
#pragma once

#include "ops/functors/hd.h"

namespace keel {
namespace fn {

// out = max(x, 0);  dx = dout * (out > 0). A NaN passes through both ways, as in PyTorch (relu
// of NaN is NaN; its gradient is dout): a NaN that became 0 would hide an overflow from
// FLAGS_check_nan_inf and from loss scaling.
struct Relu {
  template <typename T>
  KEEL_HD T operator()(T x) const {
    return x > T(0) || x != x ? x : T(0);
  }
};
struct ReluGrad {
  template <typename T>
  KEEL_HD T operator()(T out, T dout) const {
    return out > T(0) || out != out ? dout : T(0);
  }
};

// out = tanh(x);  dx = dout * (1 - out^2)  (TanhAct: fn::Tanh is the math function)
struct TanhAct {
  template <typename T>
  KEEL_HD T operator()(T x) const {
    return fn::Tanh(x);
  }
};
struct TanhGrad {
  template <typename T>
  KEEL_HD T operator()(T out, T dout) const {
    return dout * (T(1) - out * out);
  }
};

// out = 1 / (1 + exp(-x));  dx = dout * out * (1 - out)
struct Sigmoid {
  template <typename T>
  KEEL_HD T operator()(T x) const {
    return T(1) / (T(1) + fn::Exp(-x));
  }
};
struct SigmoidGrad {
  template <typename T>
  KEEL_HD T operator()(T out, T dout) const {
    return dout * out * (T(1) - out);
  }
};

// erf form: out = 0.5 x (1 + erf(x / sqrt(2)));
// tanh form: out = 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3).
constexpr double kSqrt1_2 = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kSqrt2_Pi = 0.79788456080286535588;    // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

struct Gelu {
  bool approximate;
  template <typename T>
  KEEL_HD T operator()(T v) const {
    if (approximate)
      return T(0.5) * v * (T(1) + fn::Tanh(T(kSqrt2_Pi) * (v + T(kGeluCubic) * v * v * v)));
    return T(0.5) * v * (T(1) + fn::Erf(v * T(kSqrt1_2)));
  }
};
// erf form:  dx = dout * (Phi(x) + x * exp(-x^2 / 2) / sqrt(2 pi)).
// tanh form: dx = dout * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 x^2)).
struct GeluGrad {
  bool approximate;
  template <typename T>
  KEEL_HD T operator()(T v, T dout) const {
    if (approximate) {
      const T t = fn::Tanh(T(kSqrt2_Pi) * (v + T(kGeluCubic) * v * v * v));
      const T du = T(kSqrt2_Pi) * (T(1) + T(3 * kGeluCubic) * v * v);
      return dout * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du);
    }
    const T cdf = T(0.5) * (T(1) + fn::Erf(v * T(kSqrt1_2)));
    return dout * (cdf + v * T(kInvSqrt2Pi) * fn::Exp(T(-0.5) * v * v));
  }
};

// out = x > 0 ? x : alpha x;  dx = dout * (x > 0 ? 1 : alpha)
template <typename T>
struct LeakyRelu {
  T alpha;
  KEEL_HD T operator()(T x) const { return x > T(0) ? x : alpha * x; }
};
template <typename T>
struct LeakyReluGrad {
  T alpha;
  KEEL_HD T operator()(T x, T dout) const { return x > T(0) ? dout : alpha * dout; }
};

// out = min(max(x, lo), hi);  dx = dout where lo < x < hi
template <typename T>
struct Clip {
  T lo, hi;
  KEEL_HD T operator()(T x) const {
    const T a = x < lo ? lo : x;
    return a > hi ? hi : a;
  }
};
template <typename T>
struct ClipGrad {
  T lo, hi;
  KEEL_HD T operator()(T x, T dout) const { return (x > lo && x < hi) ? dout : T(0); }
};

// out = scale * x + bias (bias already multiplied by scale when it comes before the scale)
template <typename T>
struct ScaleShift {
  T scale, bias;
  KEEL_HD T operator()(T x) const { return scale * x + bias; }
};

}  // namespace fn
}  // namespace keel
