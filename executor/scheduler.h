// The executor's scheduler: a dependency graph of a block's ops, built once per plan, and a run
// that executes ready ops on up to num_threads workers while collectives go to their ring's
// stream.
//
// Graph: op j depends on an earlier op i when they touch one variable and one of them writes it
// (read-after-write, write-after-read, write-after-write). A gradient that coalesce_tensor made a
// slice of a fused buffer conflicts with the buffer (the all-reduce of the buffer waits for every
// slice's writer; a slice's reader waits for the all-reduce) but not with the other slices. Ops
// that run sub-blocks are barriers (they depend on every earlier op and every later op depends on
// them), as they touch variables the graph cannot see. Running ops in any order the graph allows
// reads and writes every variable in program order, so results are the same bits whatever the
// number of workers (kernels' own pieces are fixed by shape, see cpu_threads.h).
//
// Run: the calling thread is worker 0; the others are tasks on the CPU thread pool, started only
// while more ops are ready than workers run, so idle workers leave their cores to kernels'
// ParallelFor. Among ready ops the earliest in program order runs first (the critical path of
// backward). An op bound to a stream (a collective) is enqueued on it in program order per stream,
// whatever order its inputs became ready in, so every rank issues a ring's collectives in the
// same order; it completes when the stream has run it, while the workers go on.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "executor/stream.h"

namespace keel {

class DependencyGraph {
 public:
  struct OpAccess {
    std::vector<std::string> reads, writes;
    bool barrier = false;          // ordered against every other op
    bool hidden_accesses = false;  // runs a sub-block: touches variables not listed here
  };
  // `slice_of` maps a variable to the fused buffer it is a slice of.
  DependencyGraph(const std::vector<OpAccess>& ops,
                  const std::map<std::string, std::string>& slice_of);

  size_t size() const { return preds_.size(); }
  const std::vector<int>& successors(int op) const { return succ_[op]; }
  int num_predecessors(int op) const { return preds_[op]; }
  bool HasEdge(int from, int to) const;
  // Tests: drops an edge, to show that the run then goes wrong.
  void RemoveEdge(int from, int to);
  // The most ops that share one depth (longest path from a root): a cheap bound on how many ops
  // can run at once.
  int MaxWidth() const;

 private:
  void AddEdge(int from, int to);
  std::vector<std::vector<int>> succ_;
  std::vector<int> preds_;
};

class Scheduler {
 public:
  // What an op runs on: nullptr = a compute worker.
  using StreamOf = std::vector<Stream*>;

  // Runs every op of `graph` once: run_op(i) on a worker, or on stream_of[i] when it is set.
  // Uses at most `workers` compute workers (1: only the calling thread). After a failure no
  // further op starts; the first error is rethrown once the ops in flight have finished.
  static void Run(const DependencyGraph& graph, const StreamOf& stream_of, int workers,
                  const std::function<void(int)>& run_op);
};

}  // namespace keel
