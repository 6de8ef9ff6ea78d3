// libkeel_cuda's CudaBackend (framework/runtime/cuda_backend.h), registered as the library is
// opened. Tensor memory on CUDA places comes from the device's caching allocator; copies run on
// its compute stream.
#include <cuda_runtime.h>
#include <gflags/gflags.h>

#include <cstring>
#include <memory>
#include <string>

#include "framework/error.h"
#include "framework/runtime/allocator.h"
#include "framework/runtime/cuda_backend.h"
#include "framework/runtime/cuda_context.h"
#include "framework/runtime/device.h"

DECLARE_bool(init_allocated_mem);

namespace keel {
namespace cuda {

// cuda_context.cc and cuda_graph.cc.
void DeviceSynchronize(const Place& place);
AllocatorStats DeviceAllocatorStats(const Place& place);
void DeviceResetPeakStats(const Place& place);
void DeviceEmptyCache(const Place& place);
int64_t DeviceMallocCount();
std::string DeviceUuid(const Place& place);
void* DeviceEventCreate(const Place& place);
void DeviceEventDestroy(const Place& place, void* event);
void DeviceEventRecord(const Place& place, void* event, void* stream);
void DeviceStreamWaitEvent(const Place& place, void* stream, void* event);
bool DeviceEventDone(const Place& place, void* event);
void DeviceCopyOnStreamAfterCompute(const Place& place, void* dst, const void* src, size_t size,
                                    void* stream);
void CopyHostToDeviceAsync(const Place& dst_place, void* dst, const void* src, size_t size);
std::unique_ptr<CudaGraph> NewCudaGraph(const Place& place);

namespace {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

void* CudaMalloc(int device, size_t size) {
  CudaContext& c = CudaContext::Get(device);
  void* p = c.allocator().Allocate(size, c.stream());
  // Poisoned in stream order: before any kernel queued after this allocation writes it.
  if (FLAGS_init_allocated_mem && size > 0)
    KEEL_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, size, c.stream()));
  return p;
}

void CudaFree(int device, void* p) { CudaContext::Get(device).allocator().Free(p); }

// Host <-> device copies go through pinned staging on the device's compute stream, so they are
// ordered with the kernels there. Device -> host waits (the caller reads the result at once);
// host -> device and device -> device do not.
void CudaMemCopy(const Place& dst_place, void* dst, const Place& src_place, const void* src,
                 size_t size) {
  if (dst_place.is_cuda() && src_place.is_cpu()) {
    cuda::CopyHostToDeviceAsync(dst_place, dst, src, size);
    return;
  }
  if (dst_place.is_cpu() && src_place.is_cuda()) {
    CudaContext& c = CudaContext::Get(src_place.device);
    void* staging = c.StagingBuffer(size);
    KEEL_CUDA_CHECK(cudaMemcpyAsync(staging, src, size, cudaMemcpyDeviceToHost, c.stream()));
    KEEL_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    std::memcpy(dst, staging, size);
    c.DoneWithStaging(staging);
    return;
  }
  CudaContext& d = CudaContext::Get(dst_place.device);
  if (src_place.device == dst_place.device) {
    KEEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, size, cudaMemcpyDeviceToDevice, d.stream()));
    return;
  }
  // Between two devices: the source's queued work first, then a peer copy on the destination.
  KEEL_CUDA_CHECK(cudaStreamSynchronize(CudaContext::Get(src_place.device).stream()));
  CudaContext::Get(dst_place.device);  // the calling thread's device back to the destination
  KEEL_CUDA_CHECK(
      cudaMemcpyPeerAsync(dst, dst_place.device, src, src_place.device, size, d.stream()));
}

class Backend final : public CudaBackend {
 public:
  int DeviceCount() override { return cuda::DeviceCount(); }
  void* Malloc(int device, size_t size) override { return cuda::CudaMalloc(device, size); }
  void Free(int device, void* p) override { cuda::CudaFree(device, p); }
  void MemCopy(const Place& dst_place, void* dst, const Place& src_place, const void* src,
               size_t size) override {
    cuda::CudaMemCopy(dst_place, dst, src_place, src, size);
  }
  void Synchronize(const Place& place) override { cuda::DeviceSynchronize(place); }
  AllocatorStats Stats(const Place& place) override { return cuda::DeviceAllocatorStats(place); }
  void ResetPeakStats(const Place& place) override { cuda::DeviceResetPeakStats(place); }
  void EmptyCache(const Place& place) override { cuda::DeviceEmptyCache(place); }
  int64_t MallocCount() override { return cuda::DeviceMallocCount(); }
  void CopyHostToDeviceAsync(const Place& dst_place, void* dst, const void* src,
                             size_t size) override {
    cuda::CopyHostToDeviceAsync(dst_place, dst, src, size);
  }
  std::string Uuid(const Place& place) override { return cuda::DeviceUuid(place); }
  void* EventCreate(const Place& place) override { return cuda::DeviceEventCreate(place); }
  void EventDestroy(const Place& place, void* event) override {
    cuda::DeviceEventDestroy(place, event);
  }
  void EventRecord(const Place& place, void* event, void* stream) override {
    cuda::DeviceEventRecord(place, event, stream);
  }
  void StreamWaitEvent(const Place& place, void* stream, void* event) override {
    cuda::DeviceStreamWaitEvent(place, stream, event);
  }
  bool EventDone(const Place& place, void* event) override {
    return cuda::DeviceEventDone(place, event);
  }
  void CopyOnStreamAfterCompute(const Place& place, void* dst, const void* src, size_t size,
                                void* stream) override {
    cuda::DeviceCopyOnStreamAfterCompute(place, dst, src, size, stream);
  }
  std::unique_ptr<CudaGraph> NewGraph(const Place& place) override {
    return cuda::NewCudaGraph(place);
  }
};

// Registered as libkeel_cuda is opened (or, in a program linked with it, at start).
const bool g_registered = [] {
  static Backend backend;
  RegisterCudaBackend(&backend);
  return true;
}();

}  // namespace
}  // namespace cuda
}  // namespace keel
