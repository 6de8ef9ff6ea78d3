// When the executor captures a program's step into a CUDA graph (ExecutionStrategy::
// use_cuda_graph), and what keeps a program out of one. No CUDA here, so it is tested anywhere.
//
// A plan runs kWarmupRuns plain steps with the same feed signature (names, dtypes, shapes, and
// whether each is on the host), which make every kernel's lazy state (cuDNN algorithms, cuBLAS
// workspaces, tensors) and every allocation; the next step is captured and launched, and later
// steps with that signature replay the graph. A step with another signature drops the graph and
// warms up again; so does a scope drop (the graph's temporaries are released), and a changed
// program gets a new plan.
#pragma once

#include <string>

#include "executor/executor.h"
#include "framework/ir/program.h"

namespace keel {

class GraphCapturePolicy {
 public:
  static constexpr int kWarmupRuns = 2;
  // In this order: ranks of a ring agree on the least of their actions (executor.cc).
  enum class Action { kPlain, kCapture, kReplay };

  // The action for a step whose feeds have signature `key`. Sets *drop_graph when a graph
  // captured for another signature must go first.
  Action Next(const std::string& key, bool* drop_graph);
  // The step Next answered kCapture for was captured: later steps with its signature replay.
  void Captured() { captured_ = true; }
  // The graph was dropped (scope drop): warm up again before the next capture.
  void Reset() {
    captured_ = false;
    plain_runs_ = 0;
  }
  bool captured() const { return captured_; }

 private:
  std::string key_;
  bool keyed_ = false;
  bool captured_ = false;
  int plain_runs_ = 0;
};

// The feed signature GraphCapturePolicy keys on.
std::string FeedSignature(const FeedMap& feed);

// Why block `block` of `program` cannot be captured into a CUDA graph, naming the op (an op
// running a sub-block brings its condition to the host; random fills draw on the host; ring
// set-up is not a stream operation); empty when it can.
std::string GraphCaptureBlocker(const Program& program, int block = 0);

}  // namespace keel
