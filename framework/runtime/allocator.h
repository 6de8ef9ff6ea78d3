// Allocation: one owned block of device memory. Tensors share it through shared_ptr, so views,
// slices and (later) fused gradient buffers cost nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "framework/runtime/caching_allocator.h"
#include "framework/runtime/place.h"

namespace keel {

class Allocation {
 public:
  Allocation(void* ptr, size_t size, Place place) : ptr_(ptr), size_(size), place_(place) {}
  ~Allocation();
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  void* ptr() const { return ptr_; }
  size_t size() const { return size_; }
  const Place& place() const { return place_; }

  // Memory that another component owns (a block of a communicator's shared memory): `release`
  // gives it back when the last tensor sharing it lets go.
  static std::shared_ptr<Allocation> External(void* ptr, size_t size, Place place,
                                              std::function<void()> release);

 private:
  friend std::shared_ptr<Allocation> Allocate(const Place& place, size_t size);
  void* ptr_;
  size_t size_;
  Place place_;
  bool cached_ = false;            // CPU: a block of the caching allocator (else aligned_alloc's)
  std::function<void()> release_;  // set for External memory
};

constexpr size_t kCpuAlignment = 64;

// Allocates `size` bytes at `place`; CPU memory is 64-byte aligned. Throws keel::Error on failure.
std::shared_ptr<Allocation> Allocate(const Place& place, size_t size);

// The machine's physical memory in bytes (0 when unknown).
uint64_t PhysicalBytes();

// The CPU caching allocator (--cpu_allocator=caching): its counters, giving every wholly free
// segment back to the system (the executor does at a scope drop), and restarting the peaks.
AllocatorStats CpuAllocatorStats();
void CpuAllocatorEmptyCache();
void CpuAllocatorResetPeak();

// Copies `size` bytes between places (CPU<->CUDA when built with CUDA).
void MemCopy(const Place& dst_place, void* dst, const Place& src_place, const void* src,
             size_t size);

}  // namespace keel
