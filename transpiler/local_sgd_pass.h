// LocalSGDPass: Paddle's LocalSGD for data parallelism (DistributedStrategy.use_local_sgd).
//
// Requires: main holds forward, backward and optimizer ops (minimize ran); startup initializes
//   every parameter.
// Guarantees:
//   startup: what GradAllReducePass puts there (rings, parameters broadcast from rank 0), then a
//     snapshot "P@LOCAL_SGD_SNAPSHOT" = P of every parameter P, and the int64 counters and
//     constants of the schedule, persistable: @LOCAL_SGD_STEP@ (steps run), @LOCAL_SGD_SINCE@
//     (steps since the last average), @LOCAL_SGD_WARMUP@, @LOCAL_SGD_K@;
//   main: no gradient all-reduce and no loss scaling (each rank steps alone on its own loss);
//     after the optimizer ops, both counters are incremented and a conditional_block runs
//     sub-block 1 when STEP <= WARMUP (synchronous warm-up: every step) or SINCE >= K. The
//     sub-block averages the parameters: P = S - allreduce_sum(S - P) / nranks with S the
//     snapshot (on ring i % nccl_comm_num for the i-th parameter), then S = P and SINCE = 0.
//   With plain SGD and K = 1 this is synchronous data parallelism: the average of the ranks' steps
//   from equal parameters is the step on the averaged gradient.
// Leaves alone: forward, backward and optimizer ops.
#pragma once

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

class LocalSGDPass : public Pass {
 public:
  std::string name() const override { return "local_sgd"; }
  void Apply(Program& main, Program& startup, const fleet::DistributedStrategy& strategy,
             const fleet::Role& role) const override;
};

}  // namespace transpiler
}  // namespace keel
