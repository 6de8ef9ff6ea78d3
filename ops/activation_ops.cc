// Activations: tanh, relu, sigmoid, gelu, leaky_relu, clip (elementwise) and softmax,
// log_softmax (along one axis).
//
// Grad ops of tanh, sigmoid, relu, softmax and log_softmax read Out and Out@GRAD only, never X,
// so X may be freed after the forward pass:
//   tanh:        dx = dout * (1 - out^2)
//   sigmoid:     dx = dout * out * (1 - out)
//   relu:        dx = dout * (out > 0)
//   softmax:     dx = out * (dout - sum(dout * out, axis))
//   log_softmax: dx = dout - exp(out) * sum(dout, axis)
// gelu, leaky_relu and clip read X (their derivative is not a function of Out):
//   gelu:        dx = dout * (Phi(x) + x * phi(x))            (erf form; tanh form below)
//   leaky_relu:  dx = dout * (x > 0 ? 1 : alpha)
//   clip:        dx = dout * (min < x < max)
// The kernels are in activation_ops.h; here are the shapes, the CPU math that stays on Eigen and
// the registrations.
#include "ops/activation_ops.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <unsupported/Eigen/SpecialFunctions>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/cpu_threads.h"
#include "ops/op_util.h"

namespace keel {
namespace {

// ---------------------------------------------------------------- elementwise

void ClipShape(InferShapeContext& ctx) {
  const float lo = ctx.Attr<float>("min"), hi = ctx.Attr<float>("max");
  KEEL_SHAPE_CHECK(lo <= hi, "min ", lo, " must not exceed max ", hi);
  ctx.ShareDimAndDType("X", "Out");
}

// ---------------------------------------------------------------- softmax

void SoftmaxShape(InferShapeContext& ctx) {
  DDim x = ctx.GetInputDim("X");
  int axis = ctx.Attr<int>("axis");
  KEEL_SHAPE_CHECK(x.size() >= 1, "needs rank >= 1, got X ", x.str());
  CheckAxisInRange("axis", axis, "X", x);
  ctx.ShareDimAndDType("X", "Out");
}

}  // namespace

// gelu evaluates erf or tanh (and exp) per element, several times the work of a relu even
// vectorized: its pieces are smaller, so a transformer's feed-forward activations (64 K elements
// in the built-in one) use every thread. The cut depends on the size only (cpu_threads.h).
constexpr int64_t kGeluGrain = int64_t{1} << 15;

// fn::Gelu and fn::GeluGrad over Eigen arrays: Eigen's erf, exp and tanh are vectorized (on this
// machine's AVX-512, erf over 64 K floats takes 17 µs against 780 with libm's erff, within 3e-7
// of it), as tanh and sigmoid (below); the CUDA kernels use the functors.
struct GeluArrays {
  bool approximate;
  // The tanh form's tanh(sqrt(2 / pi) (x + 0.044715 x^3)).
  template <typename T, typename X>
  static auto TanhOfCubic(const X& x) {
    return (T(fn::kSqrt2_Pi) * (x + T(fn::kGeluCubic) * x.cube())).tanh();
  }
  template <typename X, typename O>
  void Forward(const X& x, O out) const {
    using T = typename O::Scalar;
    if (approximate)
      out = T(0.5) * x * (T(1) + TanhOfCubic<T>(x));
    else
      out = T(0.5) * x * (T(1) + (x * T(fn::kSqrt1_2)).erf());
  }
  template <typename X, typename D, typename G>
  void Grad(const X& x, const D& dout, G dx) const {
    using T = typename G::Scalar;
    if (approximate) {
      const auto t = TanhOfCubic<T>(x).eval();
      const auto du = T(fn::kSqrt2_Pi) * (T(1) + T(3 * fn::kGeluCubic) * x.square());
      dx = dout * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t.square()) * du);
    } else {
      const auto cdf = T(0.5) * (T(1) + (x * T(fn::kSqrt1_2)).erf());
      dx = dout * (cdf + x * T(fn::kInvSqrt2Pi) * (T(-0.5) * x.square()).exp());
    }
  }
};

