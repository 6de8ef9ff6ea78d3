// CudaGraph: one step of a CUDA place's work, captured once and replayed as a single launch.
//
// Capture records what the executor enqueues on the place's compute stream, and on every stream
// that joins it through events (the rings' NCCL streams), into a CUDA graph instead of running it;
// EndCapture instantiates it and each Launch replays it. Replays use the addresses captured, so
// during a capture the caching allocator holds every block freed then (CachingAllocator::
// BeginCapture), the pinned staging of host-to-device copies is kept for the graph, and the
// graph's inputs (the feeds, the run index random ops read) are copied at the start of each
// replay from pinned buffers the caller rewrites before it (Input, WaitInputs).
//
// No CUDA headers here: the executor uses it on any build; without CUDA it throws.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "framework/runtime/place.h"

namespace keel {

class CudaGraph {
 public:
  explicit CudaGraph(const Place& place);
  // Waits for the last replay, then gives the held memory and pinned buffers back.
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Begins capturing the compute stream (relaxed mode: the rings' threads enqueue on streams
  // that join the capture through events). The graph starts with one copy per input: `bytes`
  // from a pinned buffer (Input(i)) to device memory `dst`.
  void BeginCapture(const std::vector<std::pair<void*, size_t>>& inputs);
  // Ends the capture and instantiates the graph; a keel::Error says what CUDA refused.
  void EndCapture();
  // After an error during the capture: ends it and drops what was recorded.
  void AbortCapture() noexcept;
  bool capturing() const;
  bool ready() const;  // captured and instantiated

  // The pinned buffer input `i` is copied from. Rewrite it only after WaitInputs.
  void* Input(size_t i);
  // Waits until the last replay has copied its inputs.
  void WaitInputs();
  // Replays the graph on the compute stream (does not wait for it).
  void Launch();
  int64_t launches() const { return launches_; }

 private:
  struct Impl;
  Place place_;
  std::unique_ptr<Impl> impl_;
  int64_t launches_ = 0;
};

}  // namespace keel
