// GPU flags (defined in libkeel, so a machine without CUDA accepts the seed's FLAGS_
// environment), and device.h, which hands CUDA places to the CUDA backend.
#include "framework/runtime/device.h"

#include <gflags/gflags.h>

#include "framework/error.h"
#include "framework/runtime/cuda_backend.h"
#include "framework/runtime/cuda_graph.h"

DEFINE_double(fraction_of_gpu_memory_to_use, 0.0,
              "Fraction of each GPU's memory the caching allocator reserves up front, as Paddle "
              "does (0 allocates on demand; later needs grow the cache in either case).");
DEFINE_bool(allow_tf32, false,
            "Let cuBLAS and cuDNN use TF32 tensor cores for float32 matmul and conv (faster, about "
            "10 bits of mantissa); off: full float32.");
DEFINE_bool(cudnn_deterministic, false,
            "Only cuDNN convolution algorithms that give the same bits every run (Paddle's flag; "
            "some of the fastest accumulate with atomics).");
DEFINE_bool(cudnn_exhaustive_search, false,
            "Choose each convolution's cuDNN algorithm by timing them all once per shape "
            "(cudnnFind); false: cuDNN's heuristic ranking (Paddle's flag).");
DEFINE_int64(conv_workspace_size_limit, 512,
             "The most scratch memory, in MB, a cuDNN convolution algorithm may use (Paddle's "
             "flag); faster algorithms that need more are skipped.");

namespace keel {

// CUDA places go to the CUDA backend (libkeel_cuda, opened on first use); the CPU needs nothing.

void DeviceSynchronize(const Place& place) {
  if (place.is_cuda()) CudaBackendFor(place).Synchronize(place);
}
AllocatorStats DeviceAllocatorStats(const Place& place) {
  return place.is_cuda() ? CudaBackendFor(place).Stats(place) : AllocatorStats{};
}
void DeviceResetPeakStats(const Place& place) {
  if (place.is_cuda()) CudaBackendFor(place).ResetPeakStats(place);
}
void DeviceEmptyCache(const Place& place) {
  if (place.is_cuda()) CudaBackendFor(place).EmptyCache(place);
}
int64_t DeviceMallocCount() {
  CudaBackend* b = GetCudaBackend();
  return b ? b->MallocCount() : 0;
}
void CopyHostToDeviceAsync(const Place& dst_place, void* dst, const void* src, size_t size) {
  CudaBackendFor(dst_place).CopyHostToDeviceAsync(dst_place, dst, src, size);
}
std::string DeviceUuid(const Place& place) { return CudaBackendFor(place).Uuid(place); }
void* DeviceEventCreate(const Place& place) { return CudaBackendFor(place).EventCreate(place); }
void DeviceEventDestroy(const Place& place, void* event) {
  if (event != nullptr) CudaBackendFor(place).EventDestroy(place, event);
}
void DeviceEventRecord(const Place& place, void* event, void* stream) {
  CudaBackendFor(place).EventRecord(place, event, stream);
}
void DeviceStreamWaitEvent(const Place& place, void* stream, void* event) {
  CudaBackendFor(place).StreamWaitEvent(place, stream, event);
}
bool DeviceEventDone(const Place& place, void* event) {
  return CudaBackendFor(place).EventDone(place, event);
}
void DeviceCopyOnStreamAfterCompute(const Place& place, void* dst, const void* src, size_t size,
                                    void* stream) {
  CudaBackendFor(place).CopyOnStreamAfterCompute(place, dst, src, size, stream);
}

std::unique_ptr<CudaGraph> CudaGraph::Create(const Place& place) {
  KEEL_ENFORCE(place.is_cuda(), "a CUDA graph needs a CUDA place, not ", place.str());
  return CudaBackendFor(place).NewGraph(place);
}

}  // namespace keel
