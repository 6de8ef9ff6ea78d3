// CudaContext: what kernels on one CUDA device share. Included only by .cu files and CUDA-only
// .cc files (it needs the CUDA headers).
//
// Per device: a non-blocking compute stream every kernel and copy of the executor runs on, cuBLAS
// and cuDNN handles bound to that stream (cuDNN made on first use: its init costs time and
// memory), the caching allocator (its reserve from FLAGS_fraction_of_gpu_memory_to_use), a
// growable workspace for cuDNN and a pinned host staging ring for feeds and fetches.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "framework/error.h"
#include "framework/runtime/caching_allocator.h"

namespace keel {

[[noreturn]] void ThrowCudaError(const char* what, const char* detail, const char* file, int line);

// Checks a CUDA runtime / cuBLAS / cuDNN status; throws keel::Error naming the call.
#define KEEL_CUDA_CHECK(call)                                                         \
  do {                                                                                \
    cudaError_t keel_e_ = (call);                                                     \
    if (keel_e_ != cudaSuccess)                                                       \
      ::keel::ThrowCudaError(#call, cudaGetErrorString(keel_e_), __FILE__, __LINE__); \
  } while (0)
#define KEEL_CUBLAS_CHECK(call)                                                          \
  do {                                                                                   \
    cublasStatus_t keel_s_ = (call);                                                     \
    if (keel_s_ != CUBLAS_STATUS_SUCCESS)                                                \
      ::keel::ThrowCudaError(#call, cublasGetStatusString(keel_s_), __FILE__, __LINE__); \
  } while (0)
#define KEEL_CUDNN_CHECK(call)                                                         \
  do {                                                                                 \
    cudnnStatus_t keel_s_ = (call);                                                    \
    if (keel_s_ != CUDNN_STATUS_SUCCESS)                                               \
      ::keel::ThrowCudaError(#call, cudnnGetErrorString(keel_s_), __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: a bad launch configuration shows up here, not at the next sync.
#define KEEL_CUDA_LAUNCH_CHECK() KEEL_CUDA_CHECK(cudaGetLastError())

class CudaContext {
 public:
  // The context of `device`, created on first use (sets up stream, handles and allocator).
  static CudaContext& Get(int device);

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudnnHandle_t cudnn();
  CachingAllocator& allocator() { return *allocator_; }
  // TF32 in cuBLAS/cuDNN float32 math (FLAGS_allow_tf32, off by default).
  bool allow_tf32() const { return allow_tf32_; }

  // Device scratch of at least `bytes` for work on the compute stream (cuDNN workspaces). Valid
  // until the next call; stream order makes reuse by the next kernel safe.
  void* Workspace(size_t bytes);

  // Pinned host memory of at least `bytes` for one staged copy on the compute stream. The buffer
  // is not handed out again until the copy queued after it (marked by DoneWithStaging) finished.
  void* StagingBuffer(size_t bytes);
  void DoneWithStaging(void* buffer);

  // CUDA graph capture on this device (CudaGraph). Meanwhile staging buffers are new ones that
  // belong to the graph (each replay copies from them again; EndCapture hands them over, to be
  // freed after the graph's last replay), and a workspace that grows keeps the old block alive
  // (graphs captured earlier may use it).
  void BeginCapture();
  std::vector<void*> EndCapture();
  // CUDA graphs alive on this device (CudaGraph's constructor and destructor): while any is, a
  // workspace that grows keeps its old block (a graph may replay with it) until the last goes.
  void GraphCreated();
  void GraphDestroyed();

  ~CudaContext();

 private:
  explicit CudaContext(int device);
  struct Staging;

  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::once_flag cudnn_once_;
  std::unique_ptr<CachingAllocator> allocator_;
  bool allow_tf32_ = false;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::mutex staging_mu_;
  std::unique_ptr<Staging> staging_;
  bool capturing_ = false;
  std::vector<void*> capture_staging_;
  std::vector<void*> retired_workspaces_;
  int live_graphs_ = 0;
  void* cublas_workspace_ = nullptr;
};

// Grid size for a 1-D kernel over n elements with `threads` per block (grid-stride loops cover
// the rest).
inline unsigned GridFor(int64_t n, int threads = 256) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks > 65535 * 8 ? 65535 * 8 : blocks);
}

}  // namespace keel