// tanh and sigmoid forward, and gelu, stay on Eigen's vectorized exp/tanh/erf on the CPU (several
// times faster than libm per element, within an ulp or two of it); CUDA uses the functors. Every
// other formula is ActivationMath's scalar loop. The 16-bit types run the float32 code on widened
// chunks (InFloatChunks).
template <typename T, typename Fn>
void EigenPieces(int64_t n, int64_t grain, const T* x, T* out, const Fn& fn) {
  cpu_threads::ParallelForRange(n, grain, [&](int64_t b, int64_t e) {
    if constexpr (kIsHalf<T>) {
      InFloatChunks(b, e, x, out, fn);
    } else {
      fn(ConstVec<T>(x + b, e - b), Vec<T>(out + b, e - b));
    }
  });
}
template <typename T, typename Fn>
void EigenPieces(int64_t n, int64_t grain, const T* x, const T* y, T* out, const Fn& fn) {
  cpu_threads::ParallelForRange(n, grain, [&](int64_t b, int64_t e) {
    if constexpr (kIsHalf<T>) {
      InFloatChunks(b, e, x, y, out, fn);
    } else {
      fn(ConstVec<T>(x + b, e - b), ConstVec<T>(y + b, e - b), Vec<T>(out + b, e - b));
    }
  });
}

template <typename T>
struct ActivationMath<CPUDevice, T, fn::TanhAct> {
  static void Forward(const ExecutionContext&, int64_t n, const T* x, T* out, fn::TanhAct) {
    EigenPieces(n, cpu_threads::kElementwiseGrain, x, out,
                [](auto xv, auto ov) { ov = xv.tanh(); });
  }
};
template <typename T>
struct ActivationMath<CPUDevice, T, fn::Sigmoid> {
  static void Forward(const ExecutionContext&, int64_t n, const T* x, T* out, fn::Sigmoid) {
    EigenPieces(n, cpu_threads::kElementwiseGrain, x, out, [](auto xv, auto ov) {
      using A = typename decltype(ov)::Scalar;
      ov = (A(1) + (-xv).exp()).inverse();
    });
  }
};
template <typename T>
struct ActivationMath<CPUDevice, T, fn::Gelu> {
  static void Forward(const ExecutionContext&, int64_t n, const T* x, T* out, fn::Gelu f) {
    const GeluArrays g{f.approximate};
    EigenPieces(n, kGeluGrain, x, out, [&](auto xv, auto ov) { g.Forward(xv, ov); });
  }
};
template <typename T>
struct ActivationMath<CPUDevice, T, fn::GeluGrad> {
  static void Grad(const ExecutionContext&, int64_t n, const T* x, const T* dout, T* dx,
                   fn::GeluGrad f) {
    const GeluArrays g{f.approximate};
    EigenPieces(n, kGeluGrain, x, dout, dx, [&](auto xv, auto gv, auto dv) { g.Grad(xv, gv, dv); });
  }
};

