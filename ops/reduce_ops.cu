// The reductions' CUDA math (the kernels are in reduce_ops.h): one block per Out element sums the
// X elements that fn::ReduceGather lists for it (a fixed order per shape, so results repeat bit
// for bit); the grad broadcasts Out@GRAD back through ReduceLayout::OutIndex.
#include "ops/cuda_util.cuh"
#include "ops/reduce_ops.h"

namespace keel {
namespace {

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

}  // namespace

template <typename T>
struct ReduceMath<CUDADevice, T> {
  static void Sum(const ExecutionContext& ctx, const T* x, const fn::ReduceLayout& l, T scale,
                  T* out) {
    const fn::ReduceGather g = fn::MakeReduceGather(l);
    const unsigned blocks =
        static_cast<unsigned>(l.out_numel < 65535 * 8 ? l.out_numel : 65535 * 8);
    ReduceRows<T>
        <<<blocks, ReduceThreads(g.count), 0, Cuda(ctx).stream()>>>(x, out, g, scale, l.out_numel);
    KEEL_CUDA_LAUNCH_CHECK();
  }

  // The sum of every element, then one division (0 / 0 for an empty X, as on the CPU).
  static void Mean(const ExecutionContext& ctx, const Tensor& x, T* out) {
    if (x.numel() == 0) {
      ForEach(ctx, 1, [=] __device__(int64_t) { out[0] = T(NAN); });
      return;
    }
    const bool all[DDim::kMaxRank] = {true, true, true, true, true, true, true, true, true};
    Sum(ctx, x.data<T>(), fn::MakeReduceLayout(x.dims(), all), T(1), out);
    const T n = static_cast<T>(x.numel());
    ForEach(ctx, 1, [=] __device__(int64_t) { out[0] = out[0] / n; });
  }

  static void Broadcast(const ExecutionContext& ctx, const T* dop, const fn::ReduceLayout& l,
                        T scale, T* dxp) {
    ForEach(ctx, l.numel, [=] __device__(int64_t i) { dxp[i] = dop[l.OutIndex(i)] * scale; });
  }
};

KEEL_REGISTER_KERNEL(CUDA, mean, MeanKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, mean_grad, MeanGradKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, reduce_sum, ReduceSumKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_KERNEL(CUDA, reduce_sum_grad, ReduceSumGradKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, reduce_mean, ReduceMeanKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, reduce_mean_grad, ReduceMeanGradKernel, float, double);

}  // namespace keel
