// GradientMergePass: gradient merge (Paddle's GradientMergeOptimizer and gradient_merge pass;
// DistributedStrategy::gradient_merge). Gradients accumulate over k_steps runs of the program in
// persistable buffers; the optimizer section (and, once GradAllReducePass has run, the all-reduce
// of the buffers) runs on every k-th run only, inside a conditional_block. k runs on batches of b
// rows then train as one run on k * b rows (with avg, for a loss that is a mean over the rows).
//
// Requires: main's global block holds forward, backward (each parameter gradient's last writer
//   carries op_role_var, as append_backward leaves it) and after them the optimizer section: the
//   ops with role Optimize that Optimizer::apply_gradients and amp::decorate append (loss
//   scaling's overflow check and scale update, the learning rate schedule, the clip, weight decay,
//   the updates). No collective (but the model's own tensor-parallel ones, on ring
//   kTensorParallelRingId, which run every micro-step as the model does) and no sub-block yet: the
//   pass runs before the data-parallel pass. Every merged gradient is float32 or float64, of known
//   shape.
// Guarantees:
//   startup: per gradient G that an optimizer op reads, "G@GRAD_MERGED" (G's dtype and shape,
//     persistable) filled with zeros; the int64 [1] counter @GRADIENT_MERGE_STEP@ = 0, persistable
//     (runs since the last merge step; a checkpoint holds it and the buffers, so a resume in the
//     middle of an accumulation continues exactly).
//   main block 0: every op with role Optimize leaves it. Where the first of them was, in order:
//     per G, in the order backward produces them, sum(G@GRAD_MERGED, G) -> G@GRAD_MERGED (role
//     Backward); increment of the counter, fill_constant of k into @GRADIENT_MERGE_K@ and
//     greater_equal into @GRADIENT_MERGE_COND@ (role Optimize); a conditional_block on it (role
//     Optimize, op_role_var listing each (parameter, G@GRAD_MERGED)) running a new sub-block:
//       with avg, each G@GRAD_MERGED scaled by 1/k in place;
//       the optimizer ops, in their order, with every G renamed G@GRAD_MERGED (inputs, outputs,
//         op_role_var): the overflow check and loss-scale update decide once per k runs, on the
//         merged gradient; a schedule's counter counts optimizer steps;
//       fill_zeros_like of each G@GRAD_MERGED, and the counter set to 0.
//   A learning-rate schedule's rate var becomes persistable, and startup sets it to the rate of
//     optimizer step 0, so that it can be fetched on any run (the rate of the latest merge step,
//     or of the first before it).
//   With k_steps = 1 every run is a merge step and the parameters are those of the program before,
//   bit for bit.
// Leaves alone: forward and backward ops, ops without role Optimize after the optimizer section
//   (they run after the conditional_block and see the parameters of the last merge step), the
//   other vars the optimizer ops write (declared in block 0, written on merge steps only: the
//   global norm, the overflow flag, weight decay's sums).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "framework/runtime/scope.h"
#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

struct GradientMergeOptions {
  int k_steps = 1;  // runs per optimizer step (>= 1)
  bool avg = true;  // divide the merged gradients by k_steps (Paddle's default)
};

class GradientMergePass : public Pass {
 public:
  explicit GradientMergePass(GradientMergeOptions options) : options_(options) {}
  std::string name() const override { return "gradient_merge"; }
  void Apply(Program& main, Program& startup) const override;

 private:
  GradientMergeOptions options_;
};

// Names the pass gives its vars.
inline const std::string kGradientMergeStepVar = "@GRADIENT_MERGE_STEP@";
inline const std::string kGradientMergeCondVar = "@GRADIENT_MERGE_COND@";
inline const std::string kGradientMergeSuffix = "@GRAD_MERGED";

// What GradientMergePass made of a program, for the passes after it.
struct GradientMergeInfo {
  size_t op = 0;  // the conditional_block's index in block 0
  int block = 0;  // its sub-block
  // (parameter, merged buffer) in the order backward produces the gradients.
  std::vector<std::pair<std::string, std::string>> merged;
};
// nullopt when `main` has no gradient-merge conditional_block.
std::optional<GradientMergeInfo> FindGradientMerge(const Program& main);

// The runs accumulated since the last merge step, as `scope` holds the counter (a checkpoint
// loaded into it); 0 without gradient merge.
int64_t GradientMergeRunsAccumulated(const Scope& scope);

}  // namespace transpiler
}  // namespace keel