// relu and its grad on the 16-bit types select bits: each output is an input element itself or
// +0 (x > 0 and NaN pass, the rest become +0; dout passes where out > 0 or out is NaN), so no
// value needs widening or rounding, and a loop over 16-bit integers vectorizes at twice
// float32's lanes. The same values as through float32 (a signaling NaN passes without being
// quieted). Float32 and float64 keep the plain loop.
template <typename T>
struct HalfBitsOf {
  // The bit patterns above which an absolute value is a NaN.
  static constexpr uint16_t kNanAbove = std::is_same_v<T, bfloat16> ? 0x7f80u : 0x7c00u;
  // Positive or NaN: what relu keeps.
  static bool Keeps(uint16_t b) {
    const uint16_t mag = b & 0x7fffu;
    return ((b & 0x8000u) == 0 && mag != 0) || mag > kNanAbove;
  }
};
template <typename T>
struct ActivationMath<CPUDevice, T, fn::Relu> {
  static void Forward(const ExecutionContext&, int64_t n, const T* x, T* out, fn::Relu f) {
    cpu_threads::ParallelForRange(n, cpu_threads::kElementwiseGrain, [&](int64_t b, int64_t e) {
      if constexpr (kIsHalf<T>) {
        const auto* xb = reinterpret_cast<const uint16_t*>(x);
        auto* ob = reinterpret_cast<uint16_t*>(out);
        for (int64_t i = b; i < e; ++i) ob[i] = HalfBitsOf<T>::Keeps(xb[i]) ? xb[i] : uint16_t{0};
      } else {
        for (int64_t i = b; i < e; ++i) out[i] = f(x[i]);
      }
    });
  }
};
template <typename T>
struct ActivationMath<CPUDevice, T, fn::ReluGrad> {
  static void Grad(const ExecutionContext&, int64_t n, const T* out, const T* dout, T* dx,
                   fn::ReluGrad f) {
    cpu_threads::ParallelForRange(n, cpu_threads::kElementwiseGrain, [&](int64_t b, int64_t e) {
      if constexpr (kIsHalf<T>) {
        const auto* ob = reinterpret_cast<const uint16_t*>(out);
        const auto* gb = reinterpret_cast<const uint16_t*>(dout);
        auto* db = reinterpret_cast<uint16_t*>(dx);
        for (int64_t i = b; i < e; ++i) db[i] = HalfBitsOf<T>::Keeps(ob[i]) ? gb[i] : uint16_t{0};
      } else {
        for (int64_t i = b; i < e; ++i) dx[i] = f(out[i], dout[i]);
      }
    });
  }
};

// Rows along the last axis use vector ops per row, short ones (a 2-class head: shorter than a
// SIMD register) one exp over the whole buffer; rows along another axis are Eigen column blocks.
template <typename T>
struct SoftmaxMath<CPUDevice, T, false> {
  static void Forward(const ExecutionContext&, const AxisSplit& s, const T* xp, T* op) {
    if (s.post == 1 && s.n <= kShortRow) {
      // Shift each row by its max, exp the whole buffer in one vectorized pass, normalize rows.
      for (int64_t i = 0; i < s.pre; ++i) {
        const T* xr = xp + i * s.n;
        T* o = op + i * s.n;
        T mx = xr[0];
        for (int64_t k = 1; k < s.n; ++k) mx = std::max(mx, xr[k]);
        for (int64_t k = 0; k < s.n; ++k) o[k] = xr[k] - mx;
      }
      Vec<T> all(op, s.pre * s.n);
      all = all.exp();
      for (int64_t i = 0; i < s.pre; ++i) {
        T* o = op + i * s.n;
        T sum = 0;
        for (int64_t k = 0; k < s.n; ++k) sum += o[k];
        const T inv = T(1) / sum;
        for (int64_t k = 0; k < s.n; ++k) o[k] *= inv;
      }
      return;
    }
    if (s.post == 1) {
      for (int64_t i = 0; i < s.pre; ++i) {
        ConstVec<T> xr(xp + i * s.n, s.n);
        Vec<T> o(op + i * s.n, s.n);
        const T mx = xr.maxCoeff();
        o = (xr - mx).exp();
        o *= T(1) / o.sum();
      }
      return;
    }
    Eigen::Array<T, 1, Eigen::Dynamic> acc(s.post);
    for (int64_t i = 0; i < s.pre; ++i) {
      ConstMat<T> xm(xp + i * s.n * s.post, s.n, s.post);
      Mat<T> om(op + i * s.n * s.post, s.n, s.post);
      acc = xm.colwise().maxCoeff();
      om = (xm.rowwise() - acc).exp();
      acc = om.colwise().sum().inverse();
      om.rowwise() *= acc;
    }
  }

