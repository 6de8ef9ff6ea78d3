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
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "framework/runtime/place.h"

namespace keel {

class CudaGraph {
 public:
  // A graph on CUDA place `place` (through the CUDA backend, framework/runtime/cuda_backend.h).
  static std::unique_ptr<CudaGraph> Create(const Place& place);
  // Waits for the last replay, then gives the held memory and pinned buffers back.
  virtual ~CudaGraph() = default;

  // Begins capturing the compute stream (relaxed mode: the rings' threads enqueue on streams
  // that join the capture through events). The graph starts with one copy per input: `bytes`
  // from a pinned buffer (Input(i)) to device memory `dst`.
  virtual void BeginCapture(const std::vector<std::pair<void*, size_t>>& inputs) = 0;
  // Ends the capture and instantiates the graph; a keel::Error says what CUDA refused.
  virtual void EndCapture() = 0;
  // After an error during the capture: ends it and drops what was recorded.
  virtual void AbortCapture() noexcept = 0;
  virtual bool capturing() const = 0;
  virtual bool ready() const = 0;  // captured and instantiated

  // The pinned buffer input `i` is copied from. Rewrite it only after WaitInputs.
  virtual void* Input(size_t i) = 0;
  // Waits until the last replay has copied its inputs.
  virtual void WaitInputs() = 0;
  // Replays the graph on the compute stream (does not wait for it).
  virtual void Launch() = 0;
  virtual int64_t launches() const = 0;
};

}  // namespace keel
