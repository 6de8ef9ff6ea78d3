// MergeOptimizerOpsPass: one optimizer op per fused gradient group, so that a CUDA place updates
// the group's parameters in one multi-tensor launch (Paddle's merged_momentum / merged_adam).
//
// Requires: GradAllReducePass has run (fused groups are its coalesce_tensor ops); optimizer ops
//   carry op_role_var = [param, grad] as the DSL appends them.
// Guarantees: the sgd / momentum / adam / adamw ops whose gradient lies in one fused group
//   (directly, or derived from one by ops whose op_role_var names it, as weight decay's
//   grad + coeff * param is) and
//   that agree in type, attrs, LearningRate, SkipUpdate and dtype (two or more of them) become one
//   merged_<type> op with list slots in their order, at the position of the last of them, with
//   op_role_var listing every (param, grad) pair. A group whose ops are interleaved with an op
//   that reads or writes what an earlier one of them wrote, or writes what it read, is left as
//   it is. Results are those of the separate ops, bit for bit (the CPU merged kernel runs the
//   per-parameter kernel for each parameter).
// Leaves alone: multi_precision updates (MasterParam: AMP O2), updates whose Grad's dtype is not
//   Param's (a 16-bit gradient a float32 update widens: NarrowGradsPass), every other op, the
//   vars, startup.
#pragma once

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

class MergeOptimizerOpsPass : public Pass {
 public:
  std::string name() const override { return "merge_optimizer_ops"; }
  void Apply(Program& main, Program& startup) const override;
};

}  // namespace transpiler
}  // namespace keel
