// The tensor-creation ops on CUDA: the kernels are tensor_ops.h's (the random ops draw on the host
// and copy to the device without waiting, staged through pinned memory), reshape's
// ops/device.h's. Here is the cast kernel.
#include "ops/cuda_util.cuh"
#include "ops/tensor_ops.h"

namespace keel {
namespace {

// out[i] = ConvertTo<Out>(in[i]) (float -> int truncates; nonzero -> true; the 16-bit types
// through float32), as the CPU kernel.
template <typename In, typename Out>
__global__ void CastElements(const In* in, Out* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(blockDim.x) * gridDim.x)
    out[i] = ConvertTo<Out>(in[i]);
}

}  // namespace

template <>
struct CastMath<CUDADevice> {
  template <typename In, typename Out>
  static void Run(const ExecutionContext& ctx, const In* src, Out* dst, int64_t n) {
    if (n == 0) return;
    CastElements<In, Out><<<GridFor(n), 256, 0, Cuda(ctx).stream()>>>(src, dst, n);
    KEEL_CUDA_LAUNCH_CHECK();
  }
};

KEEL_REGISTER_KERNEL(CUDA, fill_constant, FillConstantKernel, float, double, int32_t, int64_t, bool,
                     bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, fill_zeros_like, FillZerosLikeKernel, float, double, int32_t, int64_t,
                     bool, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, uniform_random, UniformRandomKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, gaussian_random, GaussianRandomKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, cast, CastKernel, float, double, int32_t, int64_t, bool, uint8_t, int8_t,
                     bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, cast_grad, CastGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, reshape, CopyKernel, float, double, int32_t, int64_t, bool, uint8_t,
                     int8_t, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, reshape_grad, CopyGradKernel, float, double, bfloat16, float16);

}  // namespace keel
