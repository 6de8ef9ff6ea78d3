// ExecutionStrategy: how an executor runs a program (worker threads, scope drops, CUDA graphs),
// in its own header so that fleet's DistributedStrategy holds one without the executor.
#pragma once

#include <string>

#include "framework/ir/program.h"

namespace keel {

// Paddle's ExecutionStrategy. Every field has an effect; a value out of range is a keel::Error
// naming the field.
struct ExecutionStrategy {
  // Workers that run ready ops at once (>= 0). They share the process's CPU thread budget
  // (--cpu_math_threads; under keel launch cores / nproc) with the kernels' intra-op pieces, so
  // workers beyond the budget wait for a core. 0: the budget, at most the most ops the program
  // can run at once.
  int num_threads = 0;
  // Temporaries are released (and their memory returned to the system) every this many runs of
  // a program (>= 1).
  int num_iteration_per_drop_scope = 100;
  // CUDA places: after two warm-up runs the step (feed copies, kernels, NCCL calls) is captured
  // into a CUDA graph once and replayed as one launch, with the same bits as a plain run; new feed
  // shapes, a changed program or a scope drop capture again (executor/graph_capture.h). A
  // program with an op that cannot be captured, a CPU place, or FLAGS_check_nan_inf is refused.
  bool use_cuda_graph = false;
};

// The executor that runs `program` uses `strategy` for it, whatever the executor's own
// (fleet::distributed_optimizer(...).minimize attaches DistributedStrategy::exec_strategy to
// fleet::main_program() this way). Validates the strategy.
void AttachExecutionStrategy(const Program& program, const ExecutionStrategy& strategy);
// The attached strategy, or nullptr.
const ExecutionStrategy* AttachedExecutionStrategy(const Program& program);
// Throws a keel::Error naming the first field out of range; `where` prefixes the message.
void ValidateExecutionStrategy(const ExecutionStrategy& s, const std::string& where);

}  // namespace keel
