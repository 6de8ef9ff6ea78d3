// Executor: runs block 0 of a program on one place (and the sub-blocks its control-flow ops run).
//
// A plan (kernels created once, every op's inputs/outputs resolved to Variable pointers) is built
// the first time a program is run and reused while the program is unchanged, so a step does no
// name lookups. Persistables live in the executor's global scope; temporaries in a local scope
// whose tensors are released every num_iteration_per_drop_scope runs.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/ir/program.h"
#include "framework/runtime/scope.h"
#include "framework/runtime/tensor.h"

namespace keel {

struct ExecutionStrategy {
  // Workers that run ready ops (this executor runs ops in order; the thread pool comes later).
  int num_threads = 1;
  // Temporaries are released every this many runs of a program.
  int num_iteration_per_drop_scope = 100;
  // Fetch results every this many runs; other runs return nothing and copy nothing.
  int fetch_frequency = 1;
};

using FeedMap = std::map<std::string, Tensor>;

class Executor {
 public:
  explicit Executor(const Place& place = CPUPlace(), ExecutionStrategy strategy = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs block 0 of `program`. Feeds are checked against the program's data vars (dtype, rank,
  // every known dim). Returns copies of the fetched tensors in order, or an empty vector when
  // `fetch` is empty or fetch_frequency skips this run.
  std::vector<Tensor> Run(const Program& program, const FeedMap& feed = {},
                          const std::vector<std::string>& fetch = {});

  Scope& scope() { return *scope_; }
  // The child scope holding temporaries (non-persistable vars).
  Scope& local_scope() { return *local_scope_; }
  const Place& place() const { return place_; }
  const ExecutionStrategy& strategy() const { return strategy_; }
  void set_strategy(const ExecutionStrategy& s) { strategy_ = s; }
  // Number of times Run has executed `program` (0 when never).
  int64_t RunCount(const Program& program) const;
  // Sets that count, as if `program` had run `runs` times: resuming a checkpoint of step N sets
  // N, so random ops (dropout) continue with the draws of run N and fetch_frequency keeps its
  // cadence.
  void SetRunCount(const Program& program, int64_t runs);

 private:
  struct Plan;
  // The plan of block `block` of `program`, built or rebuilt when the program changed.
  Plan& GetPlan(const Program& program, int block = 0);
  std::unique_ptr<Plan> BuildPlan(const Program& program, int block);
  void RunOps(const Program& program, Plan& plan);

  Place place_;
  ExecutionStrategy strategy_;
  std::unique_ptr<Scope> scope_;
  Scope* local_scope_;
  std::map<std::pair<uint64_t, int>, std::unique_ptr<Plan>> plans_;  // (program id, block)
  std::map<uint64_t, int64_t> runs_;  // by program id; nodes are stable, contexts point at them
};

}  // namespace keel
