// The kernels of the activations (activation_ops.cc has the ops, their shapes and formulas):
// tanh, relu, sigmoid, gelu, leaky_relu, clip (elementwise) and softmax, log_softmax (along one
// axis), each with its grad, once for every device (ops/device.h).
//
// Every element-wise formula is one functor of ops/functors/activation_functors.h, applied by
// ActivationMath<D, T, F>: in pieces on the CPU thread budget, one launch on CUDA. The CPU
// specialises it for tanh, sigmoid and gelu, which stay on Eigen's vectorized exp/tanh/erf
// (activation_ops.cc says why). Softmax and log_softmax are SoftmaxMath<D, T, kLog>: Eigen rows on
// the CPU, one block per row on CUDA.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/half_convert.h"
#include "ops/axis_layout.h"
#include "ops/device.h"
#include "ops/functors/activation_functors.h"

namespace keel {

// ---------------------------------------------------------------- elementwise

// An activation functor from the op's attrs (none for most).
template <typename F>
struct ActivationAttrs {
  static F From(const OpDesc&) { return F{}; }
};
template <>
struct ActivationAttrs<fn::Gelu> {
  static fn::Gelu From(const OpDesc& op) { return fn::Gelu{op.Attr<bool>("approximate")}; }
};
template <>
struct ActivationAttrs<fn::GeluGrad> {
  static fn::GeluGrad From(const OpDesc& op) { return fn::GeluGrad{op.Attr<bool>("approximate")}; }
};
template <typename T>
struct ActivationAttrs<fn::LeakyRelu<T>> {
  static fn::LeakyRelu<T> From(const OpDesc& op) {
    return fn::LeakyRelu<T>{static_cast<T>(op.Attr<float>("alpha"))};
  }
};
template <typename T>
struct ActivationAttrs<fn::LeakyReluGrad<T>> {
  static fn::LeakyReluGrad<T> From(const OpDesc& op) {
    return fn::LeakyReluGrad<T>{static_cast<T>(op.Attr<float>("alpha"))};
  }
};
template <typename T>
struct ActivationAttrs<fn::Clip<T>> {
  static fn::Clip<T> From(const OpDesc& op) {
    return fn::Clip<T>{static_cast<T>(op.Attr<float>("min")),
                       static_cast<T>(op.Attr<float>("max"))};
  }
};
template <typename T>
struct ActivationAttrs<fn::ClipGrad<T>> {
  static fn::ClipGrad<T> From(const OpDesc& op) {
    return fn::ClipGrad<T>{static_cast<T>(op.Attr<float>("min")),
                           static_cast<T>(op.Attr<float>("max"))};
  }
};

// out[i] = f(x[i]); dx[i] = f(a[i], dout[i]), f over Acc<T> (the 16-bit types widened to float32,
// the result rounded once). Memory-bound work, so the CPU's pieces are kElementwiseGrain long.
// On the CPU the 16-bit types go through float32 chunks (the vectorized conversions, then f over
// float32 values in a loop the compiler can vectorize): the same values as one element at a time.
template <typename D, typename T, typename F>
struct ActivationMath {
  static constexpr int64_t kChunk = 1024;
  static void Forward(const ExecutionContext& ctx, int64_t n, const T* x, T* out, F f) {
    if constexpr (std::is_same_v<D, CPUDevice> && kIsHalf<T>) {
      cpu_threads::ParallelForRange(n, cpu_threads::kElementwiseGrain, [&](int64_t b, int64_t e) {
        alignas(64) float xb[kChunk];
        for (int64_t i = b; i < e; i += kChunk) {
          const int64_t len = std::min(kChunk, e - i);
          WidenN(x + i, xb, len);
          for (int64_t j = 0; j < len; ++j) xb[j] = f(xb[j]);
          NarrowN(xb, out + i, len);
        }
      });
      return;
    }
    Device<D>::ForEachInPieces(
        ctx, n, cpu_threads::kElementwiseGrain,
        [=] KEEL_HD_LAMBDA(int64_t i) { out[i] = Narrow<T>(f(Widen(x[i]))); });
  }
  static void Grad(const ExecutionContext& ctx, int64_t n, const T* a, const T* dout, T* dx, F f) {
    if constexpr (std::is_same_v<D, CPUDevice> && kIsHalf<T>) {
      cpu_threads::ParallelForRange(n, cpu_threads::kElementwiseGrain, [&](int64_t b, int64_t e) {
        alignas(64) float ab[kChunk], gb[kChunk];
        for (int64_t i = b; i < e; i += kChunk) {
          const int64_t len = std::min(kChunk, e - i);
          WidenN(a + i, ab, len);
          WidenN(dout + i, gb, len);
          for (int64_t j = 0; j < len; ++j) ab[j] = f(ab[j], gb[j]);
          NarrowN(ab, dx + i, len);
        }
      });
      return;
    }
    Device<D>::ForEachInPieces(
        ctx, n, cpu_threads::kElementwiseGrain,
        [=] KEEL_HD_LAMBDA(int64_t i) { dx[i] = Narrow<T>(f(Widen(a[i]), Widen(dout[i]))); });
  }
};

// Out = F(X), elementwise.
template <typename D, typename T, typename F>
class ActivationKernel : public OpKernel {
 public:
  explicit ActivationKernel(const OpDesc& op) : f_(ActivationAttrs<F>::From(op)) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    ActivationMath<D, T, F>::Forward(ctx, x.numel(), x.data<T>(),
                                     ctx.Output("Out")->mutable_data<T>(ctx.place()), f_);
  }

