// LocalSGDPass: Paddle's LocalSGD for data parallelism (DistributedStrategy.use_local_sgd).
//
// Requires: main holds forward, backward and optimizer ops (minimize ran), without gradient
//   merge (refused: a keel::Error); startup initializes every parameter.
// Guarantees:
//   startup: what GradAllReducePass puts there (rings, parameters broadcast from rank 0), then a
//     snapshot "P@LOCAL_SGD_SNAPSHOT" = P of every parameter P, and the int64 counters and
//     constants of the schedule, persistable: @LOCAL_SGD_STEP@ (steps run), @LOCAL_SGD_SINCE@
//     (steps since the last average), @LOCAL_SGD_WARMUP@, @LOCAL_SGD_K@;
//   main: no gradient all-reduce and no loss scaling (each rank steps alone on its own loss);
//     after the optimizer ops, both counters are incremented and a conditional_block runs
//     sub-block 1 when STEP <= WARMUP (synchronous warm-up: every step) or SINCE >= K. The
//     sub-block averages the parameters: P = S - allreduce_sum(S - P) / nranks with S the
//     snapshot (on ring i % rings.nrings for the i-th parameter), then S = P and SINCE = 0.
//   With plain SGD and K = 1 this is synchronous data parallelism: the average of the ranks' steps
//   from equal parameters is the step on the averaged gradient.
// Leaves alone: forward, backward and optimizer ops.
#pragma once

#include <cstdint>
#include <utility>

#include "framework/runtime/scope.h"
#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

struct LocalSGDOptions {
  RingOptions rings;
  int steps = 1;         // K: steps between two averages (>= 1)
  int warmup_steps = 0;  // synchronous steps first (>= 0)
};

class LocalSGDPass : public Pass {
 public:
  explicit LocalSGDPass(LocalSGDOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "local_sgd"; }
  void Apply(Program& main, Program& startup) const override;

 private:
  LocalSGDOptions options_;
};

// Whether the ranks have just averaged after `steps_done` steps of a schedule with `warmup`
// synchronous steps and then an average every `k`: then every rank holds the same parameters,
// and a checkpoint of rank 0's is the job's state.
bool LocalSGDAveragedAfter(int64_t steps_done, int64_t warmup, int64_t k);

// Whether `scope` holds LocalSGD's counters and, after `steps_done` steps, the ranks are between
// two averages (each holds its own parameters).
bool LocalSGDBetweenAverages(const Scope& scope, int64_t steps_done);

// For a program LocalSGDPass rewrote, after its checkpoint of `steps_done` steps was loaded and
// its pass-made state rebuilt from it (snapshots = parameters, counters at their start): sets
// @LOCAL_SGD_STEP@ and @LOCAL_SGD_SINCE@ in `scope` to where an uninterrupted run is after that
// many steps, so that the warm-up is not repeated and the next average comes when it would have.
// A keel::Error when the checkpoint was taken between two averages (rank 0's own parameters then,
// from which no rank could continue as it was), or when `main`'s optimizer keeps accumulators
// (momentum's velocity, Adam's moments): LocalSGD averages parameters only, so those are each
// rank's own and the checkpoint holds rank 0's. Does nothing to a scope without the counters.
void ResumeLocalSGDCounters(const Program& main, Scope& scope, int64_t steps_done);

}  // namespace transpiler
}  // namespace keel
