// What the CUDA op files share: the device context of a kernel's place, a grid-stride launch of
// a device lambda over n indices, and block-wide sums. Kernels favour one obvious thread-per-
// element (or per-row) mapping over cleverness; cuBLAS and cuDNN carry the heavy math.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/cuda_context.h"
#include "framework/runtime/device.h"
#include "ops/axis_layout.h"
#include "ops/device.h"
#include "ops/functors/elementwise_functors.h"

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
// first (value, index) in mapped pinned host memory (a DeviceReport, ops/device.h), and the host
// reads it back without synchronising. The op's next run throws it as a keel::Error (device errors
// surface asynchronously, as CUDA's own do); the output of the bad row is NaN (or zeros)
// meanwhile.

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

// A one-element float32/float64 tensor in device memory, read by device code as double.
struct DeviceScalar {
  const void* p;
  bool is_double;
  __device__ double Get() const {
    return is_double ? *static_cast<const double*>(p) : *static_cast<const float*>(p);
  }
};

// out[j] = sum over t < pre * post of f((i * n + j) * post + k, j), t = (i, k), in order: one
// thread per j (for short sums; SumBroadcastKernel below takes a block per j for long ones).
template <typename T, typename F>
__global__ void SumBroadcastPerThread(fn::BroadcastMid m, T* out, F f) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < m.n;
       j += int64_t(blockDim.x) * gridDim.x) {
    Acc<T> acc = 0;
    for (int64_t i = 0; i < m.pre; ++i)
      for (int64_t k = 0; k < m.post; ++k) acc += f((i * m.n + j) * m.post + k, j);
    out[j] = Narrow<T>(acc);
  }
}

// out[j] = sum over t < pre * post of f((i * n + j) * post + k, j), t = (i, k): one block per j.
// The sum is Acc<T> (float32 for the 16-bit types), rounded to T once.
template <typename T, typename F>
__global__ void SumBroadcastKernel(fn::BroadcastMid m, T* out, F f) {
  const int64_t j = blockIdx.x;
  Acc<T> acc = 0;
  for (int64_t t = threadIdx.x; t < m.pre * m.post; t += blockDim.x) {
    const int64_t i = t / m.post, k = t % m.post;
    acc += f((i * m.n + j) * m.post + k, j);
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) out[j] = Narrow<T>(acc);
}

// The device vocabulary on CUDA (ops/device.h lists it): launches on the context's stream, no
// synchronisation.
template <>
struct Device<CUDADevice> {
  template <typename F>
  static void ForEach(const ExecutionContext& ctx, int64_t n, F f) {
    keel::ForEach(ctx, n, f);
  }
  template <typename F>
  static void ForEachInPieces(const ExecutionContext& ctx, int64_t n, int64_t, F f) {
    keel::ForEach(ctx, n, f);
  }
  template <typename F>
  static void ForEachBroadcast(const ExecutionContext& ctx, const fn::BroadcastMid& m, F f) {
    keel::ForEach(ctx, m.pre * m.n * m.post, [=] __device__(int64_t i) { f(i, m.YIndex(i)); });
  }
  template <typename T, typename F>
  static void SumBroadcast(const ExecutionContext& ctx, const fn::BroadcastMid& m, T* out, F f) {
    if (m.n == 0) return;
    // A thread per element of Y where each sums few terms (a same-shape gradient: one; a bias
    // over a few rows), or where Y alone fills the GPU; a block per element otherwise. (A block
    // per element of a same-shape gradient, ResNet's residual adds, took 0.93 ms for 2 M floats
    // on an H200, where a thread each takes a few microseconds.)
    const int64_t terms = m.pre * m.post;
    if (terms <= 64 || (m.n >= 16384 && terms <= 1024)) {
      SumBroadcastPerThread<T><<<GridFor(m.n), 256, 0, Cuda(ctx).stream()>>>(m, out, f);
    } else {
      KEEL_ENFORCE(m.n < (int64_t(1) << 31), ctx.op().type(), ": Y of ", m.n,
                   " elements exceeds one launch (one block per element of Y)");
      SumBroadcastKernel<T><<<m.n, 256, 0, Cuda(ctx).stream()>>>(m, out, f);
    }
    KEEL_CUDA_LAUNCH_CHECK();
  }

