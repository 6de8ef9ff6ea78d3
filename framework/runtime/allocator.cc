#include "framework/runtime/allocator.h"

#include <gflags/gflags.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "framework/error.h"
#include "framework/runtime/caching_allocator.h"
#include "framework/runtime/cuda_backend.h"

DEFINE_bool(init_allocated_mem, false,
            "Fill every new tensor allocation, on CPU and CUDA places, with 0xFF bytes (NaN for "
            "floats, -1 for integers) before a kernel writes it, as Paddle's flag of that name: a "
            "kernel that leaves part of an output unwritten shows up as NaN. For debugging and "
            "tests; costs a memset per allocation.");

DEFINE_string(cpu_allocator, "caching",
              "How CPU tensors get memory: caching (segments of 2 MiB multiples, backed by huge "
              "pages where the kernel allows, are kept and reused block by block, so a training "
              "step neither maps nor faults in memory; returned at a scope drop) or system "
              "(aligned_alloc and free per tensor, for memory checkers such as valgrind).");

namespace keel {

namespace {

// The host behind the CPU caching allocator: segments are 2 MiB-aligned so transparent huge
// pages can back them (madvise mode is the common default), and there are no streams or events:
// a CPU tensor is freed only after every kernel that used it has returned.
class HostMemory : public DeviceMemory {
 public:
  void* Malloc(size_t bytes) override {
    void* p = nullptr;
    if (posix_memalign(&p, kSegmentAlignment, bytes) != 0) return nullptr;
    madvise(p, bytes, MADV_HUGEPAGE);  // a hint: without THP the pages stay small
    return p;
  }
  void Free(void* ptr) override { std::free(ptr); }
  size_t TotalBytes() const override { return PhysicalBytes(); }
  Event RecordEvent(Stream) override { return nullptr; }
  bool EventDone(Event) override { return true; }
  void DestroyEvent(Event) override {}
  std::string Name() const override { return "CPUPlace"; }
  std::string OutOfMemoryAdvice() const override {
    return "free memory on this machine, use a smaller batch, or keep "
           "FLAGS_eager_delete_tensor_gb at 0 so temporaries are freed as soon as they are dead";
  }
  static constexpr size_t kSegmentAlignment = 2 << 20;
};

bool UseCachingCpuAllocator() {
  if (FLAGS_cpu_allocator == "caching") return true;
  KEEL_ENFORCE(FLAGS_cpu_allocator == "system", "--cpu_allocator=", FLAGS_cpu_allocator,
               ": expected caching or system");
  return false;
}

// Never destroyed: tensors in static storage may outlive any destruction order.
CachingAllocator& CpuCache() {
  static auto* cache = new CachingAllocator(std::make_unique<HostMemory>());
  return *cache;
}

}  // namespace

uint64_t PhysicalBytes() {
  static const uint64_t bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                                static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  return bytes;
}

AllocatorStats CpuAllocatorStats() { return CpuCache().stats(); }

void CpuAllocatorEmptyCache() { CpuCache().EmptyCache(); }

void CpuAllocatorResetPeak() { CpuCache().ResetPeak(); }

std::shared_ptr<Allocation> Allocation::External(void* ptr, size_t size, Place place,
                                                 std::function<void()> release) {
  auto a = std::make_shared<Allocation>(ptr, size, place);
  a->release_ = std::move(release);
  return a;
}

Allocation::~Allocation() {
  if (!ptr_) return;
  if (release_) {
    release_();
  } else if (place_.is_cpu()) {
    if (cached_)
      CpuCache().Free(ptr_);
    else
      std::free(ptr_);
  } else if (CudaBackend* b = GetCudaBackend()) {
    b->Free(place_.device, ptr_);
  }
}

std::shared_ptr<Allocation> Allocate(const Place& place, size_t size) {
  if (place.is_cpu()) {
    // More than the machine has would only succeed on overcommit and die in the OOM killer when
    // touched (a crafted or mistaken shape): refuse it here.
    const uint64_t physical = PhysicalBytes();
    KEEL_ENFORCE(physical == 0 || size <= physical, "allocating ", size,
                 " bytes of CPU memory: more than this machine's ", physical, " bytes");
    size_t rounded = (size + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (rounded == 0) rounded = kCpuAlignment;
    const bool cached = UseCachingCpuAllocator();
    // The cache's blocks are multiples of 512 bytes inside 2 MiB-aligned segments.
    void* p =
        cached ? CpuCache().Allocate(rounded, nullptr) : std::aligned_alloc(kCpuAlignment, rounded);
    KEEL_ENFORCE(p != nullptr, "out of CPU memory allocating ", size, " bytes");
    if (FLAGS_init_allocated_mem) std::memset(p, 0xFF, rounded);
    auto a = std::make_shared<Allocation>(p, size, place);
    a->cached_ = cached;
    return a;
  }
  return std::make_shared<Allocation>(CudaBackendFor(place).Malloc(place.device, size), size,
                                      place);
}

void MemCopy(const Place& dst_place, void* dst, const Place& src_place, const void* src,
             size_t size) {
  if (size == 0) return;
  if (dst_place.is_cpu() && src_place.is_cpu()) {
    std::memcpy(dst, src, size);
    return;
  }
  CudaBackendFor(dst_place.is_cuda() ? dst_place : src_place)
      .MemCopy(dst_place, dst, src_place, src, size);
}

int CudaDeviceCount() {
  CudaBackend* b = GetCudaBackend();
  return b ? b->DeviceCount() : 0;
}

bool CudaAvailable() { return CudaDeviceCount() > 0; }

}  // namespace keel
