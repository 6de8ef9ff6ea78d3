// CachingAllocator: device memory for tensors without a cudaMalloc per tensor.
//
// The allocator asks the device for large segments and hands out blocks carved from them:
//   - sizes round up to 512 bytes; requests up to 1 MiB come from 2 MiB "small" segments, larger
//     ones from "large" segments of the request rounded up to 2 MiB;
//   - a free block of the same pool and stream is reused best-fit (smallest that fits), split when
//     the rest is worth keeping, and merged with its free neighbours when it is freed;
//   - reuse is stream-ordered: a block freed by stream S is handed out again at once only to S,
//     whose later work runs after the earlier work that used it. A block also used on another
//     stream (RecordStream) waits for an event on that stream before it is reused;
//   - `reserve_bytes` > 0 (FLAGS_fraction_of_gpu_memory_to_use x the device's memory) takes one
//     segment of that size up front, as Paddle does; later needs grow the cache on demand;
//   - when the device is out of memory, fully free segments are returned and the request retried;
//     if it still fails, the error names the op, the bytes asked, in use and cached, and the flag;
//   - while a CUDA graph is captured (BeginCapture .. EndCapture) the graph bakes in every address
//     its kernels use, and replays write them again later: a block freed during the capture is
//     held for the graph (not reused, not merged) until ReleaseCapture, and no event is recorded
//     or queried then (both are errors on a capturing stream).
//
// The device is behind DeviceMemory, so tests drive the bookkeeping with a fake device on any
// machine. Thread-safe (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace keel {

// The device calls the caching allocator needs. CUDA implements them (cuda_device.cc); tests fake
// them. Streams and events are opaque handles (cudaStream_t, cudaEvent_t).
class DeviceMemory {
 public:
  using Stream = void*;
  using Event = void*;
  virtual ~DeviceMemory() = default;
  // nullptr when the device has no memory for `bytes` (the caller then frees cache and retries).
  virtual void* Malloc(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  // The device's total memory, for FLAGS_fraction_of_gpu_memory_to_use.
  virtual size_t TotalBytes() const = 0;
  // An event recorded on `stream` now; EventDone says whether the stream's work before it is done.
  virtual Event RecordEvent(Stream stream) = 0;
  virtual bool EventDone(Event event) = 0;
  virtual void DestroyEvent(Event event) = 0;
  // A name for errors ("CUDAPlace(0)").
  virtual std::string Name() const = 0;
  // What the out-of-memory error advises; empty: the GPU advice
  // (FLAGS_fraction_of_gpu_memory_to_use).
  virtual std::string OutOfMemoryAdvice() const { return std::string(); }
};

struct AllocatorStats {
  size_t in_use_bytes = 0;       // bytes in blocks handed out (rounded sizes)
  size_t reserved_bytes = 0;     // bytes in segments taken from the device (in use + cached)
  size_t peak_in_use_bytes = 0;  // maximum of in_use_bytes since the last ResetPeak
  size_t peak_reserved_bytes = 0;
  int64_t device_mallocs = 0;   // segments taken from the device (cudaMalloc calls that succeeded)
  int64_t device_frees = 0;     // segments given back
  int64_t allocs = 0;           // blocks handed out
  int64_t frees = 0;            // blocks returned
  int64_t oom_retries = 0;      // times the cache was emptied to satisfy a request
  size_t graph_held_bytes = 0;  // freed during a graph capture, held until the graph is gone
  size_t cached_bytes() const { return reserved_bytes - in_use_bytes - graph_held_bytes; }
};

// Names the op on whose behalf memory is allocated, for the out-of-memory message. The executor
// sets it around each op (a pointer store, no allocation).
class AllocationOpScope {
 public:
  explicit AllocationOpScope(const std::string* op_type);
  ~AllocationOpScope();
  AllocationOpScope(const AllocationOpScope&) = delete;
  AllocationOpScope& operator=(const AllocationOpScope&) = delete;
  static const std::string* Current();

 private:
  const std::string* prev_;
};

class CachingAllocator {
 public:
  static constexpr size_t kRound = 512;              // every size is a multiple
  static constexpr size_t kSmallRequest = 1 << 20;   // <= this: small pool
  static constexpr size_t kSmallSegment = 2 << 20;   // small pool's segment size
  static constexpr size_t kLargeRound = 2 << 20;     // large segments round to this
  static constexpr size_t kMinLargeSplit = 1 << 20;  // large rest kept only from this size
  static constexpr const char* kFractionFlag = "FLAGS_fraction_of_gpu_memory_to_use";

  // `reserve_bytes` > 0: one segment of that size (rounded to kLargeRound) for `reserve_stream` is
  // taken now and kept until the allocator dies; both pools carve blocks from it before growing.
  explicit CachingAllocator(std::unique_ptr<DeviceMemory> device, size_t reserve_bytes = 0,
                            DeviceMemory::Stream reserve_stream = nullptr);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` for work on `stream`; throws keel::Error when the device is out of
  // memory even after the cache was emptied. bytes == 0 gets a minimal block.
  void* Allocate(size_t bytes, DeviceMemory::Stream stream);
  // Returns a block from Allocate. It becomes reusable by its stream at once, by others after
  // the events of RecordStream have completed.
  void Free(void* ptr);
  // `ptr` (a block from Allocate) is also used by work on `stream`: its reuse waits for that work.
  void RecordStream(void* ptr, DeviceMemory::Stream stream);
  // Gives every wholly free segment back to the device (the reserve stays).
  void EmptyCache();

  // CUDA graph capture. Blocks freed between BeginCapture and EndCapture are held for the
  // capture (its graph replays their addresses) and the allocator records and queries no events.
  // Returns the capture's id; one capture at a time.
  int64_t BeginCapture();
  void EndCapture();
  bool capturing() const;
  // The graph of capture `id` is destroyed: its held blocks become reusable once the work queued
  // on `stream` so far (the graph's last replay) has completed.
  void ReleaseCapture(int64_t id, DeviceMemory::Stream stream);

  AllocatorStats stats() const;
  void ResetPeak();
  size_t reserve_bytes() const { return reserve_bytes_; }
  DeviceMemory& device() { return *device_; }

 private:
  struct Block;
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BySize>;

  static size_t RoundSize(size_t bytes);
  Pool& PoolFor(bool small) { return small ? small_pool_ : large_pool_; }
  Block* FindFree(Pool& pool, size_t size, DeviceMemory::Stream stream);
  Block* NewSegment(size_t size, bool small, DeviceMemory::Stream stream, bool is_reserve);
  Block* Split(Block* b, size_t size, Pool& pool);
  void Release(Block* b);        // a free block back into its pool, merged with free neighbours
  void ProcessEvents();          // blocks whose cross-stream events have completed go back to pools
  size_t ReleaseFreeSegments();  // bytes given back
  [[noreturn]] void ThrowOutOfMemory(size_t asked);
  void UpdatePeaks();

  std::unique_ptr<DeviceMemory> device_;
  size_t reserve_bytes_;
  mutable std::mutex mu_;
  Pool small_pool_, large_pool_;
  std::unordered_map<void*, Block*> allocated_;
  // Blocks freed while other streams may still use them, with the events to wait for.
  std::vector<std::pair<Block*, std::vector<DeviceMemory::Event>>> pending_;
  // Blocks freed during graph captures, by capture id.
  std::unordered_map<int64_t, std::vector<Block*>> held_;
  int64_t capture_ = 0;  // the capture under way (0: none)
  int64_t next_capture_ = 1;
  AllocatorStats stats_;
};

}  // namespace keel