  template <typename T>
  static void Fill(const ExecutionContext& ctx, T* p, int64_t n, T v) {
    keel::ForEach(ctx, n, [=] __device__(int64_t i) { p[i] = v; });
  }
  template <typename T>
  static void Zero(const ExecutionContext& ctx, T* p, int64_t n) {
    if (n > 0) KEEL_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(T), Cuda(ctx).stream()));
  }
  template <typename T>
  static void Copy(const ExecutionContext& ctx, const T* src, T* dst, int64_t n) {
    CopyOnStream(ctx, src, dst, n);
  }
  template <typename T>
  static void CopyRows(const ExecutionContext& ctx, const T* src, int64_t src_stride, T* dst,
                       int64_t dst_stride, int64_t rows, int64_t width) {
    if (rows <= 0 || width <= 0) return;
    if (rows == 1) {  // one contiguous run (any size)
      KEEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, width * sizeof(T), cudaMemcpyDeviceToDevice,
                                      Cuda(ctx).stream()));
      return;
    }
    KEEL_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_stride * sizeof(T), src, src_stride * sizeof(T),
                                      width * sizeof(T), rows, cudaMemcpyDeviceToDevice,
                                      Cuda(ctx).stream()));
  }

  // Staged through `host`, copied without waiting.
  template <typename T, typename F>
  static void FromHost(const ExecutionContext& ctx, T* dst, int64_t n, std::vector<T>* host,
                       const F& fill) {
    host->resize(n);
    fill(host->data(), n);
    if (n > 0) CopyHostToDeviceAsync(ctx.place(), dst, host->data(), n * sizeof(T));
  }

  // Into `keep` (grown as needed), copied without waiting.
  static const void* Upload(const ExecutionContext& ctx, const void* host, size_t bytes,
                            Tensor* keep) {
    const int64_t n = static_cast<int64_t>(bytes);
    if (!keep->initialized() || keep->numel() < n) keep->Alloc(DType::kUInt8, DDim{n}, ctx.place());
    if (bytes > 0) CopyHostToDeviceAsync(ctx.place(), keep->raw_data(), host, bytes);
    return keep->raw_data();
  }

  // Column-major cuBLAS computes C' = op(B)' op(A)', so the operands swap; TF32 only with
  // FLAGS_allow_tf32 (the context's cuBLAS handle). 16-bit A and B: cublasGemmStridedBatchedEx
  // with float32 compute (Tensor Cores), C of A's type or float32.
  template <typename T, typename TC>
  static void Gemm(const ExecutionContext& ctx, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   Acc<T> alpha, const T* A, int64_t sa, const T* B, int64_t sb, Acc<T> beta, TC* C,
                   int64_t sc, int64_t batch = 1);

  // The product into a scratch, then added: what the CPU's GemmAdd computes (the product rounded
  // to T before the addition).
  template <typename T>
  static void GemmAdd(const ExecutionContext& ctx, bool ta, bool tb, int64_t M, int64_t N,
                      int64_t K, Acc<T> alpha, const T* A, const T* B, T* C) {
    if (M == 0 || N == 0 || K == 0) return;  // an empty product adds nothing
    const int64_t n = M * N;
    Tensor scratch;
    T* p = static_cast<T*>(scratch.Alloc(DTypeOf<T>::value, DDim{n}, ctx.place()));
    Gemm(ctx, ta, tb, M, N, K, alpha, A, 0, B, 0, Acc<T>(0), p, 0);
    keel::ForEach(ctx, n,
                  [=] __device__(int64_t i) { C[i] = Narrow<T>(Widen(C[i]) + Widen(p[i])); });
  }

  using Scalar = DeviceScalar;
  static Scalar ScalarOf(const Tensor& t) {
    KEEL_ENFORCE(t.numel() == 1, "expected one element, got ", t.dims().str());
    return DeviceScalar{t.raw_data(), t.dtype() == DType::kFloat64};
  }

  using Reports = DeviceReportSlot;
};

