// CachingAllocator bookkeeping against a fake device: reuse, split and merge, stream order, the
// reserve, statistics and the out-of-memory message. No GPU needed.
#include "framework/runtime/caching_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "framework/error.h"

namespace keel {
namespace {

// Hands out fake addresses (never dereferenced) from a device of `capacity` bytes; events
// complete when the test says so.
class FakeDevice : public DeviceMemory {
 public:
  struct State {
    size_t capacity = 0, used = 0;
    int64_t mallocs = 0, failed_mallocs = 0, frees = 0;
    std::map<void*, size_t> live;
    std::map<int64_t, bool> events;  // id -> done
    int64_t next_event = 1;
    // Set by a test while a CUDA graph would be capturing: recording or querying an event, or
    // giving memory back, is then an error, as on a capturing CUDA stream.
    bool capturing = false;
  };
  FakeDevice(State* s) : s_(s) {}
  void* Malloc(size_t bytes) override {
    if (s_->used + bytes > s_->capacity) {
      ++s_->failed_mallocs;
      return nullptr;
    }
    s_->used += bytes;
    ++s_->mallocs;
    void* p = reinterpret_cast<void*>(next_);
    next_ += bytes + (1 << 20);  // gaps: segments never touch, so merging across them is a bug
    s_->live[p] = bytes;
    return p;
  }
  void Free(void* p) override {
    EXPECT_FALSE(s_->capturing) << "cudaFree during a capture";
    auto it = s_->live.find(p);
    ASSERT_NE(it, s_->live.end());
    s_->used -= it->second;
    s_->live.erase(it);
    ++s_->frees;
  }
  size_t TotalBytes() const override { return s_->capacity; }
  Event RecordEvent(Stream) override {
    EXPECT_FALSE(s_->capturing) << "event recorded during a capture";
    int64_t id = s_->next_event++;
    s_->events[id] = false;
    return reinterpret_cast<Event>(id);
  }
  bool EventDone(Event e) override {
    EXPECT_FALSE(s_->capturing) << "event queried during a capture";
    return s_->events.at(reinterpret_cast<int64_t>(e));
  }
  void DestroyEvent(Event e) override { s_->events.erase(reinterpret_cast<int64_t>(e)); }
  std::string Name() const override { return "FakeDevice(0)"; }

