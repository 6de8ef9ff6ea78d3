// Eager deletion (Paddle's garbage collector, FLAGS_eager_delete_tensor_gb): a temporary's memory
// goes back to the allocator as soon as every op that touches it in a run has finished, instead of
// staying until the scope drop. A step then needs about the memory of the variables alive at once
// (the forward's activations at the start of backward) rather than the sum of all of them, and
// the next op's output lands in blocks that were just freed and are still in cache.
//
// Built once per plan from each op's reads and writes. A variable is collected only when the plan
// owns it and every run defines it before using it:
//   - a temporary of the plan's block (not persistable, not an ancestor block's);
//   - written before it is read: the first op that touches it writes it without reading it (a feed,
//     or a value left by an earlier run or another program, is read first and kept);
//   - not a fused gradient buffer nor a slice of one (the all-reduce and the optimizer use them),
//     nor a buffer a ring all-reduces in place from the memory its peers map (`kept`: freeing it
//     would give back shared pages the next step faults in again);
//   - in a block without ops that run sub-blocks, whose accesses the plan cannot see.
// At run time each candidate counts down the ops that touch it, in whatever order the scheduler
// runs them, and is freed by the thread that finishes the last one; fetched variables are kept.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "executor/scheduler.h"

namespace keel {

class Variable;

class EagerDeletionPlan {
 public:
  EagerDeletionPlan() = default;
  // ops: each op's reads and writes (as for the DependencyGraph); `owned`: the plan's temporaries
  // by name; `slice_of`: fused-buffer slices to their buffer; `kept`: other names not to collect.
  EagerDeletionPlan(const std::vector<DependencyGraph::OpAccess>& ops,
                    const std::map<std::string, Variable*>& owned,
                    const std::map<std::string, std::string>& slice_of,
                    const std::set<std::string>& kept = {});

  bool empty() const { return vars_.empty(); }
  size_t size() const { return vars_.size(); }
  // Names of the candidates, sorted (tests).
  std::vector<std::string> Names() const;
  // The candidates the last of whose ops is op `i` in program order (tests and docs: with one
  // worker, where each is freed).
  std::vector<std::string> FreedAfter(int op) const;

 private:
  friend class EagerDeletionRun;
  struct Var {
    std::string name;
    Variable* var;
    int uses;  // ops that touch it (each once)
  };
  std::vector<Var> vars_;
  std::vector<std::vector<int>> touched_by_op_;  // per op: indices into vars_
};

// One run's countdown. OpDone may be called from any thread; `threshold_bytes` > 0 holds freed
// variables until that many bytes are due (Paddle's batching), and Finish frees the rest.
class EagerDeletionRun {
 public:
  EagerDeletionRun(const EagerDeletionPlan& plan, const std::set<const Variable*>& keep,
                   int64_t threshold_bytes);
  void OpDone(int op);
  void Finish();

 private:
  void Free(Variable* v);
  const EagerDeletionPlan& plan_;
  const std::set<const Variable*>& keep_;
  const int64_t threshold_;
  std::unique_ptr<std::atomic<int>[]> left_;
  std::mutex mu_;
  std::vector<Variable*> held_;
  int64_t held_bytes_ = 0;
};

}  // namespace keel
