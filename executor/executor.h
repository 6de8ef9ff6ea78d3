// Executor: runs block 0 of a program on one place (and the sub-blocks its control-flow ops run).
//
// A plan (kernels created once, every op's inputs/outputs resolved to Variable pointers, the
// dependency graph of the ops) is built the first time a program is run and reused while the
// program is unchanged, so a step does no name lookups. Ready ops run on up to num_threads
// workers and collectives on their ring's stream (executor/scheduler.h), with the same results
// for any number of threads. Persistables live in the executor's global scope; temporaries in a
// local scope whose tensors are released every num_iteration_per_drop_scope runs.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "executor/execution_strategy.h"
#include "framework/ir/program.h"
#include "framework/runtime/scope.h"
#include "framework/runtime/tensor.h"

namespace keel {

class DependencyGraph;

using FeedMap = std::map<std::string, Tensor>;

class Executor {
 public:
  explicit Executor(const Place& place = CPUPlace(), ExecutionStrategy strategy = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // How Run hands back what it fetches: kCopy, copies on the CPU; kTake, the variables' own
  // tensors, taken out of the scope where they lie (no copy, not even off a GPU): the variables
  // are empty after the run, and the next run writes them afresh. Non-persistable variables only.
  // For a caller that feeds them to a later run, as a pipeline stage keeps a micro-batch's
  // activations from its forward run for its backward run.
  enum class FetchMode { kCopy, kTake };

  // Runs block 0 of `program`. Feeds are checked against the program's data vars (dtype, rank,
  // every known dim). Returns the fetched tensors in order (empty when `fetch` is), copies unless
  // `mode` is kTake; a run that fetches nothing copies nothing.
  std::vector<Tensor> Run(const Program& program, const FeedMap& feed = {},
                          const std::vector<std::string>& fetch = {},
                          FetchMode mode = FetchMode::kCopy);

  Scope& scope() { return *scope_; }
  // The child scope holding temporaries (non-persistable vars).
  Scope& local_scope() { return *local_scope_; }
  const Place& place() const { return place_; }
  const ExecutionStrategy& strategy() const { return strategy_; }
  void set_strategy(const ExecutionStrategy& s);
  // The strategy runs of `program` use: the one attached to it, else this executor's.
  const ExecutionStrategy& StrategyFor(const Program& program) const;
  // Number of times Run has executed `program` (0 when never).
  int64_t RunCount(const Program& program) const;
  // Sets that count, as if `program` had run `runs` times: resuming a checkpoint of step N sets
  // N, so random ops (dropout) continue with the draws of run N and fetch_frequency keeps its
  // cadence.
  void SetRunCount(const Program& program, int64_t runs);
  // CUDA graphs captured for block 0 of `program` so far (ExecutionStrategy::use_cuda_graph).
  int64_t CudaGraphCaptures(const Program& program);
  // Workers a run of `program` uses (num_threads resolved against the budget and the graph).
  int WorkersFor(const Program& program);
  // The dependency graph of block `block` of `program` (built on first use). Tests only: an edge
  // removed here stays removed until the program changes.
  DependencyGraph& DependencyGraphForTesting(const Program& program, int block = 0);

 private:
  struct Plan;
  // The plan of block `block` of `program`, built or rebuilt when the program changed.
  Plan& GetPlan(const Program& program, int block = 0);
  std::unique_ptr<Plan> BuildPlan(const Program& program, int block);
  // `keep`: variables eager deletion must not free (the run's fetches).
  void RunOps(const Program& program, Plan& plan, int workers,
              const std::set<const Variable*>& keep = {});
  // ExecutionStrategy::use_cuda_graph: CheckGraphable refuses a CPU place and
  // FLAGS_check_nan_inf at the first run; RunGraphed runs, captures (refusing a program with an
  // op that cannot be captured) or replays the step.
  void CheckGraphable(const Program& program);
  void RunGraphed(const Program& program, Plan& plan, const FeedMap& feed);
  void RunOp(Plan& plan, int i);

  Place place_;
  ExecutionStrategy strategy_;
  std::unique_ptr<Scope> scope_;
  Scope* local_scope_;
  std::map<std::pair<uint64_t, int>, std::unique_ptr<Plan>> plans_;  // (program id, block)
  std::map<uint64_t, int64_t> runs_;  // by program id; nodes are stable, contexts point at them
};

}  // namespace keel