 private:
  State* s_;
  uintptr_t next_ = uintptr_t{1} << 32;
};

constexpr size_t kMiB = 1 << 20;
DeviceMemory::Stream S(int i) { return reinterpret_cast<DeviceMemory::Stream>(uintptr_t(i)); }

struct Fixture {
  FakeDevice::State dev;
  std::unique_ptr<CachingAllocator> alloc;
  explicit Fixture(size_t capacity = 1024 * kMiB, size_t reserve = 0) {
    dev.capacity = capacity;
    alloc = std::make_unique<CachingAllocator>(std::make_unique<FakeDevice>(&dev), reserve, S(1));
  }
};

TEST(CachingAllocator, FreedBlockIsReusedWithoutAnotherDeviceMalloc) {
  Fixture f;
  void* a = f.alloc->Allocate(1000, S(1));
  f.alloc->Free(a);
  void* b = f.alloc->Allocate(1000, S(1));
  EXPECT_EQ(a, b);
  EXPECT_EQ(f.dev.mallocs, 1);
  EXPECT_EQ(f.alloc->stats().device_mallocs, 1);
  EXPECT_EQ(f.alloc->stats().in_use_bytes, 1024u);  // rounded to 512
}

TEST(CachingAllocator, SmallRequestsShareOneTwoMiBSegment) {
  Fixture f;
  std::vector<void*> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(f.alloc->Allocate(100 * 1024, S(1)));
  EXPECT_EQ(f.dev.mallocs, 1);
  EXPECT_EQ(f.alloc->stats().reserved_bytes, 2 * kMiB);
  // Blocks are carved in address order from one segment and do not overlap.
  for (int i = 1; i < 4; ++i)
    EXPECT_EQ(static_cast<char*>(ps[i]) - static_cast<char*>(ps[i - 1]), 100 * 1024);
  // A large request gets a segment of its own, rounded to 2 MiB.
  f.alloc->Allocate(3 * kMiB + 1, S(1));
  EXPECT_EQ(f.dev.mallocs, 2);
  EXPECT_EQ(f.dev.live.rbegin()->second, 4 * kMiB);
}

TEST(CachingAllocator, FreedNeighboursMergeSoTheSegmentCanBeReturned) {
  Fixture f;
  void* a = f.alloc->Allocate(512 * 1024, S(1));
  void* b = f.alloc->Allocate(512 * 1024, S(1));
  void* c = f.alloc->Allocate(512 * 1024, S(1));
  f.alloc->Free(a);
  f.alloc->Free(c);
  f.alloc->EmptyCache();  // b still splits the segment: nothing to return
  EXPECT_EQ(f.dev.frees, 0);
  f.alloc->Free(b);  // merges with a, c and the rest into one free block
  // A request for 1 MiB + 512 KiB fits only if the pieces merged (small pool, same segment).
  void* d = f.alloc->Allocate(kMiB, S(1));
  EXPECT_EQ(d, a);
  f.alloc->Free(d);
  f.alloc->EmptyCache();
  EXPECT_EQ(f.dev.frees, 1);
  EXPECT_EQ(f.alloc->stats().reserved_bytes, 0u);
  EXPECT_TRUE(f.dev.live.empty());
}

TEST(CachingAllocator, BestFitPicksTheSmallestFreeBlockThatFits) {
  Fixture f;
  void* big = f.alloc->Allocate(8 * kMiB, S(1));
  void* mid = f.alloc->Allocate(4 * kMiB, S(1));
  f.alloc->Free(big);
  f.alloc->Free(mid);
  EXPECT_EQ(f.alloc->Allocate(3 * kMiB, S(1)), mid);
  EXPECT_EQ(f.alloc->Allocate(5 * kMiB, S(1)), big);
  EXPECT_EQ(f.dev.mallocs, 2);
}

TEST(CachingAllocator, ReuseIsStreamOrdered) {
  Fixture f;
  void* a = f.alloc->Allocate(4096, S(1));
  f.alloc->Free(a);
  void* b = f.alloc->Allocate(4096, S(2));  // another stream may still be behind: new memory
  EXPECT_NE(a, b);
  EXPECT_EQ(f.dev.mallocs, 2);
  EXPECT_EQ(f.alloc->Allocate(4096, S(1)), a);  // its own stream reuses at once
}

TEST(CachingAllocator, BlockUsedOnAnotherStreamWaitsForItsEvent) {
  Fixture f;
  void* a = f.alloc->Allocate(4096, S(1));
  f.alloc->RecordStream(a, S(7));  // e.g. an all-reduce on a ring's stream reads it
  f.alloc->Free(a);
  ASSERT_EQ(f.dev.events.size(), 1u);
  void* b = f.alloc->Allocate(4096, S(1));
  EXPECT_NE(a, b) << "reused while stream 7 may still read it";
  f.alloc->Free(b);
  f.dev.events.begin()->second = true;  // stream 7 finished
  void* c = f.alloc->Allocate(4096, S(1));
  void* d = f.alloc->Allocate(4096, S(1));
  EXPECT_TRUE(c == a || d == a);
  EXPECT_TRUE(f.dev.events.empty()) << "events are destroyed once done";
}

TEST(CachingAllocator, BlocksFreedDuringAGraphCaptureAreHeldUntilTheGraphIsReleased) {
  Fixture f;
  void* before = f.alloc->Allocate(4096, S(1));
  f.alloc->RecordStream(before, S(7));
  f.alloc->Free(before);  // pending on stream 7's event, recorded before the capture
  void* kept = f.alloc->Allocate(8192, S(1));

  const int64_t id = f.alloc->BeginCapture();
  f.dev.capturing = true;
  EXPECT_TRUE(f.alloc->capturing());
  void* scratch = f.alloc->Allocate(4096, S(1));  // no event query, though one is pending
  f.alloc->RecordStream(scratch, S(7));
  f.alloc->Free(scratch);  // no event recorded: held for the graph instead
  void* next = f.alloc->Allocate(4096, S(1));
  EXPECT_NE(next, scratch) << "a block the graph writes on replay was handed out again";
  f.alloc->Free(next);
  f.alloc->Free(kept);  // allocated before, freed during: the graph may use it too
  EXPECT_NE(f.alloc->Allocate(8192, S(1)), kept);
  f.dev.capturing = false;
  f.alloc->EndCapture();
  EXPECT_FALSE(f.alloc->capturing());

  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.graph_held_bytes, 4096u + 4096u + 8192u);
  EXPECT_EQ(s.cached_bytes() + s.in_use_bytes + s.graph_held_bytes, s.reserved_bytes);
  f.alloc->EmptyCache();  // held blocks are not cache: nothing of theirs is given back
  for (void* p : {scratch, next, kept}) {
    bool live = false;
    for (auto& kv : f.dev.live)
      live |= p >= kv.first && static_cast<char*>(p) < static_cast<char*>(kv.first) + kv.second;
    EXPECT_TRUE(live) << "a held block's segment went back to the device";
  }

