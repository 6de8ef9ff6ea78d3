// Per-element optimizer updates, shared by CPU and CUDA kernels. Scalars that depend on the step
// (lr, bias corrections) are computed once per kernel call, on the host or in the kernel, in
// double; the per-element math is here.
#pragma once

#include "ops/functors/hd.h"

namespace keel {
namespace fn {

// param_out = param - lr * grad
template <typename T>
KEEL_HD T SgdUpdate(T p, T g, T lr) {
  return p - lr * g;
}

// v_out = mu * v + g;  param_out = param - lr * (g + mu * v_out) (Nesterov) or param - lr * v_out
template <typename T>
struct Momentum {
  T mu;
  bool nesterov;
  KEEL_HD void operator()(T p, T g, T v, T lr, T* p_out, T* v_out) const {
    const T vn = mu * v + g;
    *v_out = vn;
    *p_out = nesterov ? p - lr * (g + mu * vn) : p - lr * vn;
  }
};

// Adam (decay 1) and AdamW (decay = 1 - lr * coeff):
//   m1 = b1 m1 + (1 - b1) g;  m2 = b2 m2 + (1 - b2) g^2
//   param = decay * param - lr_t * m1 / (sqrt(m2) + eps_hat)
// with lr_t = lr sqrt(1 - b2^t) / (1 - b1^t) and eps_hat = eps sqrt(1 - b2^t) (AdamStepScalars).
template <typename T>
struct Adam {
  T b1, b2, lr_t, eps_hat, decay;
  KEEL_HD void operator()(T p, T g, T m1, T m2, T* p_out, T* m1_out, T* m2_out) const {
    const T n1 = b1 * m1 + (T(1) - b1) * g;
    const T n2 = b2 * m2 + (T(1) - b2) * (g * g);
    *m1_out = n1;
    *m2_out = n2;
    *p_out = decay * p - lr_t * (n1 / (fn::Sqrt(n2) + eps_hat));
  }
};

// The step's scalars of Adam from lr, beta powers (b^t on entry), epsilon and the AdamW coeff.
template <typename T>
KEEL_HD Adam<T> AdamStep(double lr, double b1_pow, double b2_pow, double beta1, double beta2,
                         double epsilon, double coeff) {
  Adam<T> a;
  a.b1 = static_cast<T>(beta1);
  a.b2 = static_cast<T>(beta2);
  a.lr_t = static_cast<T>(lr * fn::Sqrt(1 - b2_pow) / (1 - b1_pow));
  a.eps_hat = static_cast<T>(epsilon * fn::Sqrt(1 - b2_pow));
  a.decay = static_cast<T>(1 - lr * coeff);
  return a;
}

// clip_by_global_norm's factor on every tensor: clip_norm / max(norm, clip_norm) (1 when the
// norm is within clip_norm).
KEEL_HD double GlobalNormScale(double norm, double clip_norm) {
  return clip_norm / (norm < clip_norm ? clip_norm : norm);  // a NaN norm stays NaN
}

}  // namespace fn
}  // namespace keel
