// The collective transpiler's pipeline: which passes a strategy asks for, in order, and each
// pass's options filled from the user's DistributedStrategy and Role.
//
// Requires: main holds forward, backward and optimizer ops (Optimizer::minimize); startup
//   initializes every parameter; the strategy is validated for the role.
// Guarantees: with role.world_size > 1, LocalSGDPass when strategy.use_local_sgd, else
//   GradAllReducePass (fusion and hierarchy are its options) then MergeOptimizerOpsPass; nothing
//   with one worker.
// Leaves alone: everything the chosen passes leave alone; starts no communication, so `keel
//   inspect --strategy` prints a job's programs without any worker.
#pragma once

#include "fleet/distributed_strategy.h"
#include "fleet/role.h"
#include "framework/ir/program.h"
#include "transpiler/grad_allreduce_pass.h"
#include "transpiler/local_sgd_pass.h"

namespace keel {
namespace fleet {

// The rings of `strategy` (nccl_comm_num) and the role's place on them (rank, first GPU).
transpiler::RingOptions RingOptionsFor(const DistributedStrategy& strategy, const Role& role);
transpiler::GradAllReduceOptions GradAllReduceOptionsFor(const DistributedStrategy& strategy,
                                                         const Role& role);
transpiler::LocalSGDOptions LocalSGDOptionsFor(const DistributedStrategy& strategy,
                                               const Role& role);

void TranspileCollective(Program& main, Program& startup, const DistributedStrategy& strategy,
                         const Role& role);

}  // namespace fleet
}  // namespace keel
