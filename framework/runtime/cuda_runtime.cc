// Tensor memory on CUDA places: allocations come from the device's caching allocator, copies run
// on its compute stream. Compiled only when KEEL_WITH_CUDA.
#include <cuda_runtime.h>
#include <gflags/gflags.h>

#include <cstring>

#include "framework/error.h"
#include "framework/runtime/allocator.h"
#include "framework/runtime/cuda_context.h"
#include "framework/runtime/device.h"

DECLARE_bool(init_allocated_mem);

namespace keel {

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

bool CudaAvailable() { return CudaDeviceCount() > 0; }

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
    CopyHostToDeviceAsync(dst_place, dst, src, size);
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

}  // namespace keel
