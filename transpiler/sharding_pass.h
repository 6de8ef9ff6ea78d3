// ShardingPass: ZeRO stage 1 (Paddle's sharding meta-optimizer at stage 1, PyTorch's
// ZeroRedundancyOptimizer): every rank keeps the whole model but only its own share of the
// optimizer's state, and updates only its own parameters. Used instead of GradAllReducePass.
//
// Requires: main holds forward, backward (the loss-grad op carries op_role = Backward|Loss, each
//   parameter gradient's last writer carries op_role_var) and the optimizer section as minimize
//   left it (each update op, and any op of its own such as weight decay, carries op_role_var =
//   [param, grad]); every gradient has a known shape and one dtype; startup initializes every
//   parameter and each optimizer state var (a fill op per var). After backward, no op outside a
//   parameter's own updates reads a gradient, but check_finite_and_unscale and
//   clip_by_global_norm (rewritten below); another one is a keel::Error naming it.
// Guarantees (options.rings.nranks = N ranks, this rank = options.rings.rank):
//   owners: the parameters that have update ops, in the order main declares them, are dealt to
//     ranks 0..N-1 in contiguous runs balanced by element count (a parameter goes to the rank
//     whose share of the running total its middle element falls in; PlanSharding). A rank may
//     own nothing.
//   startup: the rings and every parameter broadcast from rank 0 (AppendRingsAndParamBroadcast);
//     the fill ops and declarations of the optimizer state of parameters this rank does not own
//     are removed, so the state's bytes on a rank are those of its own parameters.
//   main: the loss gradient is scaled by 1/N where it is filled (as plain data parallelism
//     does, so the update is the same); before the first backward op a coalesce_tensor makes
//     every gradient a slice of "@SHARDING_GRAD@", laid out by owner (rank 0's gradients, then
//     rank 1's...), each owner's run padded by a var "@SHARDING_PAD@r" to the largest owner's
//     length S; after the last gradient is written, c_sync_calc_stream, one c_reducescatter of
//     that buffer into "@SHARDING_GRAD@SHARD" ([S], this rank's summed slice) and
//     c_sync_comm_stream on ring 0; then a split of the slice and a reshape per owned gradient
//     put the summed values back into this rank's gradients. The update ops (and their own
//     ops) of the parameters this rank does not own are removed; their state vars stay declared
//     in main (persistable) so that a checkpoint can hold them. At the end of block 0, a
//     c_broadcast of every parameter from its owner, in declaration order, then one
//     c_sync_comm_stream: every rank ends the step with every updated parameter.
//   AMP (after backward): check_finite_and_unscale checks and unscales only the owned gradients,
//     then its FoundInfinite is cast to int32, c_allreduce_max'ed on ring 0 and cast back, so
//     every rank skips the same steps and keeps the same loss scale as plain data parallelism.
//   global-norm clipping: clip_by_global_norm becomes: the norm of the owned gradients
//     ("@SHARDING_NORM@LOCAL", a clip_by_global_norm with an unreachable clip norm; 0 when the
//     rank owns nothing), a c_allgather of the ranks' norms, a split and a concat of the other
//     ranks' norms ("@SHARDING_NORM@OTHERS"), and a clip_by_global_norm of [those norms, the
//     owned gradients]: its sum of squares is the one over every gradient, as plain data
//     parallelism's (float rounding aside), and it clips the owned gradients by it.
//   a pipeline stage (PipelineAccumulators finds its gradient accumulators, which the updates
//     read; options.rings is the stage's data-parallel group): the gradients are the
//     accumulators, summed over the micro-batches, so instead of the coalesce and the
//     reduce-scatter in backward, at the head of the optimizer section (op_role Optimize, once
//     per mini-batch) each accumulator is reshaped to "<acc>@FLAT" and, with zero pads
//     ("@SHARDING_PAD@r", fill_constant), concatenated by owner into "@SHARDING_GRAD@", reduce-
//     scattered into "@SHARDING_GRAD@SHARD", and this rank's part split and reshaped back into
//     its own accumulators; the AMP and clipping rewrites follow it; a stage without the loss
//     gets no loss-gradient scale (the last stage's reaches it through the transfers); the
//     fill_zeros_like of every accumulator stays.
// Leaves alone: forward and backward ops, the optimizer ops of owned parameters and the ops
//   shared by all updates (learning-rate schedule), sub-blocks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

// Who owns what, computed from main as minimize left it (before ShardingPass removes updates).
struct ShardingPlan {
  struct Param {
    std::string name, grad;
    int64_t numel = 0;
    int owner = 0;
    std::vector<std::string> state;  // persistable vars only this parameter's updates use
  };
  std::vector<Param> params;  // in declaration order; owners are non-decreasing
  std::vector<int64_t> load;  // elements owned per rank
  int64_t slice = 0;          // the largest load: every rank's slice of the fused buffer

  // The owner of each state var.
  std::map<std::string, int> StateOwners() const;
};
ShardingPlan PlanSharding(const Program& main, int nranks);

struct ShardingOptions {
  RingOptions rings;  // nrings must be 1
};

class ShardingPass : public Pass {
 public:
  explicit ShardingPass(ShardingOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "sharding"; }
  void Apply(Program& main, Program& startup) const override;

 private:
  ShardingOptions options_;
};

}  // namespace transpiler
}  // namespace keel