  static void Grad(const ExecutionContext&, const AxisSplit& s, const T* yp, const T* dyp, T* dxp) {
    if (s.post == 1 && s.n <= kShortRow) {
      for (int64_t i = 0; i < s.pre * s.n; i += s.n) {
        T dot = 0;
        for (int64_t k = 0; k < s.n; ++k) dot += dyp[i + k] * yp[i + k];
        for (int64_t k = 0; k < s.n; ++k) dxp[i + k] = yp[i + k] * (dyp[i + k] - dot);
      }
      return;
    }
    if (s.post == 1) {
      for (int64_t i = 0; i < s.pre; ++i) {
        ConstVec<T> y(yp + i * s.n, s.n);
        ConstVec<T> dy(dyp + i * s.n, s.n);
        Vec<T> g(dxp + i * s.n, s.n);
        const T dot = (dy * y).sum();
        g = y * (dy - dot);
      }
      return;
    }
    Eigen::Array<T, 1, Eigen::Dynamic> dot(s.post);
    for (int64_t i = 0; i < s.pre; ++i) {
      const int64_t off = i * s.n * s.post;
      ConstMat<T> y(yp + off, s.n, s.post);
      ConstMat<T> dy(dyp + off, s.n, s.post);
      Mat<T> g(dxp + off, s.n, s.post);
      dot = (dy * y).colwise().sum();
      g = y * (dy.rowwise() - dot);
    }
  }
};

// Never exponentiates a positive number.
template <typename T>
struct SoftmaxMath<CPUDevice, T, true> {
  static void Forward(const ExecutionContext&, const AxisSplit& s, const T* xp, T* op) {
    if (s.post == 1) {
      for (int64_t i = 0; i < s.pre; ++i) {
        ConstVec<T> xr(xp + i * s.n, s.n);
        Vec<T> o(op + i * s.n, s.n);
        const T mx = xr.maxCoeff();
        o = xr - mx;  // exact for x near max, so shift and log-sum-exp are not merged
        o -= std::log(o.exp().sum());
      }
      return;
    }
    Eigen::Array<T, 1, Eigen::Dynamic> acc(s.post);
    for (int64_t i = 0; i < s.pre; ++i) {
      ConstMat<T> xm(xp + i * s.n * s.post, s.n, s.post);
      Mat<T> om(op + i * s.n * s.post, s.n, s.post);
      acc = xm.colwise().maxCoeff();
      om = xm.rowwise() - acc;
      acc = om.exp().colwise().sum().log();
      om.rowwise() -= acc;
    }
  }

