// GradAllReducePass: Paddle's collective GradAllReduce for data parallelism.
//
// Requires: main holds forward, backward (append_backward: the loss-grad op carries
//   op_role = Backward|Loss, each param grad's last writer carries op_role_var) and optimizer
//   ops; startup initializes every parameter.
// Guarantees:
//   startup: one c_comm_init per ring (strategy.nccl_comm_num rings), then a c_broadcast of every
//     parameter from rank 0 and a c_sync_comm_stream, so all ranks start equal;
//   main: the loss gradient is scaled by 1/nranks right after it is filled; right after the op
//     that last writes each parameter gradient, c_sync_calc_stream then c_allreduce_sum on ring
//     (i % nccl_comm_num), i counting gradients in the order backward produces them; one
//     c_sync_comm_stream per ring before the first optimizer op;
//   with strategy.fuse_all_reduce_ops: gradients, in the order backward produces them, are
//     grouped (same dtype, up to fuse_grad_size_in_MB megabytes and fuse_grad_size_in_num
//     tensors; a gradient over the size limit alone), or, when Paddle's fusion flags are given
//     (strategy.paddle_fuse), as Paddle groups them: a layer's W and b together, layers merged
//     up to FLAGS_fuse_parameter_memory_size MB (0: one group); before the first backward op a
//     coalesce_tensor per group makes its gradients slices of a new var "@FUSED_GRAD@k", and
//     right after the group's last gradient is written, c_sync_calc_stream then one
//     c_allreduce_sum of that buffer on ring (k % nccl_comm_num);
//   with strategy.use_hierarchical_allreduce and two nodes or more: intra- and inter-node rings
//     per flat ring in startup; per group a reduce-scatter inside the node, an all-reduce across
//     nodes and an all-gather inside the node. On one node it warns and uses the flat ring.
// Leaves alone: forward and optimizer ops, block structure; declares no vars but the fused
//   buffers.
#pragma once

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

// Startup for any data-parallel pass: one c_comm_init per ring (nrings rings), then a c_broadcast
// of every parameter of `main` from rank 0 and a c_sync_comm_stream. A parameter the startup
// program does not initialize is a keel::Error naming it.
void AppendRingsAndParamBroadcast(const Program& main, Program& startup, int nrings,
                                  const fleet::Role& role);

class GradAllReducePass : public Pass {
 public:
  std::string name() const override { return "grad_allreduce"; }
  void Apply(Program& main, Program& startup, const fleet::DistributedStrategy& strategy,
             const fleet::Role& role) const override;
};

}  // namespace transpiler
}  // namespace keel
