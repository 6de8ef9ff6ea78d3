// The embedding lookup and layout ops on CUDA: the kernels are shape_ops.h's (joins and splits
// are strided 2-D copies, one per part), flatten's, squeeze's and unsqueeze's ops/device.h's.
// Here: lookup_table's math, which reports an id outside [0, V) instead of throwing, and
// transpose's, which maps each output element to its source through fn::TransposePlan (the CPU's
// bookkeeping, tested on the CPU).
#include <vector>

#include "ops/cuda_util.cuh"
#include "ops/functors/index_plans.h"
#include "ops/shape_ops.h"

namespace keel {
namespace {

// dW[v, d] = sum of dout[r, d] over rows r with ids[r] = v: one thread per column d walks the
// rows in order, so the sums are deterministic and in the CPU kernel's order.
// An id outside [0, V) is reported (by column 0's thread) and skipped.
template <typename T>
__global__ void LookupTableGradColumns(const int64_t* ids, const T* dout, T* dw, int64_t rows,
                                       int64_t V, int64_t D, int64_t pad, DeviceReport* report) {
  for (int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; d < D;
       d += int64_t(blockDim.x) * gridDim.x)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = ids[r];
      if (id == pad) continue;
      if (id < 0 || id >= V) {
        if (d == 0) Report(report, id, r);
        continue;
      }
      dw[id * D + d] += dout[r * D + d];
    }
}

}  // namespace

template <typename T>
struct LookupTableMath<CUDADevice, T> {
  // An id outside [0, V) is reported and its row is NaN.
  static void Lookup(const ExecutionContext& ctx, const Tensor& w, const Tensor& ids, int64_t pad,
                     T* op, DeviceReport* report) {
    const int64_t V = w.dims()[0], D = w.dims()[1], rows = ids.numel();
    const T* wp = w.data<T>();
    const int64_t* idp = ids.data<int64_t>();
    ForEach(ctx, rows * D, [=] __device__(int64_t k) {
      const int64_t r = k / D, d = k % D, id = idp[r];
      if (id == pad) {
        op[k] = T(0);
      } else if (id < 0 || id >= V) {
        if (d == 0) Report(report, id, r);
        op[k] = T(NAN);
      } else {
        op[k] = wp[id * D + d];
      }
    });
  }

  static void Grad(const ExecutionContext& ctx, const Tensor& ids, const T* dout, const DDim& wd,
                   int64_t pad, T* dw, DeviceReport* report) {
    const int64_t rows = ids.numel(), D = wd[1];
    if (rows == 0 || D == 0) return;
    LookupTableGradColumns<T><<<GridFor(D, 128), 128, 0, Cuda(ctx).stream()>>>(
        ids.data<int64_t>(), dout, dw, rows, wd[0], D, pad, report);
    KEEL_CUDA_LAUNCH_CHECK();
  }

  // Row-sparse gradients are a CPU feature so far (the optimizers read their rows on the host).
  static void SparseGrad(const ExecutionContext& ctx, const Tensor&, const T*, const DDim&, int64_t,
                         Tensor*, Variable*, DeviceReport*) {
    KEEL_THROW("lookup_table_grad: is_sparse=true has no ", ctx.place().str(),
               " kernel; train this embedding with is_sparse=false on a GPU");
  }
};

// out[o] = in[SrcIndex(o)].
template <typename T>
struct TransposeMath<CUDADevice, T> {
  static void Run(const ExecutionContext& ctx, const DDim& x, const std::vector<int>& perm,
                  const T* src, T* dst) {
    const fn::TransposePlan p = fn::MakeTransposePlan(x, perm);
    ForEach(ctx, x.numel(), [=] __device__(int64_t o) { dst[o] = src[p.SrcIndex(o)]; });
  }
};

KEEL_REGISTER_KERNEL(CUDA, lookup_table, LookupTableKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, lookup_table_grad, LookupTableGradKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, concat, ConcatKernel, float, double, int32_t, int64_t, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CUDA, concat_grad, ConcatGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, split, SplitKernel, float, double, int32_t, int64_t, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, transpose, TransposeKernel, float, double, int32_t, int64_t, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CUDA, transpose_grad, TransposeGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, flatten, CopyKernel, float, double, int32_t, int64_t, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, flatten_grad, CopyGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, unsqueeze, CopyKernel, float, double, int32_t, int64_t, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CUDA, unsqueeze_grad, CopyGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, squeeze, CopyKernel, float, double, int32_t, int64_t, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, squeeze_grad, CopyGradKernel, float, double, bfloat16, float16);

}  // namespace keel