  const size_t events_before = f.dev.events.size();
  f.alloc->ReleaseCapture(id, S(1));
  EXPECT_EQ(f.dev.events.size(), events_before + 3) << "one event per held block, on S(1)";
  EXPECT_EQ(f.alloc->stats().graph_held_bytes, 0u);
  void* early = f.alloc->Allocate(4096, S(1));
  EXPECT_TRUE(early != scratch && early != next) << "reused before the last replay finished";
  for (auto& e : f.dev.events) e.second = true;  // the replays (and stream 7) finished
  std::vector<void*> got;
  for (int i = 0; i < 4; ++i) got.push_back(f.alloc->Allocate(4096, S(1)));
  EXPECT_TRUE(std::count(got.begin(), got.end(), scratch) == 1 ||
              std::count(got.begin(), got.end(), next) == 1);
  EXPECT_TRUE(f.dev.events.empty());
}

TEST(CachingAllocator, OutOfMemoryDuringAGraphCaptureGivesNothingBackAndSaysSo) {
  Fixture f(8 * kMiB);
  void* a = f.alloc->Allocate(4 * kMiB, S(1));
  f.alloc->Free(a);  // a whole free 4 MiB segment: normally given back and retried
  f.alloc->BeginCapture();
  f.dev.capturing = true;
  try {
    f.alloc->Allocate(6 * kMiB, S(1));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("during a CUDA graph capture"), std::string::npos)
        << e.what();
  }
  f.dev.capturing = false;
  f.alloc->EndCapture();
  EXPECT_EQ(f.dev.frees, 0);
  EXPECT_NE(f.alloc->Allocate(6 * kMiB, S(1)), nullptr) << "after the capture it gives back";
}

TEST(CachingAllocator, ReserveIsTakenUpFrontAndServesBothPools) {
  Fixture f(1024 * kMiB, 64 * kMiB + 1);
  EXPECT_EQ(f.dev.mallocs, 1);
  EXPECT_EQ(f.alloc->reserve_bytes(), 66 * kMiB);  // rounded up to 2 MiB
  std::vector<void*> ps;
  for (int i = 0; i < 10; ++i) ps.push_back(f.alloc->Allocate(100 * 1024, S(1)));
  for (int i = 0; i < 5; ++i) ps.push_back(f.alloc->Allocate(10 * kMiB, S(1)));
  EXPECT_EQ(f.dev.mallocs, 1) << "served from the reserve";
  ps.push_back(f.alloc->Allocate(20 * kMiB, S(1)));  // beyond the reserve: grows on demand
  EXPECT_EQ(f.dev.mallocs, 2);
  for (void* p : ps) f.alloc->Free(p);
  f.alloc->EmptyCache();
  EXPECT_EQ(f.dev.frees, 1) << "the reserve stays";
  EXPECT_EQ(f.alloc->stats().reserved_bytes, 66 * kMiB);
}

TEST(CachingAllocator, ReserveLargerThanTheDeviceNamesTheFlag) {
  FakeDevice::State dev;
  dev.capacity = 100 * kMiB;
  try {
    CachingAllocator a(std::make_unique<FakeDevice>(&dev), 200 * kMiB, S(1));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FLAGS_fraction_of_gpu_memory_to_use"), std::string::npos)
        << e.what();
  }
}

TEST(CachingAllocator, OutOfMemoryEmptiesTheCacheThenRetries) {
  Fixture f(10 * kMiB);
  void* a = f.alloc->Allocate(6 * kMiB, S(1));
  f.alloc->Free(a);                             // 6 MiB cached
  void* b = f.alloc->Allocate(8 * kMiB, S(1));  // 6 + 8 > 10: the cache is given back first
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(f.alloc->stats().oom_retries, 1);
  EXPECT_EQ(f.dev.frees, 1);
}

TEST(CachingAllocator, OutOfMemoryErrorNamesOpBytesInUseCachedAndFlag) {
  Fixture f(10 * kMiB);
  f.alloc->Allocate(8 * kMiB, S(1));
  void* s = f.alloc->Allocate(4096, S(1));  // a 2 MiB small segment: device full
  f.alloc->Free(s);
  const std::string op = "conv2d";
  AllocationOpScope scope(&op);
  try {
    f.alloc->Allocate(4 * kMiB, S(1));
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const char* want :
         {"FakeDevice(0)", "op 'conv2d'", "asked for 4.00 MiB (4194304 bytes)", "in use 8.00 MiB",
          "cached 0.00 MiB", "FLAGS_fraction_of_gpu_memory_to_use"})
      EXPECT_NE(m.find(want), std::string::npos) << want << " not in: " << m;
  }
  EXPECT_EQ(f.alloc->stats().in_use_bytes, 8 * kMiB) << "a failed request changes nothing";
}

