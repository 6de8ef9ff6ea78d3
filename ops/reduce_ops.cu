// CUDA twins of reduce_ops.cc: mean, reduce_sum and reduce_mean, forward and grad. The index
// bookkeeping is the CPU kernel's (fn::ReduceLayout in ops/functors/index_plans.h): one block per
// Out element sums the X elements that fn::ReduceGather lists for it (a fixed order per shape, so
// results repeat bit for bit); the grad broadcasts Out@GRAD back through ReduceLayout::OutIndex.
#include <limits>
#include <vector>

#include "ops/cuda_util.cuh"
#include "ops/functors/index_plans.h"

namespace keel {
namespace {

// Which dims `dim` / `reduce_all` reduce (the shape function has checked them).
fn::ReduceLayout LayoutOf(const DDim& x, const std::vector<int>& dim, bool reduce_all) {
  bool reduced[DDim::kMaxRank] = {};
  const bool all = reduce_all || dim.empty();
  for (int i = 0; i < x.size(); ++i) reduced[i] = all;
  if (!all)
    for (int d : dim) {
      const int a = d < 0 ? d + x.size() : d;
      KEEL_ENFORCE(a >= 0 && a < x.size(), "dim ", d, " is outside X ", x.str());
      reduced[a] = true;
    }
  return fn::MakeReduceLayout(x, reduced);
}

// out[o] = scale * sum_r x[Base(o) + Offset(r)], one block per o.
template <typename T>
__global__ void ReduceRows(const T* x, T* out, fn::ReduceGather g, T scale, int64_t out_numel) {
  for (int64_t o = blockIdx.x; o < out_numel; o += gridDim.x) {
    const int64_t base = g.Base(o);
    T acc = 0;
    for (int64_t r = threadIdx.x; r < g.count; r += blockDim.x) acc += x[base + g.Offset(r)];
    acc = BlockSum(acc);
    if (threadIdx.x == 0) out[o] = acc * scale;
  }
}

inline int ReduceThreads(int64_t n) { return n >= 512 ? 512 : n > 64 ? 128 : 32; }

template <typename T>
void Reduce(const ExecutionContext& ctx, const Tensor& x, const fn::ReduceLayout& l, T scale,
            T* out) {
  const fn::ReduceGather g = fn::MakeReduceGather(l);
  const unsigned blocks = static_cast<unsigned>(l.out_numel < 65535 * 8 ? l.out_numel : 65535 * 8);
  ReduceRows<T><<<blocks, ReduceThreads(g.count), 0, Cuda(ctx).stream()>>>(x.data<T>(), out, g,
                                                                           scale, l.out_numel);
  KEEL_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------- mean

// out = sum(x) / numel(x).
template <typename T>
class MeanKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    T* out = ctx.Output("Out")->mutable_data<T>(ctx.place());
    const bool all[DDim::kMaxRank] = {true, true, true, true, true, true, true, true, true};
    if (x.numel() == 0) {  // 0 / 0, as the CPU kernel
      ForEach(ctx, 1, [=] __device__(int64_t) { out[0] = T(NAN); });
      return;
    }
    Reduce<T>(ctx, x, fn::MakeReduceLayout(x.dims(), all), T(1), out);
    const T n = static_cast<T>(x.numel());
    ForEach(ctx, 1, [=] __device__(int64_t) { out[0] = out[0] / n; });
  }
};

// dx = dout / numel(x), everywhere.
template <typename T>
class MeanGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(dout.numel() == 1, "Out@GRAD must hold one element, got ", dout.dims().str());
    const T* g = dout.data<T>();
    T* dxd = dx->mutable_data<T>(ctx.place());
    const T n = static_cast<T>(dx->numel());
    ForEach(ctx, dx->numel(), [=] __device__(int64_t i) { dxd[i] = g[0] / n; });
  }
};

// ---------------------------------------------------------------- reduce_sum, reduce_mean

// out = sum of x over the reduced dims (times out_numel / numel for the mean).
template <typename T, bool kMean>
class ReduceKernel : public OpKernel {
 public:
  explicit ReduceKernel(const OpDesc& op)
      : dim_(op.Attr<std::vector<int>>("dim")), reduce_all_(op.Attr<bool>("reduce_all")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    Tensor* out = ctx.Output("Out");
    T* od = out->mutable_data<T>(ctx.place());
    if (x.numel() == 0) {
      const T v = kMean ? std::numeric_limits<T>::quiet_NaN() : T(0);
      ForEach(ctx, out->numel(), [=] __device__(int64_t i) { od[i] = v; });
      return;
    }
    const fn::ReduceLayout l = LayoutOf(x.dims(), dim_, reduce_all_);
    KEEL_ENFORCE(out->numel() == l.out_numel, "Out ", out->dims().str(),
                 " does not match the reduction of X ", x.dims().str());
    const T scale = kMean ? static_cast<T>(l.out_numel) / static_cast<T>(l.numel) : T(1);
    Reduce<T>(ctx, x, l, scale, od);
  }

 private:
  std::vector<int> dim_;
  bool reduce_all_;
};

// dx = dout broadcast back over the reduced dims (times out_numel / numel for the mean).
template <typename T, bool kMean>
class ReduceGradKernel : public OpKernel {
 public:
  explicit ReduceGradKernel(const OpDesc& op)
      : dim_(op.Attr<std::vector<int>>("dim")), reduce_all_(op.Attr<bool>("reduce_all")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& x = ctx.Input("X");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    T* dxp = dx->mutable_data<T>(ctx.place());
    if (x.numel() == 0) return;
    const fn::ReduceLayout l = LayoutOf(x.dims(), dim_, reduce_all_);
    KEEL_ENFORCE(dout.numel() == l.out_numel, "Out@GRAD ", dout.dims().str(),
                 " does not match the reduction of X ", x.dims().str());
    const T scale = kMean ? static_cast<T>(l.out_numel) / static_cast<T>(l.numel) : T(1);
    const T* dop = dout.data<T>();
    ForEach(ctx, l.numel, [=] __device__(int64_t i) { dxp[i] = dop[l.OutIndex(i)] * scale; });
  }

 private:
  std::vector<int> dim_;
  bool reduce_all_;
};

template <typename T>
using ReduceSumKernel = ReduceKernel<T, false>;
template <typename T>
using ReduceMeanKernel = ReduceKernel<T, true>;
template <typename T>
using ReduceSumGradKernel = ReduceGradKernel<T, false>;
template <typename T>
using ReduceMeanGradKernel = ReduceGradKernel<T, true>;

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(mean, MeanKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(mean_grad, MeanGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(reduce_sum, ReduceSumKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(reduce_sum_grad, ReduceSumGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(reduce_mean, ReduceMeanKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(reduce_mean_grad, ReduceMeanGradKernel, float, double);

}  // namespace keel
