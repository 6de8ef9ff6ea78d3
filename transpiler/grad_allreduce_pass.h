// GradAllReducePass: Paddle's collective GradAllReduce for data parallelism.
//
// Requires: main holds forward, backward (append_backward: the loss-grad op carries
//   op_role = Backward|Loss, each param grad's last writer carries op_role_var) and optimizer
//   ops; startup initializes every parameter.
// Guarantees:
//   startup: one c_comm_init per ring (options.rings.nrings rings), then a c_broadcast of every
//     parameter (AMP O2: its master, then it) from rank 0 and a c_sync_comm_stream, so all ranks
//     start equal;
//   main: a backward op that writes parameter gradients and other outputs, of a type that
//     computes its outputs apart (OpTraits::outputs_apart: mul_grad, matmul_grad, conv2d_grad),
//     and that the collectives below follow, is split into two ops of its type: the parameter
//     gradients first (same values), the other outputs after the collectives, so that the
//     all-reduce overlaps the computation of the input gradient;
//     the loss gradient is scaled by 1/nranks right after it is filled; right after the op
//     that last writes each parameter gradient, c_sync_calc_stream then c_allreduce_sum on ring
//     (i % nrings), i counting gradients in the order backward produces them; one
//     c_sync_comm_stream per ring before the first optimizer op;
//   with options.fuse: gradients, in the order backward produces them, are
//     grouped per dtype (a gradient of another dtype between two does not close a group; up to
//     fuse_mb megabytes and fuse_num tensors; a gradient over the size limit alone; with
//     group_bytes, a group also closes once it holds that many bytes), or, with options.paddle_fuse
//     (Paddle's fusion flags), as Paddle groups them: a layer's W and b together, layers merged up
//     to FLAGS_fuse_parameter_memory_size MB (0: one group); before the first backward op a
//     coalesce_tensor per group makes its gradients slices of a new var "@FUSED_GRAD@k", and
//     right after the group's last gradient is written, c_sync_calc_stream then one
//     c_allreduce_sum of that buffer on ring (k % nrings);
//   with options.hierarchical and two nodes or more: intra- and inter-node rings
//     per flat ring in startup; per group a reduce-scatter inside the node, an all-reduce across
//     nodes and an all-gather inside the node. On one node it warns and uses the flat ring.
//   with options.comm_dtype float16 or bfloat16 (fp16_allreduce; float32 gradients only): the
//     loss gradient is not scaled; each all-reduced float32 var (a gradient, or a fused buffer:
//     fusion groups and fuses as above) is cast to "<var>.cast_fp16" / ".cast_bf16" right before
//     its c_sync_calc_stream, that var is all-reduced, then cast back into <var> and scaled by
//     1/nranks in float32 right after the all-reduce. A bfloat16 gradient under bfloat16 (as
//     NarrowGradsPass makes them where they are computed, or any other) is all-reduced as it is,
//     fused with the other bfloat16 ones; a gradient of another dtype is a keel::Error naming it.
//     With gradient merge or hierarchy it is a keel::Error (not built).
//   with options.amp_low_precision_grads: a parameter gradient whose last writer is a cast (cast
//     or cast_grad) from a float16/bfloat16 var that no other op reads is replaced, for all of the
//     above, by that 16-bit var (its writer takes the op_role_var pair), and the cast moves to
//     right after the collective that completes it (its own all-reduce, or its fused buffer's);
//   after GradientMergePass (FindGradientMerge finds its conditional_block): nothing per run in
//     block 0 but the loss-gradient scale; first in the merge sub-block, c_sync_calc_stream then
//     c_allreduce_sum of each merged buffer on ring (i % nrings), then one c_sync_comm_stream per
//     ring, so the all-reduces run once per merge step, before the avg scale, the overflow check
//     and the updates. Fusion or hierarchy there is a keel::Error (not built).
//   after PipelinePass (PipelineAccumulators finds a stage's gradient accumulators): nothing
//     per micro-batch in block 0 but the loss-gradient scale; first in the optimizer section
//     (op_role Optimize, so once per mini-batch), the all-reduce of the accumulators on ring
//     (k % nrings), in the groups fusion makes as above (none: one per accumulator): a group of
//     one in place, a larger one reshaped to "<acc>@FLAT", concatenated into "@PP_FUSED_GRAD@k",
//     all-reduced, split and reshaped back (fp16_allreduce's casts around each all-reduce); then
//     one c_sync_comm_stream per ring: before the overflow check, the clip and the updates.
//     Hierarchy there is a keel::Error (not built).
// Leaves alone: forward and optimizer ops, block structure; declares no vars but the fused
//   buffers and (comm_dtype) their 16-bit copies.
#pragma once

#include <utility>

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

// Startup for any data-parallel pass: one c_comm_init per ring, then a c_broadcast of every
// parameter of `main` from rank 0 (after its float32 master "<param>.master" when AMP O2 gave it
// one) and a c_sync_comm_stream. A parameter the startup program does
// not initialize is a keel::Error naming it.
void AppendRingsAndParamBroadcast(const Program& main, Program& startup, const RingOptions& rings);

struct GradAllReduceOptions {
  RingOptions rings;
  // Fusion: gradients grouped into buffers of at most fuse_mb megabytes and fuse_num tensors.
  bool fuse = false;
  double fuse_mb = 32;
  int fuse_num = 8;
  // With fuse (and not paddle_fuse), > 0: a group closes once it holds this many bytes (fleet
  // derives it from the ring's measured latency and bandwidth), within fuse_mb and fuse_num;
  // 0: groups fill up to fuse_mb and fuse_num.
  double group_bytes = 0;
  // With fuse: group as Paddle's coalesce_grad_tensor_pass does instead (FLAGS_fuse_parameter_
  // memory_size and _groups_size; fleet/distributed_strategy.h says what the values mean).
  bool paddle_fuse = false;
  double paddle_fuse_memory_size_mb = -1;
  int paddle_fuse_groups_size = 1;
  // Reduce-scatter inside a node, all-reduce across nodes, all-gather inside the node, with
  // ranks_per_node ranks per node (at least 1, dividing rings.nranks).
  bool hierarchical = false;
  int ranks_per_node = 1;
  // fp16_allreduce: kFloat16 or kBFloat16 all-reduces the float32 gradients in that type;
  // kFloat32: as they are.
  DType comm_dtype = DType::kFloat32;
  // AMP (Paddle's update_role_var_grad): a float32 parameter gradient that a cast makes from a
  // 16-bit gradient nothing else reads (AMP O1's weights) is all-reduced as that 16-bit gradient,
  // and the cast runs after the all-reduce: half the bytes.
  bool amp_low_precision_grads = false;
  // false: a pipeline stage before the last (transpiler/pipeline_pass.h), whose program has no
  // loss-gradient op: its gradients come from the last stage, where the 1/nranks scale is.
  bool has_loss = true;
};

class GradAllReducePass : public Pass {
 public:
  explicit GradAllReducePass(GradAllReduceOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "grad_allreduce"; }
  void Apply(Program& main, Program& startup) const override;

 private:
  GradAllReduceOptions options_;
};

}  // namespace transpiler
}  // namespace keel
