// What the CUDA op files share: the device context of a kernel's place, a grid-stride launch of
// a device lambda over n indices, and block-wide sums. Kernels favour one obvious thread-per-
// element (or per-row) mapping over cleverness; cuBLAS and cuDNN carry the heavy math.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/cuda_context.h"
#include "ops/axis_layout.h"

namespace keel {

inline CudaContext& Cuda(const ExecutionContext& ctx) {
  return CudaContext::Get(ctx.place().device);
}

template <typename F>
__global__ void ForEachKernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(blockDim.x) * gridDim.x)
    f(i);
}

// f(i) for i in [0, n) on the context's stream; no synchronisation.
template <typename F>
void ForEach(const ExecutionContext& ctx, int64_t n, F f) {
  if (n <= 0) return;
  ForEachKernel<<<GridFor(n), 256, 0, Cuda(ctx).stream()>>>(n, f);
  KEEL_CUDA_LAUNCH_CHECK();
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
template <typename T>
__device__ T BlockSum(T v) {
  __shared__ T partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // partial may still be read from a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? partial[lane] : T(0);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T>
__device__ T BlockMax(T v) {
  __shared__ T partial[32];
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? partial[lane] : partial[0];
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}


// Bad input a kernel finds on the device (a label or id out of range): the kernel records the
// first (value, index) in mapped pinned host memory, and the host reads it back without
// synchronising. The op's next run throws it as a keel::Error (device errors surface
// asynchronously, as CUDA's own do); the output of the bad row is NaN (or zeros) meanwhile.
struct DeviceReport {
  int state;  // 0: none; 1: being written; 2: written
  long long value, index;
};

__device__ inline void Report(DeviceReport* r, long long value, long long index) {
  if (atomicCAS(&r->state, 0, 1) != 0) return;  // the first report wins
  r->value = value;
  r->index = index;
  __threadfence_system();
  atomicExch(&r->state, 2);
}

// Allocated on the first launch that reports into it, on the launching op's device (a kernel is
// constructed before its device is current, and a context on device 0 would cost every rank).
class DeviceReportSlot {
 public:
  DeviceReportSlot() = default;
  ~DeviceReportSlot() {
    if (host_ != nullptr) cudaFreeHost(host_);
  }
  DeviceReportSlot(const DeviceReportSlot&) = delete;
  DeviceReportSlot& operator=(const DeviceReportSlot&) = delete;

  // The slot for a kernel launched on ctx's place.
  DeviceReport* device(const ExecutionContext& ctx) {
    if (host_ == nullptr) {
      Cuda(ctx);  // the place's device is current
      KEEL_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof(DeviceReport),
                                    cudaHostAllocMapped | cudaHostAllocPortable));
      host_->state = 0;
      KEEL_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
    }
    return device_;
  }
  // Calls on_report(value, index) (which throws) when a kernel has reported; clears the slot.
  template <typename F>
  void Check(F on_report) {
    if (host_ == nullptr || reinterpret_cast<volatile DeviceReport*>(host_)->state != 2) return;
    const long long value = host_->value, index = host_->index;
    host_->state = 0;
    on_report(value, index);
  }

 private:
  DeviceReport* host_ = nullptr;
  DeviceReport* device_ = nullptr;
};

// Copies n elements on the stream unless src and dst are the same memory.
template <typename T>
void CopyOnStream(const ExecutionContext& ctx, const T* src, T* dst, int64_t n) {
  if (src == dst || n == 0) return;
  KEEL_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, Cuda(ctx).stream()));
}

// Out = X's elements in Out's shape (reshape, flatten, squeeze, unsqueeze, assign): a copy on the
// stream, none when they share memory. Named apart from op_util.h's CPU CopyKernel: two classes of
// one name in one library are one class to the linker, which gave the CUDA registrations the CPU's
// host-side copy of device memory (a SIGSEGV on the first GPU run; tests/cmake/odr_check.sh).
template <typename T>
class CudaCopyKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    Tensor* out = ctx.Output("Out");
    KEEL_ENFORCE(x.numel() == out->numel(), "cannot copy ", x.dims().str(), " into ",
                 out->dims().str());
    CopyOnStream(ctx, x.data<T>(), out->mutable_data<T>(ctx.place()), x.numel());
  }
};

// X@GRAD = Out@GRAD's elements in X's shape.
template <typename T>
class CudaCopyGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(dout.numel() == dx->numel(), "cannot copy ", dout.dims().str(), " into ",
                 dx->dims().str());
    CopyOnStream(ctx, dout.data<T>(), dx->mutable_data<T>(ctx.place()), dout.numel());
  }
};

}  // namespace keel
