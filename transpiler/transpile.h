// The collective transpiler's pipeline: which passes a strategy asks for, in order.
//
// Requires: main holds forward, backward and optimizer ops (Optimizer::minimize); startup
//   initializes every parameter; the strategy is validated for the role.
// Guarantees: with role.world_size > 1, LocalSGDPass when strategy.use_local_sgd, else
//   GradAllReducePass (fusion and hierarchy are its options); nothing with one worker.
// Leaves alone: everything the chosen pass leaves alone; starts no communication, so `keel
//   inspect --strategy` prints a job's programs without any worker.
#pragma once

#include "fleet/distributed_strategy.h"
#include "fleet/role_maker.h"
#include "framework/ir/program.h"

namespace keel {
namespace transpiler {

void TranspileCollective(Program& main, Program& startup,
                         const fleet::DistributedStrategy& strategy, const fleet::Role& role);

}  // namespace transpiler
}  // namespace keel