 private:
  F f_;
};

// X@GRAD = F(A, Out@GRAD), elementwise; A is Out (kFromOut: tanh, sigmoid, relu, whose derivative
// is a function of Out, so X may be freed after the forward pass) or X.
template <typename D, typename T, typename F, bool kFromOut>
class ActivationGradKernel : public OpKernel {
 public:
  explicit ActivationGradKernel(const OpDesc& op) : f_(ActivationAttrs<F>::From(op)) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "X");
    if (dx == nullptr) return;
    const char* a_slot = kFromOut ? "Out" : "X";
    const Tensor& a = ctx.Input(a_slot);
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(a.numel() == dout.numel(), a_slot, " ", a.dims().str(), " and Out@GRAD ",
                 dout.dims().str(), " differ in size");
    ActivationMath<D, T, F>::Grad(ctx, a.numel(), a.data<T>(), dout.data<T>(),
                                  dx->mutable_data<T>(ctx.place()), f_);
  }

 private:
  F f_;
};

template <typename D, typename T>
using TanhKernel = ActivationKernel<D, T, fn::TanhAct>;
template <typename D, typename T>
using TanhGradKernel = ActivationGradKernel<D, T, fn::TanhGrad, true>;
template <typename D, typename T>
using SigmoidKernel = ActivationKernel<D, T, fn::Sigmoid>;
template <typename D, typename T>
using SigmoidGradKernel = ActivationGradKernel<D, T, fn::SigmoidGrad, true>;
template <typename D, typename T>
using ReluKernel = ActivationKernel<D, T, fn::Relu>;
template <typename D, typename T>
using ReluGradKernel = ActivationGradKernel<D, T, fn::ReluGrad, true>;
template <typename D, typename T>
using GeluKernel = ActivationKernel<D, T, fn::Gelu>;
template <typename D, typename T>
using GeluGradKernel = ActivationGradKernel<D, T, fn::GeluGrad, false>;
template <typename D, typename T>
using LeakyReluKernel = ActivationKernel<D, T, fn::LeakyRelu<Acc<T>>>;
template <typename D, typename T>
using LeakyReluGradKernel = ActivationGradKernel<D, T, fn::LeakyReluGrad<Acc<T>>, false>;
template <typename D, typename T>
using ClipKernel = ActivationKernel<D, T, fn::Clip<Acc<T>>>;
template <typename D, typename T>
using ClipGradKernel = ActivationGradKernel<D, T, fn::ClipGrad<Acc<T>>, false>;

// ---------------------------------------------------------------- softmax, log_softmax

// The device math over X viewed as [pre, n, post] (rows of n along the axis, stride post):
//   Forward(ctx, s, x, out)       softmax: out = exp(x - max) / sum(exp(x - max));
//                                 log_softmax: out = x - max - log(sum(exp(x - max)))
//   Grad(ctx, s, out, dout, dx)   softmax: dx = out * (dout - sum(dout * out));
//                                 log_softmax: dx = dout - exp(out) * sum(dout)
template <typename D, typename T, bool kLog>
struct SoftmaxMath;

template <typename D, typename T, bool kLog>
class SoftmaxKernel : public OpKernel {
 public:
  explicit SoftmaxKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const AxisSplit s = SplitAt(x.dims(), axis_);
    SoftmaxMath<D, T, kLog>::Forward(ctx, s, x.data<T>(),
                                     ctx.Output("Out")->mutable_data<T>(ctx.place()));
  }

 private:
  int axis_;
};

template <typename D, typename T, bool kLog>
class SoftmaxGradKernel : public OpKernel {
 public:
  explicit SoftmaxGradKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "X");
    if (dx == nullptr) return;
    const Tensor& out = ctx.Input("Out");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(out.dims() == dout.dims(), "Out ", out.dims().str(), " and Out@GRAD ",
                 dout.dims().str(), " differ");
    const AxisSplit s = SplitAt(out.dims(), axis_);
    SoftmaxMath<D, T, kLog>::Grad(ctx, s, out.data<T>(), dout.data<T>(),
                                  dx->mutable_data<T>(ctx.place()));
  }

 private:
  int axis_;
};

template <typename D, typename T>
using SoftmaxFwdKernel = SoftmaxKernel<D, T, false>;
template <typename D, typename T>
using SoftmaxBwdKernel = SoftmaxGradKernel<D, T, false>;
template <typename D, typename T>
using LogSoftmaxFwdKernel = SoftmaxKernel<D, T, true>;
template <typename D, typename T>
using LogSoftmaxBwdKernel = SoftmaxGradKernel<D, T, true>;

}  // namespace keel
