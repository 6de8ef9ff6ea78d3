// PipelinePass: pipeline parallelism (Paddle's PipelineOptimizer; DistributedStrategy::pipeline,
// docs/pipeline.md). The program is cut into `degree` stages; this rank keeps its stage's ops and
// parameters, exchanges activations and their gradients with the neighbouring stages through
// send_v2 / recv_v2 on the pipeline group's ring, and accumulates its gradients over the
// micro-batches of a mini-batch so that its optimizer runs once per mini-batch
// (fleet/pipeline_runner.h runs the sections per micro-batch).
//
// Requires: main's global block holds forward ops, each marked with the stage it was built in
//   (op_device "stage:<n>", framework/dsl/pipeline.h), then backward (append_backward: the loss
//   gradient's op carries op_role Backward|Loss, each parameter gradient's last writer carries
//   op_role_var) and the optimizer section (op_role Optimize); no sub-block and no collective
//   but the model's own: the tensor-parallel ones (ring kTensorParallelRingId, which each stage's
//   tensor-parallel group runs as it is) and sync batch norm's (each stage's data-parallel
//   replicas normalize each micro-batch together on their ring) yet (the pass runs before the
//   data-parallel passes). The marks use exactly the stages 0 .. degree-1; a forward var flows from
//   a stage to the same or a later one; a parameter is read by one stage only.
// Places every op on a stage: a forward op where it is marked; a backward op where it is marked
//   (grad ops copy their forward op's mark), else, when it writes a gradient, where that
//   gradient's forward var lives (the loss gradient on the last stage; a `sum` of gradient parts
//   where the summed var was made), else on the latest stage of its inputs; an optimizer op with
//   a Param on that parameter's stage, and one without (a learning-rate schedule) on every stage
//   that reads what it writes. A var lives where it is written (a parameter or data var where it
//   is first read).
// Guarantees, for stage = options.stage:
//   main: the ops placed on this stage, in their order; before them, in the original order, for
//     every var that one stage writes and another reads: at the writer's position, on each stage
//     of the chain from the writer to the farthest reader (forward vars to later stages, gradients
//     to earlier ones, relayed by the stages between), a recv_v2 from the previous stage of the
//     chain and a send_v2 to the next one (ring kPipelineRingId, peer = the neighbour's stage,
//     tag = the var's index among transferred vars, out_shape = the var's shape with a -1 dim 0
//     set to options.micro_batch_size when it is > 0; op_role of the writer);
//     the loss gradient's value multiplied by 1/micro_batches (on the last stage);
//     per parameter gradient G of this stage: persistable "G@PP_ACC" (G's dtype and shape), a
//     `sum(G@PP_ACC, G) -> G@PP_ACC` (role Backward) right after G's last writer; the optimizer
//     ops read G@PP_ACC instead of G (and op_role_var says so); after the last optimizer op a
//     fill_zeros_like of each G@PP_ACC (role Optimize);
//     the vars no kept op uses are dropped (so later passes see only this stage's parameters).
//     with AMP's loss scaling: the check_finite_and_unscale (an optimizer op of every stage)
//     checks and unscales this stage's gradient accumulators only, and its FoundInfinite becomes
//     the maximum over the stages (InsertOverflowFlagMax on ring kPipelineRingId), so that every
//     stage skips the same steps and moves the loss scale alike;
//   startup: the ops that make what this stage's main reads; the other ops without inputs (other
//     stages' initializers) stay in place writing "<var>@PP_OTHER_STAGE" temporaries instead, so
//     that every op keeps its index and, with a program random seed, draws what it draws in the
//     whole program (the executor seeds unseeded ops by index): PP=N initializes as one process;
//     other ops are dropped, and vars no op uses; then a fill_constant 0 of each G@PP_ACC, then
//     c_comm_init of ring kPipelineRingId (nranks = degree, rank = stage, options.group,
//     options.device; host_staged on a GPU: buffered transfers through host memory, never NCCL's
//     in-stream send / receive).
// Leaves alone: the ops kept (attributes but the loss value, inputs but gradients renamed), the
//   positions of startup ops without inputs.
// A keel::Error names the op, var or setting for: an unmarked forward op, a mark outside
//   0..degree-1, marks that do not use every stage (naming pipeline_configs.pp_degree), a forward
//   var read by an earlier stage, a parameter read by two stages, an op needed by several stages
//   that reads a var of one stage (a global-norm clip over the stages), a program with
//   collectives (but the tensor-parallel ones) or sub-blocks.
#pragma once

#include <string>
#include <vector>

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

// The pipeline group's ring (ids below are the data-parallel passes' and 32 tensor parallel's).
inline constexpr int kPipelineRingId = 33;
// The suffix of a gradient's accumulator.
inline constexpr const char* kPipelineAccSuffix = "@PP_ACC";
// The suffix of the temporary another stage's initializer writes in this stage's startup.
inline constexpr const char* kPipelineOtherStageSuffix = "@PP_OTHER_STAGE";

struct PipelineOptions {
  int degree = 2;            // stages
  int stage = 0;             // this rank's stage (its index in the pipeline group)
  int micro_batches = 1;     // per mini-batch (DistributedStrategy::pipeline_configs.
                             // accumulate_steps)
  int micro_batch_size = 0;  // rows per micro-batch when known (recv_v2's static dim 0); 0: -1
  int device = -1;           // this rank's GPU (c_comm_init's device_id); -1 on CPU
  std::string group;         // c_comm_init's group (fleet::Topology::PpGroupName)
};

// The gradient accumulators of a stage's main block (the vars its `sum(G@PP_ACC, G)` ops
// write), in the order backward completes them; empty for a block no PipelinePass made.
std::vector<std::string> PipelineAccumulators(const Block& main);

// The stage of an op_device value "stage:<n>"; -1 for anything else.
int ParsePipelineStage(const std::string& op_device);

class PipelinePass : public Pass {
 public:
  explicit PipelinePass(PipelineOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "pipeline"; }
  void Apply(Program& main, Program& startup) const override;

 private:
  PipelineOptions options_;
};

}  // namespace transpiler
}  // namespace keel
