// coalesce_tensor on CUDA: the kernel is fuse_ops.h's (the host fallback could not do its work:
// it would copy results back into each var's own allocation, and the views would be lost). Here:
// copying an input into its slot on the compute stream.
#include "ops/cuda_util.cuh"
#include "ops/fuse_ops.h"

namespace keel {

template <>
struct CoalesceMath<CUDADevice> {
  static void CopyIn(const ExecutionContext& ctx, size_t i, const Tensor& in, char* slot,
                     size_t bytes) {
    KEEL_ENFORCE(in.place() == ctx.place(), "copy_data: Input[", i, "] '",
                 ctx.op().Input("Input")[i], "' is on ", in.place().str(), ", not ",
                 ctx.place().str());
    const char* src = static_cast<const char*>(in.raw_data());
    if (src == slot) return;
    cudaStream_t stream = Cuda(ctx).stream();
    // An input that already lies in this buffer at another offset overlaps its slot: stage it
    // through a temporary (a device copy between overlapping ranges is undefined).
    const bool overlaps = src < slot + bytes && slot < src + bytes;
    if (overlaps) {
      Tensor tmp = in.Clone();
      KEEL_CUDA_CHECK(
          cudaMemcpyAsync(slot, tmp.raw_data(), bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
      KEEL_CUDA_CHECK(cudaMemcpyAsync(slot, src, bytes, cudaMemcpyDeviceToDevice, stream));
    }
  }
};

KEEL_REGISTER_KERNEL(CUDA, coalesce_tensor, CoalesceKernelT, float, double, int32_t, int64_t,
                     float16, bfloat16);

}  // namespace keel
