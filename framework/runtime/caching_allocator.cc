#include "framework/runtime/caching_allocator.h"

#include <glog/logging.h>

#include <algorithm>
#include <functional>
#include <sstream>
#include <tuple>

#include "framework/error.h"

namespace keel {

namespace {
thread_local const std::string* g_current_op = nullptr;

std::string Bytes(size_t b) {
  const double mib = static_cast<double>(b) / (1 << 20);
  std::ostringstream os;
  os.precision(mib < 10 ? 2 : 1);
  os << std::fixed << mib << " MiB (" << b << " bytes)";
  return os.str();
}
}  // namespace

AllocationOpScope::AllocationOpScope(const std::string* op_type) : prev_(g_current_op) {
  g_current_op = op_type;
}
AllocationOpScope::~AllocationOpScope() { g_current_op = prev_; }
const std::string* AllocationOpScope::Current() { return g_current_op; }

// A piece of a segment. Blocks of one segment form a doubly linked list in address order; a
// segment is wholly free when its only block (no prev, no next) is free.
struct CachingAllocator::Block {
  Block(char* p, size_t n, DeviceMemory::Stream s, bool is_small, bool is_reserve)
      : ptr(p), size(n), stream(s), small(is_small), reserve(is_reserve) {}
  char* ptr;
  size_t size;
  DeviceMemory::Stream stream;  // the stream the segment serves
  bool small;                   // pool: small or large
  bool reserve;                 // part of the up-front reserve: never given back
  bool allocated = false;
  bool pending = false;  // freed, waiting for other streams' events
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<DeviceMemory::Stream> other_streams;  // RecordStream
};

bool CachingAllocator::BySize::operator()(const Block* a, const Block* b) const {
  auto sa = reinterpret_cast<uintptr_t>(a->stream), sb = reinterpret_cast<uintptr_t>(b->stream);
  return std::tie(sa, a->size, a->ptr) < std::tie(sb, b->size, b->ptr);
}

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemory> device, size_t reserve_bytes,
                                   DeviceMemory::Stream reserve_stream)
    : device_(std::move(device)), reserve_bytes_(0) {
  if (reserve_bytes == 0) return;
  const size_t size = (reserve_bytes + kLargeRound - 1) / kLargeRound * kLargeRound;
  std::lock_guard<std::mutex> lock(mu_);
  Block* b = NewSegment(size, /*small=*/false, reserve_stream, /*is_reserve=*/true);
  KEEL_ENFORCE(b != nullptr, device_->Name(), ": cannot reserve ", Bytes(size), " of ",
               Bytes(device_->TotalBytes()), " up front as ", kFractionFlag,
               " asks; lower the flag (0 allocates on demand)");
  reserve_bytes_ = size;
  large_pool_.insert(b);
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : pending_)
    for (auto e : p.second) device_->DestroyEvent(e);
  // Every segment's head is found by walking back from any of its blocks; free each once.
  std::vector<Block*> all;
  for (Block* b : small_pool_) all.push_back(b);
  for (Block* b : large_pool_) all.push_back(b);
  for (auto& kv : allocated_) all.push_back(kv.second);
  for (auto& p : pending_) all.push_back(p.first);
  for (auto& h : held_) all.insert(all.end(), h.second.begin(), h.second.end());
  std::set<Block*> heads;
  for (Block* b : all) {
    while (b->prev) b = b->prev;
    heads.insert(b);
  }
  for (Block* h : heads) {
    device_->Free(h->ptr);
    for (Block* b = h; b;) {
      Block* n = b->next;
      delete b;
      b = n;
    }
  }
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  if (bytes == 0) return kRound;
  return (bytes + kRound - 1) / kRound * kRound;
}

CachingAllocator::Block* CachingAllocator::FindFree(Pool& pool, size_t size,
                                                    DeviceMemory::Stream stream) {
  Block key(nullptr, size, stream, false, false);
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::NewSegment(size_t size, bool small,
                                                      DeviceMemory::Stream stream,
                                                      bool is_reserve) {
  void* p = device_->Malloc(size);
  if (p == nullptr) return nullptr;
  ++stats_.device_mallocs;
  stats_.reserved_bytes += size;
  UpdatePeaks();
  return new Block(static_cast<char*>(p), size, stream, small, is_reserve);
}

CachingAllocator::Block* CachingAllocator::Split(Block* b, size_t size, Pool& pool) {
  const size_t rest = b->size - size;
  const size_t min_rest = (b->small || size <= kSmallRequest) ? kRound : kMinLargeSplit;
  if (rest < min_rest) return b;
  Block* r = new Block(b->ptr + size, rest, b->stream, b->small, b->reserve);
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  pool.insert(r);
  return b;
}

void* CachingAllocator::Allocate(size_t bytes, DeviceMemory::Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capture_ == 0) ProcessEvents();  // querying events is an error during a capture
  const size_t size = RoundSize(bytes);
  const bool small = size <= kSmallRequest;
  Block* b = FindFree(PoolFor(small), size, stream);
  // The reserve sits in the large pool: small requests use it too before the cache grows.
  if (b == nullptr && reserve_bytes_ > 0 && small) b = FindFree(large_pool_, size, stream);
  if (b == nullptr) {
    const size_t seg = small ? kSmallSegment : (size + kLargeRound - 1) / kLargeRound * kLargeRound;
    b = NewSegment(seg, small, stream, false);
    if (b == nullptr) {
      // Out of device memory: give back what the cache holds whole, wait for nothing, retry
      // (not during a graph capture: giving memory back waits for the device).
      if (capture_ != 0) ThrowOutOfMemory(bytes);
      ++stats_.oom_retries;
      ReleaseFreeSegments();
      b = NewSegment(seg, small, stream, false);
      if (b == nullptr) ThrowOutOfMemory(bytes);
    }
  }
  Split(b, size, b->small ? small_pool_ : large_pool_);
  b->allocated = true;
  allocated_[b->ptr] = b;
  stats_.in_use_bytes += b->size;
  ++stats_.allocs;
  UpdatePeaks();
  return b->ptr;
}