  static void Grad(const ExecutionContext&, const AxisSplit& s, const T* yp, const T* dyp, T* dxp) {
    if (s.post == 1) {
      for (int64_t i = 0; i < s.pre; ++i) {
        ConstVec<T> y(yp + i * s.n, s.n);
        ConstVec<T> dy(dyp + i * s.n, s.n);
        Vec<T>(dxp + i * s.n, s.n) = dy - y.exp() * dy.sum();
      }
      return;
    }
    Eigen::Array<T, 1, Eigen::Dynamic> sum(s.post);
    for (int64_t i = 0; i < s.pre; ++i) {
      const int64_t off = i * s.n * s.post;
      ConstMat<T> y(yp + off, s.n, s.post);
      ConstMat<T> dy(dyp + off, s.n, s.post);
      Mat<T> g(dxp + off, s.n, s.post);
      sum = dy.colwise().sum();
      g = dy - y.exp().rowwise() * sum;
    }
  }
};

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(tanh)
    .Doc("Out = tanh(X), elementwise.")
    .Input("X", "any shape")
    .Output("Out", "shape of X")
    .Shape(SameShapeAsX)
    .Grad(GradMaker("tanh_grad", {"Out"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(tanh_grad, tanh).Shape(GradShapeLike("X", "Out")).KernelDTypeFrom("Out");
KEEL_REGISTER_KERNEL(CPU, tanh, TanhKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, tanh_grad, TanhGradKernel, float, double, bfloat16, float16);

KEEL_REGISTER_OP(sigmoid)
    .Doc("Out = 1 / (1 + exp(-X)), elementwise.")
    .Input("X", "any shape")
    .Output("Out", "shape of X")
    .Shape(SameShapeAsX)
    .Grad(GradMaker("sigmoid_grad", {"Out"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(sigmoid_grad, sigmoid)
    .Shape(GradShapeLike("X", "Out"))
    .KernelDTypeFrom("Out");
KEEL_REGISTER_KERNEL(CPU, sigmoid, SigmoidKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, sigmoid_grad, SigmoidGradKernel, float, double, bfloat16, float16);

KEEL_REGISTER_OP(relu)
    .Doc("Out = max(X, 0), elementwise.")
    .Input("X", "any shape")
    .Output("Out", "shape of X")
    .Shape(SameShapeAsX)
    .Grad(GradMaker("relu_grad", {"Out"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(relu_grad, relu).Shape(GradShapeLike("X", "Out")).KernelDTypeFrom("Out");
KEEL_REGISTER_KERNEL(CPU, relu, ReluKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, relu_grad, ReluGradKernel, float, double, bfloat16, float16);

KEEL_REGISTER_OP(softmax)
    .Doc(
        "Out = exp(X) / sum(exp(X), axis), computed as exp(X - max) for stability. "
        "X [N, D] with axis -1 gives Out [N, D], each row summing to 1.")
    .Input("X", "any shape, rank >= 1")
    .Output("Out", "shape of X")
    .Attr<int>("axis", -1, "the dimension normalized over; negative counts from the end")
    .Shape(SoftmaxShape)
    .Grad(GradMaker("softmax_grad", {"Out"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(softmax_grad, softmax)
    .Shape(GradShapeLike("X", "Out"))
    .KernelDTypeFrom("Out");
KEEL_REGISTER_KERNEL(CPU, softmax, SoftmaxFwdKernel, float, double);
KEEL_REGISTER_KERNEL(CPU, softmax_grad, SoftmaxBwdKernel, float, double);

KEEL_REGISTER_OP(log_softmax)
    .Doc(
        "Out = X - log(sum(exp(X), axis)), computed as X - max - log(sum(exp(X - max))). "
        "X [N, D] with axis -1 gives Out [N, D], each row's exp summing to 1.")
    .Input("X", "any shape, rank >= 1")
    .Output("Out", "shape of X")
    .Attr<int>("axis", -1, "the dimension normalized over; negative counts from the end")
    .Shape(SoftmaxShape)
    .Grad(GradMaker("log_softmax_grad", {"Out"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(log_softmax_grad, log_softmax)
    .Shape(GradShapeLike("X", "Out"))
    .KernelDTypeFrom("Out");
KEEL_REGISTER_KERNEL(CPU, log_softmax, LogSoftmaxFwdKernel, float, double);
KEEL_REGISTER_KERNEL(CPU, log_softmax_grad, LogSoftmaxBwdKernel, float, double);

KEEL_REGISTER_OP(gelu)
    .Doc(
        "Out = X * Phi(X), Phi the standard normal CDF, elementwise; approximate: "
        "0.5 X (1 + tanh(sqrt(2 / pi) (X + 0.044715 X^3))).")
    .Input("X", "any shape")
    .Output("Out", "shape of X")
    .Attr<bool>("approximate", false, "false: the exact erf form; true: the tanh approximation")
    .Shape(SameShapeAsX)
    .Grad(GradMaker("gelu_grad", {"X"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(gelu_grad, gelu);
KEEL_REGISTER_KERNEL(CPU, gelu, GeluKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, gelu_grad, GeluGradKernel, float, double, bfloat16, float16);

KEEL_REGISTER_OP(leaky_relu)
    .Doc("Out = X > 0 ? X : alpha * X, elementwise.")
    .Input("X", "any shape")
    .Output("Out", "shape of X")
    .Attr<float>("alpha", 0.02f, "the slope for X <= 0")
    .Shape(SameShapeAsX)
    .Grad(GradMaker("leaky_relu_grad", {"X"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(leaky_relu_grad, leaky_relu);
KEEL_REGISTER_KERNEL(CPU, leaky_relu, LeakyReluKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, leaky_relu_grad, LeakyReluGradKernel, float, double, bfloat16, float16);

KEEL_REGISTER_OP(clip)
    .Doc("Out = min(max(X, min), max), elementwise. The gradient passes where min < X < max.")
    .Input("X", "any shape")
    .Output("Out", "shape of X")
    .RequiredAttr<float>("min", "lower bound, <= max")
    .RequiredAttr<float>("max", "upper bound")
    .Shape(ClipShape)
    .Grad(GradMaker("clip_grad", {"X"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(clip_grad, clip);
KEEL_REGISTER_KERNEL(CPU, clip, ClipKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, clip_grad, ClipGradKernel, float, double, bfloat16, float16);

}  // namespace keel
