// Loss scaling on CUDA: the kernels are amp_ops.h's, with check_finite_and_unscale's math batched
// (a launch per up to kUnscaleBatch gradients of a dtype); the scale and the overflow flag stay on
// the device.
#include "ops/amp_ops.h"
#include "ops/cuda_util.cuh"

namespace keel {

namespace {

// Up to this many gradients of one dtype per launch: the batch travels as the kernel's argument
// (24 x 24 bytes), so no table is copied to the device.
constexpr int kUnscaleBatch = 24;

template <typename U>
struct UnscaleBatch {
  const U* x[kUnscaleBatch];
  U* out[kUnscaleBatch];
  int64_t n[kUnscaleBatch];
};

// Block row y: gradient y of the batch, grid-stride over its elements; the same arithmetic as
// UnscaleMath::One (amp_ops.h), so the same bits.
template <typename U>
__global__ void UnscaleBatchKernel(UnscaleBatch<U> b, DeviceScalar scale, bool* found) {
  using A = Acc<U>;
  const int t = blockIdx.y;
  const U* xp = b.x[t];
  U* op = b.out[t];
  const A inv = static_cast<A>(1.0 / scale.Get());
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < b.n[t];
       i += int64_t(blockDim.x) * gridDim.x) {
    const A v = Widen(xp[i]);
    if (!isfinite(v)) *found = true;
    op[i] = Narrow<U>(static_cast<A>(v * inv));
  }
}

}  // namespace

template <>
struct UnscaleMath<CUDADevice> {
  static void Run(const ExecutionContext& ctx, const std::vector<UnscaleItem>& items, bool* found,
                  DeviceScalar scale) {
    Batches<float>(ctx, items, found, scale);
    Batches<double>(ctx, items, found, scale);
    Batches<float16>(ctx, items, found, scale);
    Batches<bfloat16>(ctx, items, found, scale);
  }
  template <typename U>
  static void Batches(const ExecutionContext& ctx, const std::vector<UnscaleItem>& items,
                      bool* found, DeviceScalar scale) {
    UnscaleBatch<U> b;
    int count = 0;
    int64_t longest = 0;
    auto launch = [&] {
      if (count == 0) return;
      UnscaleBatchKernel<U>
          <<<dim3(GridFor(longest), count), 256, 0, Cuda(ctx).stream()>>>(b, scale, found);
      KEEL_CUDA_LAUNCH_CHECK();
      count = 0;
      longest = 0;
    };
    for (const UnscaleItem& it : items) {
      if (it.dtype != DTypeOf<U>::value || it.n == 0) continue;
      b.x[count] = static_cast<const U*>(it.x);
      b.out[count] = static_cast<U*>(it.out);
      b.n[count] = it.n;
      longest = std::max(longest, it.n);
      if (++count == kUnscaleBatch) launch();
    }
    launch();
  }
};

KEEL_REGISTER_KERNEL(CUDA, check_finite_and_unscale, CheckFiniteAndUnscaleKernel, float, double,
                     float16, bfloat16);
KEEL_REGISTER_KERNEL(CUDA, update_loss_scaling, UpdateLossScalingKernel, float);

}  // namespace keel