void CachingAllocator::Free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(ptr);
  CHECK(it != allocated_.end()) << "CachingAllocator::Free of a pointer it did not allocate";
  Block* b = it->second;
  allocated_.erase(it);
  b->allocated = false;
  stats_.in_use_bytes -= b->size;
  ++stats_.frees;
  if (capture_ != 0) {
    // The graph being captured may use this block: it writes it again on every replay.
    b->other_streams.clear();
    b->pending = true;  // neither reused nor merged
    held_[capture_].push_back(b);
    stats_.graph_held_bytes += b->size;
    return;
  }
  if (b->other_streams.empty()) {
    Release(b);
    return;
  }
  std::vector<DeviceMemory::Event> events;
  for (auto s : b->other_streams) events.push_back(device_->RecordEvent(s));
  b->other_streams.clear();
  b->pending = true;
  pending_.emplace_back(b, std::move(events));
}

void CachingAllocator::RecordStream(void* ptr, DeviceMemory::Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(ptr);
  CHECK(it != allocated_.end()) << "RecordStream of a pointer the allocator did not hand out";
  Block* b = it->second;
  if (stream == b->stream) return;
  if (std::find(b->other_streams.begin(), b->other_streams.end(), stream) == b->other_streams.end())
    b->other_streams.push_back(stream);
}

void CachingAllocator::Release(Block* b) {
  b->pending = false;
  Pool& pool = b->small ? small_pool_ : large_pool_;
  auto free_neighbour = [](Block* n) { return n && !n->allocated && !n->pending; };
  if (free_neighbour(b->prev)) {
    Block* p = b->prev;
    pool.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  if (free_neighbour(b->next)) {
    Block* n = b->next;
    pool.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  pool.insert(b);
}

void CachingAllocator::ProcessEvents() {
  for (size_t i = 0; i < pending_.size();) {
    auto& [block, events] = pending_[i];
    bool done = std::all_of(events.begin(), events.end(),
                            [&](DeviceMemory::Event e) { return device_->EventDone(e); });
    if (!done) {
      ++i;
      continue;
    }
    for (auto e : events) device_->DestroyEvent(e);
    Block* b = block;
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
    Release(b);
  }
}

size_t CachingAllocator::ReleaseFreeSegments() {
  size_t freed = 0;
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev || b->next || b->reserve) {
        ++it;
        continue;
      }
      it = pool->erase(it);
      device_->Free(b->ptr);
      ++stats_.device_frees;
      stats_.reserved_bytes -= b->size;
      freed += b->size;
      delete b;
    }
  }
  return freed;
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  if (capture_ == 0) ProcessEvents();
  ReleaseFreeSegments();
}

int64_t CachingAllocator::BeginCapture() {
  std::lock_guard<std::mutex> lock(mu_);
  KEEL_ENFORCE(capture_ == 0, device_->Name(),
               ": a CUDA graph capture is already under way on this device (one at a time)");
  capture_ = next_capture_++;
  held_[capture_];  // present even when nothing is freed
  return capture_;
}

void CachingAllocator::EndCapture() {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK_NE(capture_, 0) << "CachingAllocator::EndCapture without BeginCapture";
  capture_ = 0;
}

bool CachingAllocator::capturing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capture_ != 0;
}

void CachingAllocator::ReleaseCapture(int64_t id, DeviceMemory::Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK_NE(capture_, id) << "CachingAllocator::ReleaseCapture of the capture under way";
  auto it = held_.find(id);
  CHECK(it != held_.end()) << "CachingAllocator::ReleaseCapture of unknown capture " << id;
  for (Block* b : it->second) {
    stats_.graph_held_bytes -= b->size;
    pending_.emplace_back(b, std::vector<DeviceMemory::Event>{device_->RecordEvent(stream)});
  }
  held_.erase(it);
}

void CachingAllocator::ThrowOutOfMemory(size_t asked) {
  const std::string* op = AllocationOpScope::Current();
  KEEL_THROW(
      "out of memory on ", device_->Name(), op ? " in op '" + *op + "'" : std::string(),
      ": asked for ", Bytes(asked), "; in use ", Bytes(stats_.in_use_bytes), ", cached ",
      Bytes(stats_.cached_bytes()),
      stats_.graph_held_bytes ? ", held for CUDA graphs " + Bytes(stats_.graph_held_bytes)
                              : std::string(),
      capture_ ? " (during a CUDA graph capture, which cannot free cached memory)" : std::string(),
      ", device total ", Bytes(device_->TotalBytes()), "; ",
      device_->OutOfMemoryAdvice().empty()
          ? StrCat(kFractionFlag, " reserved ", Bytes(reserve_bytes_),
                   " up front (0 allocates on demand; lower it if other processes share "
                   "the device), or use a smaller batch")
          : device_->OutOfMemoryAdvice());
}

void CachingAllocator::UpdatePeaks() {
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

}  // namespace keel
