// Complete checkpoints of model-parallel jobs (docs/pipeline.md, docs/tensor-parallel.md,
// "Checkpoints"). A pipeline stage holds only its stage's persistables and a tensor-parallel rank
// only its shards of the sharded ones; a checkpoint is nevertheless the single-device program's:
// every persistable under its own name, whole, so that one process loads it with
// load_persistables on the program it builds without fleet, and a job of the same layout resumes
// from it exactly.
//
// Saving (every rank, in the same order: collectives on fleet's eager ring): rank 0 receives
//   pipeline: every persistable that another stage holds, from that stage's rank of data-parallel
//     replica 0 (one broadcast per var; rank 0's own stage and the learning rate it shares stay
//     where they are);
//   tensor parallel: every part of each sharded persistable (a parameter split by the DSL, and
//     the optimizer state shaped like it) from the ranks of its tensor-parallel group (of its
//     stage, in a pipeline), joined along the parameter's split axis; replicated persistables are
//     rank 0's own (or, in a pipeline, their stage's tensor-parallel rank 0's).
// Loading (each rank alone, from its own copy of the files):
//   pipeline: each stage loads the persistables of its own stage program;
//   tensor parallel: each rank loads the whole tensors and keeps its part along the split axis.
// What is recorded at minimize time (RecordModelParallelLayout) is the program before the
// model-parallel passes (the single-device names and, with tensor parallelism, shapes) and where
// each of its persistables lives.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "executor/executor.h"
#include "fleet/distributed_strategy.h"
#include "fleet/role.h"
#include "framework/ir/program.h"
#include "framework/runtime/scope.h"

namespace keel {
namespace fleet {

class ShardedStateOnRankZero;

// Called by minimize for a pipeline or tensor-parallel program: `whole_main` / `whole_startup`
// are the programs as they were before TranspileCollective (clones), `main` the transpiled one.
void RecordModelParallelLayout(const Program& main, std::unique_ptr<Program> whole_main,
                               const Program& whole_startup, const DistributedStrategy& strategy,
                               const Role& role);
// Forgets every recorded layout (fleet::reset).
void ForgetModelParallelLayouts();
// Whether minimize recorded a layout for `main` (a pipeline stage or a tensor-parallel program).
bool IsModelParallel(const Program& main);
// The program a checkpoint of `main` holds: the recorded single-device one, else `main`.
const Program& WholeProgram(const Program& main);

// The inference program of a tensor-parallel model for one process holding the whole tensors
// (what CheckpointOnRankZero gathers): `whole` pruned to feeds -> targets, each model-parallel op
// replaced by its registered one-process form (OpTraits::one_process_form: c_identity,
// mp_allreduce_sum, c_split and c_concat copy their input; c_embedding looks the ids up in the
// whole table), every op's output shapes inferred anew from the whole parameters. A
// model-parallel op without one is an error naming it.
std::unique_ptr<Program> OneProcessInferenceProgram(const Program& whole,
                                                    const std::vector<std::string>& feeds,
                                                    const std::vector<std::string>& targets);

// For a checkpoint of `main`: every rank of the job constructs it at the same point (under
// model parallelism and sharding it gathers to rank 0 through collectives), then rank 0 saves
// scope()'s persistables of program() but skip(). For a program that is neither model-parallel
// nor sharded, that is `main` in exe's scope, skipping fleet::pass_made_vars(main).
class CheckpointOnRankZero {
 public:
  CheckpointOnRankZero(Executor& exe, const Program& main);
  ~CheckpointOnRankZero();
  CheckpointOnRankZero(const CheckpointOnRankZero&) = delete;
  CheckpointOnRankZero& operator=(const CheckpointOnRankZero&) = delete;

  const Program& program() const { return *program_; }
  const Scope& scope() const { return *scope_; }
  const std::set<std::string>& skip() const { return skip_; }

 private:
  std::unique_ptr<ShardedStateOnRankZero> sharded_;
  const Program* program_;
  const Scope* scope_;
  Scope gathered_;  // rank 0 under model parallelism: the whole tensors (others shared)
  std::set<std::string> skip_;
};

// Loads a complete checkpoint into this rank's part of `main`: `load(scope, program, skip)` reads
// the file's tensors for `program`'s persistables but `skip` into `scope` (exe's scope, or under
// tensor parallelism a scope of its own, on the CPU, with the whole shapes), after which each rank
// keeps its part in exe's scope. Afterwards the caller runs rebuild_pass_made_vars as usual.
void LoadThisRanksPart(
    Executor& exe, const Program& main,
    const std::function<void(Scope& scope, const Place& place, const Program& program,
                             const std::set<std::string>& skip)>& load);

namespace internal {
// fleet's eager-ring broadcast (fleet.cc): every rank calls it in the same order with a CPU
// tensor of the same dtype and shape; `api` names the call in errors.
void EagerBroadcast(Tensor* tensor, int root, const std::string& api);
}  // namespace internal

}  // namespace fleet
}  // namespace keel
