#include "framework/runtime/allocator.h"

#include <gflags/gflags.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "framework/error.h"

DEFINE_bool(init_allocated_mem, false,
            "Fill every new tensor allocation, on CPU and CUDA places, with 0xFF bytes (NaN for "
            "floats, -1 for integers) before a kernel writes it, as Paddle's flag of that name: a "
            "kernel that leaves part of an output unwritten shows up as NaN. For debugging and "
            "tests; costs a memset per allocation.");

namespace keel {

#ifdef KEEL_WITH_CUDA
void* CudaMalloc(int device, size_t size);  // cuda_runtime.cc
void CudaFree(int device, void* p);
void CudaMemCopy(const Place& dst_place, void* dst, const Place& src_place, const void* src,
                 size_t size);
#endif

Allocation::~Allocation() {
  if (!ptr_) return;
  if (place_.is_cpu()) {
    std::free(ptr_);
  } else {
#ifdef KEEL_WITH_CUDA
    CudaFree(place_.device, ptr_);
#endif
  }
}

std::shared_ptr<Allocation> Allocate(const Place& place, size_t size) {
  if (place.is_cpu()) {
    // More than the machine has would only succeed on overcommit and die in the OOM killer when
    // touched (a crafted or mistaken shape): refuse it here.
    static const uint64_t kPhysical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                                      static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
    KEEL_ENFORCE(kPhysical == 0 || size <= kPhysical, "allocating ", size,
                 " bytes of CPU memory: more than this machine's ", kPhysical, " bytes");
    size_t rounded = (size + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (rounded == 0) rounded = kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    KEEL_ENFORCE(p != nullptr, "out of CPU memory allocating ", size, " bytes");
    if (FLAGS_init_allocated_mem) std::memset(p, 0xFF, rounded);
    return std::make_shared<Allocation>(p, size, place);
  }
#ifdef KEEL_WITH_CUDA
  return std::make_shared<Allocation>(CudaMalloc(place.device, size), size, place);
#else
  KEEL_THROW("cannot allocate on ", place.str(), ": this keel was built without CUDA");
#endif
}

void MemCopy(const Place& dst_place, void* dst, const Place& src_place, const void* src,
             size_t size) {
  if (size == 0) return;
  if (dst_place.is_cpu() && src_place.is_cpu()) {
    std::memcpy(dst, src, size);
    return;
  }
#ifdef KEEL_WITH_CUDA
  CudaMemCopy(dst_place, dst, src_place, src, size);
#else
  KEEL_THROW("copy between ", src_place.str(), " and ", dst_place.str(),
             " needs a CUDA build of keel");
#endif
}

#ifndef KEEL_WITH_CUDA
bool CudaAvailable() { return false; }
int CudaDeviceCount() { return 0; }
#endif

}  // namespace keel