TEST(CachingAllocator, StatsTrackPeakAndCounts) {
  Fixture f;
  void* a = f.alloc->Allocate(3 * kMiB, S(1));
  void* b = f.alloc->Allocate(5 * kMiB, S(1));
  f.alloc->Free(a);
  AllocatorStats s = f.alloc->stats();
  EXPECT_EQ(s.in_use_bytes, 5 * kMiB);
  EXPECT_EQ(s.peak_in_use_bytes, 8 * kMiB);
  EXPECT_EQ(s.reserved_bytes, 10 * kMiB);  // 4 + 6 MiB segments
  EXPECT_EQ(s.cached_bytes(), 5 * kMiB);   // a's 4 MiB segment and b's 1 MiB rest
  EXPECT_EQ(s.allocs, 2);
  EXPECT_EQ(s.frees, 1);
  f.alloc->ResetPeak();
  EXPECT_EQ(f.alloc->stats().peak_in_use_bytes, 5 * kMiB);
  f.alloc->Free(b);
}

TEST(CachingAllocator, ZeroBytesGetsADistinctMinimalBlock) {
  Fixture f;
  void* a = f.alloc->Allocate(0, S(1));
  void* b = f.alloc->Allocate(0, S(1));
  EXPECT_NE(a, b);
  EXPECT_EQ(f.alloc->stats().in_use_bytes, 2 * CachingAllocator::kRound);
}

TEST(CachingAllocator, SteadyStateRepeatsTheSamePatternWithoutDeviceMallocs) {
  Fixture f;
  std::mt19937 rng(3);
  std::vector<size_t> sizes;
  for (int i = 0; i < 50; ++i) sizes.push_back(1 + rng() % (6 * kMiB));
  int64_t after_first = 0;
  for (int step = 0; step < 5; ++step) {
    std::vector<void*> ps;
    for (size_t s : sizes) ps.push_back(f.alloc->Allocate(s, S(1)));
    for (size_t i = 0; i < ps.size(); i += 2) f.alloc->Free(ps[i]);  // temporaries die mid-step
    for (size_t i = 0; i < 10; ++i) ps[2 * i] = f.alloc->Allocate(sizes[2 * i], S(1));
    for (size_t i = 0; i < ps.size(); ++i)
      if (i % 2 == 1 || i < 20) f.alloc->Free(ps[i]);
    if (step == 1) after_first = f.dev.mallocs;  // two warm-up steps
  }
  EXPECT_EQ(f.dev.mallocs, after_first);
  EXPECT_EQ(f.alloc->stats().in_use_bytes, 0u);
}

TEST(CachingAllocator, RandomWorkloadKeepsBlocksDisjointAndAccountsEveryByte) {
  Fixture f(4096 * kMiB);
  std::mt19937 rng(7);
  std::map<uintptr_t, size_t> live;  // start -> requested bytes
  for (int i = 0; i < 3000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      size_t bytes = rng() % 4 == 0 ? rng() % (8 * kMiB) : rng() % 4096;
      auto p = reinterpret_cast<uintptr_t>(f.alloc->Allocate(bytes, S(1 + rng() % 2)));
      auto next = live.lower_bound(p);
      if (next != live.end()) {
        ASSERT_LE(p + bytes, next->first) << "overlaps the next block";
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, p) << "overlaps the previous block";
      }
      live[p] = bytes;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      f.alloc->Free(reinterpret_cast<void*>(it->first));
      live.erase(it);
    }
  }
  size_t in_use = 0;
  for (auto& kv : live) in_use += (std::max<size_t>(kv.second, 1) + 511) / 512 * 512;
  // Large blocks may carry an unsplit rest under 1 MiB: in use is at least the rounded sizes.
  EXPECT_GE(f.alloc->stats().in_use_bytes, in_use);
  for (auto& kv : live) f.alloc->Free(reinterpret_cast<void*>(kv.first));
  EXPECT_EQ(f.alloc->stats().in_use_bytes, 0u);
  f.alloc->EmptyCache();
  EXPECT_EQ(f.alloc->stats().reserved_bytes, 0u) << "every segment merged back whole";
  EXPECT_TRUE(f.dev.live.empty());
}

}  // namespace
}  // namespace keel
