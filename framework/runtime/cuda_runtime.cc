// CUDA memory and device queries; compiled only when KEEL_WITH_CUDA.
#include <cuda_runtime.h>

#include "framework/error.h"
#include "framework/runtime/allocator.h"

namespace keel {

namespace {
void CudaCheck(cudaError_t e, const char* what) {
  KEEL_ENFORCE(e == cudaSuccess, what, " failed: ", cudaGetErrorString(e));
}
}  // namespace

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
  CudaCheck(cudaSetDevice(device), "cudaSetDevice");
  void* p = nullptr;
  CudaCheck(cudaMalloc(&p, size == 0 ? 256 : size), "cudaMalloc");
  return p;
}

void CudaFree(int device, void* p) {
  cudaSetDevice(device);
  cudaFree(p);
}

void CudaMemCopy(const Place& dst_place, void* dst, const Place& src_place, const void* src,
                 size_t size) {
  cudaMemcpyKind kind = cudaMemcpyDefault;
  if (dst_place.is_cuda()) cudaSetDevice(dst_place.device);
  else if (src_place.is_cuda()) cudaSetDevice(src_place.device);
  CudaCheck(cudaMemcpy(dst, src, size, kind), "cudaMemcpy");
}

}  // namespace keel
