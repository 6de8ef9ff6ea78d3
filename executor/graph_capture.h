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

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/comm/communicator.h"
#include "framework/ir/program.h"
#include "framework/op/execution_context.h"
#include "framework/runtime/cuda_graph.h"

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

// The CUDA-graph side of one executor plan (ExecutionStrategy::use_cuda_graph, block 0 only):
// the policy, the captured step and what it holds, the rings its collectives use, and the
// decision, capture and replay of each run. The executor says what a step is (its ops, vars and
// feeds); this class owns every graph-only piece of state.
class CapturedStep {
 public:
  explicit CapturedStep(const Place& place) : place_(place) {}
  ~CapturedStep();  // waits for the last replay
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // Forgets the graph (plain runs, a scope drop, new feed shapes): later runs warm up again.
  void Drop();
  bool has_graph() const { return graph_ != nullptr; }
  int64_t captures() const { return captures_; }
  // Whether the first graphed run's checks (ExecutionStrategy validation) were made.
  bool checked = false;

  // Sets the rings the step's collectives use, once (they exist after the startup program).
  bool rings_known() const { return rings_known_; }
  void SetRings(std::vector<Communicator*> rings);

  // This run's action for feeds `feed`. The graph is dropped first when a buffer it captured
  // is no longer its var's (another program reallocated it) or the feeds changed. NCCL requires
  // every rank of a ring to capture the same collectives at the same step and to replay the
  // graphs of that capture: the ranks take the least advanced of their actions (plain < capture
  // < replay), voting on the first ring.
  GraphCapturePolicy::Action Decide(const FeedMap& feed);

  // What one run of the step is, to capture or replay it.
  struct Step {
    const FeedMap* feed;
    // The plan's var named `name` (a feed), and every var of the plan (kept while the graph
    // lives: a replay writes their buffers).
    std::function<Variable*(const std::string&)> var;
    std::vector<Variable*> vars;
    // The ops' contexts, which read the run index from the device during a capture.
    std::vector<ExecutionContext*> contexts;
    std::function<void()> run_ops;  // runs the step's ops once
    int64_t run_index;              // the program's run count, which random kernels read
  };
  // Captures the step (refusing a program GraphCaptureBlocker names, FLAGS_check_nan_inf, a ring
  // that waits on the host) and runs it by launching the graph.
  void Capture(const Program& program, const Step& step);
  // Launches the captured graph with this run's host feeds and run index.
  void Replay(const Step& step);

 private:
  struct Hold {
    const Variable* var;
    std::shared_ptr<Allocation> holder;
    const void* data;
    size_t bytes;
  };
  bool BuffersIntact() const;
  void CopyHostFeeds(const Step& step);
  // After a launch, with collectives: waits for the replay as a plain run waits for its
  // collectives (with the job's timeout, aborting a ring whose peer died).
  void Watch();

  Place place_;
  GraphCapturePolicy policy_;
  std::unique_ptr<CudaGraph> graph_;
  int64_t captures_ = 0;
  // The host feeds the graph's inputs are copied from, by name in input order (the run index
  // last), and the run index on the device.
  std::vector<std::string> feeds_;
  Tensor device_run_index_;
  // The buffers of the plan's vars when the graph was captured, kept alive while it lives and
  // checked before each replay.
  std::vector<Hold> holds_;
  std::vector<Communicator*> rings_;
  bool rings_known_ = false;
  void* done_ = nullptr;  // recorded after each launch, for Watch
  Tensor vote_;           // one int32 on the place: this rank's action, then the ring's minimum
};

}  // namespace keel
