// The kernels of the reductions (reduce_ops.cc has the ops and their shapes): mean (everything to
// shape [1]), reduce_sum and reduce_mean over chosen dims, forward and grad, once for every device
// (ops/device.h). The index bookkeeping is fn::ReduceLayout (ops/functors/index_plans.h); the
// sums are ReduceMath<D, T>: Eigen over contiguous runs on the CPU, one block per Out element on
// CUDA, each in a fixed order per shape, so results repeat bit for bit.
#pragma once

#include <limits>
#include <vector>

#include "ops/axis_layout.h"
#include "ops/device.h"
#include "ops/functors/index_plans.h"

namespace keel {

// Which dims of X `dim` / `reduce_all` reduce: every dim when reduce_all is set or `dim` is empty.
struct ReduceDims {
  bool reduced[DDim::kMaxRank] = {};
};
inline ReduceDims ResolveReduceDims(const std::vector<int>& dim, bool reduce_all, const DDim& x) {
  ReduceDims r;
  const bool all = reduce_all || dim.empty();
  for (int i = 0; i < x.size(); ++i) r.reduced[i] = all;
  if (all) return r;
  for (int d : dim) {
    CheckAxisInRange("dim", d, "X", x);
    r.reduced[CanonicalAxis(d, x.size())] = true;
  }
  return r;
}

// X's dims merged by kind (reduced or kept).
inline fn::ReduceLayout ReduceLayoutOf(const DDim& x, const std::vector<int>& dim,
                                       bool reduce_all) {
  return fn::MakeReduceLayout(x, ResolveReduceDims(dim, reduce_all, x).reduced);
}

// The device math:
//   Mean(ctx, x, out)                  out[0] = sum(x) / numel(x)
//   Sum(ctx, x, l, scale, out)         out = scale * (x summed over l's reduced dims)
//   Broadcast(ctx, dout, l, scale, dx) dx = scale * dout broadcast back over l's reduced dims
template <typename D, typename T>
struct ReduceMath;

// out = sum(x) / numel(x).
template <typename D, typename T>
class MeanKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    ReduceMath<D, T>::Mean(ctx, x, ctx.Output("Out")->mutable_data<T>(ctx.place()));
  }
};

// dx = dout / numel(x), everywhere.
template <typename D, typename T>
class MeanGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "X");
    if (dx == nullptr) return;
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(dout.numel() == 1, "Out@GRAD must hold one element, got ", dout.dims().str());
    const T* g = dout.data<T>();
    T* dxd = dx->mutable_data<T>(ctx.place());
    const T n = static_cast<T>(dx->numel());
    Device<D>::ForEach(ctx, dx->numel(), [=] KEEL_HD_LAMBDA(int64_t i) { dxd[i] = g[0] / n; });
  }
};

// 1 for a sum, out_numel / numel for a mean.
template <typename T, bool kMean>
T ReduceScale(const fn::ReduceLayout& l) {
  return kMean ? static_cast<T>(l.out_numel) / static_cast<T>(l.numel) : T(1);
}

// out = sum of x over the reduced dims (times out_numel / numel for the mean). An empty X sums to
// 0, and its mean is 0 / 0.
template <typename D, typename T, bool kMean>
class ReduceKernel : public OpKernel {
 public:
  explicit ReduceKernel(const OpDesc& op)
      : dim_(op.Attr<std::vector<int>>("dim")), reduce_all_(op.Attr<bool>("reduce_all")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    Tensor* out = ctx.Output("Out");
    T* o = out->mutable_data<T>(ctx.place());
    if (x.numel() == 0) {
      Device<D>::Fill(ctx, o, out->numel(), kMean ? std::numeric_limits<T>::quiet_NaN() : T(0));
      return;
    }
    const fn::ReduceLayout l = ReduceLayoutOf(x.dims(), dim_, reduce_all_);
    KEEL_ENFORCE(out->numel() == l.out_numel, "Out ", out->dims().str(),
                 " does not match the reduction of X ", x.dims().str());
    ReduceMath<D, T>::Sum(ctx, x.data<T>(), l, ReduceScale<T, kMean>(l), o);
  }

 private:
  std::vector<int> dim_;
  bool reduce_all_;
};

// dx = dout broadcast back over the reduced dims (times out_numel / numel for the mean).
template <typename D, typename T, bool kMean>
class ReduceGradKernel : public OpKernel {
 public:
  explicit ReduceGradKernel(const OpDesc& op)
      : dim_(op.Attr<std::vector<int>>("dim")), reduce_all_(op.Attr<bool>("reduce_all")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "X");
    if (dx == nullptr) return;
    const Tensor& x = ctx.Input("X");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    T* dxp = dx->mutable_data<T>(ctx.place());
    if (x.numel() == 0) return;
    const fn::ReduceLayout l = ReduceLayoutOf(x.dims(), dim_, reduce_all_);
    KEEL_ENFORCE(dout.numel() == l.out_numel, "Out@GRAD ", dout.dims().str(),
                 " does not match the reduction of X ", x.dims().str());
    ReduceMath<D, T>::Broadcast(ctx, dout.data<T>(), l, ReduceScale<T, kMean>(l), dxp);
  }

 private:
  std::vector<int> dim_;
  bool reduce_all_;
};

template <typename D, typename T>
using ReduceSumKernel = ReduceKernel<D, T, false>;
template <typename D, typename T>
using ReduceMeanKernel = ReduceKernel<D, T, true>;
template <typename D, typename T>
using ReduceSumGradKernel = ReduceGradKernel<D, T, false>;
template <typename D, typename T>
using ReduceMeanGradKernel = ReduceGradKernel<D, T, true>;

}  // namespace keel