// The cuBLAS data type of a 16-bit element type.
template <typename T>
constexpr cudaDataType_t CublasType() {
  static_assert(kIsHalf<T> || std::is_same_v<T, float>, "a 16-bit type or float");
  return std::is_same_v<T, bfloat16>  ? CUDA_R_16BF
         : std::is_same_v<T, float16> ? CUDA_R_16F
                                      : CUDA_R_32F;
}

template <typename T, typename TC>
void Device<CUDADevice>::Gemm(const ExecutionContext& ctx, bool ta, bool tb, int64_t M, int64_t N,
                              int64_t K, Acc<T> alpha, const T* A, int64_t sa, const T* B,
                              int64_t sb, Acc<T> beta, TC* C, int64_t sc, int64_t batch) {
  static_assert(std::is_same_v<TC, T> || (kIsHalf<T> && std::is_same_v<TC, float>) ||
                    (std::is_same_v<T, float> && kIsHalf<TC>),
                "C is of A's type, float32 for 16-bit A and B, or 16-bit for float32 A and B");
  if (M == 0 || N == 0 || batch == 0) return;
  if constexpr (std::is_same_v<T, float> && kIsHalf<TC>) {
    // A narrowed output (OpTraits::narrows_outputs): cuBLAS has no float32 GEMM with a 16-bit C,
    // so the float32 GEMM writes a scratch and one pass rounds it into C.
    KEEL_ENFORCE(beta == 0.0f, ctx.op().type(),
                 ": a GEMM from float32 operands into a 16-bit C does not read C (beta must be 0, "
                 "got ",
                 beta, ")");
    KEEL_ENFORCE(batch == 1 || sc == M * N, ctx.op().type(),
                 ": a 16-bit C of a batched float32 GEMM must be contiguous");
    const int64_t n = batch * M * N;
    Tensor scratch;
    float* c32 = static_cast<float*>(scratch.Alloc(DType::kFloat32, DDim{n}, ctx.place()));
    Gemm(ctx, ta, tb, M, N, K, alpha, A, sa, B, sb, 0.0f, c32, M * N, batch);
    keel::ForEach(ctx, n, [=] __device__(int64_t i) { C[i] = Narrow<TC>(c32[i]); });
    return;
  }
  if (K == 0) {  // C = beta * C; cuBLAS would refuse the zero leading dimension of A or B
    KEEL_ENFORCE(beta == Acc<T>(0) || beta == Acc<T>(1), "Gemm with K == 0 and beta ", beta);
    if (beta == Acc<T>(0)) {
      const int64_t blocks = sc == 0 ? 1 : batch;
      for (int64_t b = 0; b < blocks; ++b) Zero(ctx, C + b * sc, M * N);
    }
    return;
  }
  KEEL_ENFORCE(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && batch <= INT_MAX, "GEMM of ", M,
               " x ", N, " x ", K, " (batch ", batch, ") exceeds cuBLAS's 32-bit sizes");
  cublasHandle_t h = Cuda(ctx).cublas();
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = static_cast<int>(ta ? M : K), ldb = static_cast<int>(tb ? K : N);
  if constexpr (kIsHalf<T>) {
    KEEL_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, opb, opa, int(N), int(M), int(K), &alpha, B, CublasType<T>(), ldb, sb, A,
        CublasType<T>(), lda, sa, &beta, C, CublasType<TC>(), int(N), sc, int(batch),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else if constexpr (std::is_same_v<T, float> && std::is_same_v<TC, float>) {
    KEEL_CUBLAS_CHECK(cublasSgemmStridedBatched(h, opb, opa, int(N), int(M), int(K), &alpha, B, ldb,
                                                sb, A, lda, sa, &beta, C, int(N), sc, int(batch)));
  } else if constexpr (std::is_same_v<T, double>) {
    KEEL_CUBLAS_CHECK(cublasDgemmStridedBatched(h, opb, opa, int(N), int(M), int(K), &alpha, B, ldb,
                                                sb, A, lda, sa, &beta, C, int(N), sc, int(batch)));
  }
}

}  // namespace keel
