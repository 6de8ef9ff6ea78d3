// The kernels of mixed precision's loss scaling (amp_ops.cc has the ops, their shapes and Paddle's
// rule), once for every device (ops/device.h): check_finite_and_unscale divides the gradients by
// the loss scale and raises FoundInfinite when one of them holds an inf or a NaN;
// update_loss_scaling moves the scale and its good/bad step counters. Both read the scale and the
// flag in device code, so a step never waits for the host.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/device.h"

namespace keel {

namespace fn {
// Paddle's update_loss_scaling rule, one step. On overflow: good = 0, bad + 1, and every
// decr_every-th bad step the scale shrinks by decr_ratio (never below 1) and bad restarts at 0.
// Else: bad = 0, good + 1, and every incr_every-th good step the scale grows by incr_ratio (when
// the result is finite) and good restarts at 0.
struct LossScaleRule {
  int incr_every, decr_every;
  float incr_ratio, decr_ratio;
  KEEL_HD void operator()(bool found_inf, float prev, int good, int bad, float* scale,
                          int* good_out, int* bad_out) const {
    float s = prev;
    if (found_inf) {
      good = 0;
      bad += 1;
      if (bad >= decr_every) {
        s = prev * decr_ratio;
        if (s < 1.0f) s = 1.0f;
        bad = 0;
      }
    } else {
      bad = 0;
      good += 1;
      if (good >= incr_every) {
        const float grown = prev * incr_ratio;
        if (isfinite(grown)) s = grown;
        good = 0;
      }
    }
    *scale = s;
    *good_out = good;
    *bad_out = bad;
  }
};
}  // namespace fn

// One gradient of check_finite_and_unscale: X_k and its (allocated) Out_k, n elements of dtype.
struct UnscaleItem {
  DType dtype;
  const void* x;
  void* out;
  int64_t n;
};

// The device math: Out = X / scale for every item (16-bit ones in float32) and *found = true where
// one holds an inf or NaN. Here one pass per item; CUDA specializes it to one launch for up to a
// batch of items of a dtype (amp_ops.cu), so a model's ~60 gradients are not ~60 launches.
template <typename D>
struct UnscaleMath {
  static void Run(const ExecutionContext& ctx, const std::vector<UnscaleItem>& items, bool* found,
                  typename Device<D>::Scalar scale) {
    for (const UnscaleItem& it : items) {
      switch (it.dtype) {
        case DType::kFloat32:
          One<float>(ctx, it, found, scale);
          break;
        case DType::kFloat64:
          One<double>(ctx, it, found, scale);
          break;
        case DType::kFloat16:
          One<float16>(ctx, it, found, scale);
          break;
        default:
          One<bfloat16>(ctx, it, found, scale);
      }
    }
  }
  template <typename U>
  static void One(const ExecutionContext& ctx, const UnscaleItem& it, bool* found,
                  typename Device<D>::Scalar scale) {
    using A = Acc<U>;
    const U* xp = static_cast<const U*>(it.x);
    U* op = static_cast<U*>(it.out);
    Device<D>::ForEach(ctx, it.n, [=] KEEL_HD_LAMBDA(int64_t i) {
      const A v = Widen(xp[i]);
      if (!isfinite(v)) *found = true;
      op[i] = Narrow<U>(static_cast<A>(v * static_cast<A>(1.0 / scale.Get())));
    });
  }
};

// Out_k = X_k / Scale for every X_k; FoundInfinite = whether any X_k holds an inf or NaN. Each
// X_k in its own float dtype (AMP O2 mixes float16/bfloat16 gradients of low-precision parameters
// with float32 ones of the norms'), 16-bit ones checked and divided in float32.
template <typename D, typename T>
class CheckFiniteAndUnscaleKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const typename Device<D>::Scalar scale = Device<D>::ScalarOf(ctx.Input("Scale"));
    bool* found = ctx.Output("FoundInfinite")->mutable_data<bool>(ctx.place());
    Device<D>::Zero(ctx, found, 1);
    const int n = ctx.NumInputs("X");
    KEEL_ENFORCE(static_cast<int>(ctx.op().Output("Out").size()) == n, ctx.op().type(), ": ", n,
                 " X but ", ctx.op().Output("Out").size(), " Out");
    items_.clear();
    for (int k = 0; k < n; ++k) {
      const Tensor& x = ctx.Input("X", k);
      const DType dt = x.dtype();
      KEEL_ENFORCE(dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kFloat16 ||
                       dt == DType::kBFloat16,
                   ctx.op().type(), ": X[", k, "] is ", DTypeName(dt),
                   "; the gradients must be float types");
      void* out = ctx.Output("Out", k)->mutable_data(dt, ctx.place());
      items_.push_back({dt, x.raw_data(), out, x.numel()});
    }
    UnscaleMath<D>::Run(ctx, items_, found, scale);
  }

 private:
  std::vector<UnscaleItem> items_;
};

// LossScaling, OutGoodSteps, OutBadSteps from PrevLossScaling, InGoodSteps, InBadSteps and
// FoundInfinite by fn::LossScaleRule; with stop_update they are copied unchanged.
template <typename D, typename T>
class UpdateLossScalingKernel : public OpKernel {
 public:
  explicit UpdateLossScalingKernel(const OpDesc& op)
      : rule_{op.Attr<int>("incr_every_n_steps"), op.Attr<int>("decr_every_n_nan_or_inf"),
              op.Attr<float>("incr_ratio"), op.Attr<float>("decr_ratio")},
        stop_(op.Attr<bool>("stop_update")) {}
  void Compute(ExecutionContext& ctx) override {
    const bool* found = ctx.Input("FoundInfinite").data<bool>();
    const T* prev = ctx.Input("PrevLossScaling").data<T>();
    const int* good = ctx.Input("InGoodSteps").data<int>();
    const int* bad = ctx.Input("InBadSteps").data<int>();
    T* scale = ctx.Output("LossScaling")->mutable_data<T>(ctx.place());
    int* good_out = ctx.Output("OutGoodSteps")->mutable_data<int>(ctx.place());
    int* bad_out = ctx.Output("OutBadSteps")->mutable_data<int>(ctx.place());
    const fn::LossScaleRule rule = rule_;
    const bool stop = stop_;
    Device<D>::ForEach(ctx, 1, [=] KEEL_HD_LAMBDA(int64_t) {
      if (stop) {
        *scale = *prev;
        *good_out = *good;
        *bad_out = *bad;
        return;
      }
      float s;
      int g, b;
      rule(*found, static_cast<float>(*prev), *good, *bad, &s, &g, &b);
      *scale = static_cast<T>(s);
      *good_out = g;
      *bad_out = b;
    });
  }

 private:
  fn::LossScaleRule rule_;
  bool stop_;
};

}  // namespace keel
