// AmpWeightCopyPass: AMP O1's weight casts kept from step to step, written by the update.
//
// O1 (AmpPass without o2) casts every float32 weight that a white op reads to float16/bfloat16
// in forward ("<w>.cast_bf16") and widens that copy's gradient back in backward (cast_grad), at
// every step: two passes over every such weight (0.38 of the seed MLP's 3.9 ms bf16 step on one
// CPU core). This pass makes the 16-bit copy persistable instead: the weight's update writes it
// beside the weight (the update's multi_precision form, whose float32 master is the weight
// itself), startup makes it, and the update reads the copy's 16-bit gradient, which it widens as
// cast_grad did. The program computes what O1's does, bit for bit: the copy is always the weight
// rounded, as the cast made it, and widening is exact. The weight stays the float32 parameter
// (checkpoints and evaluation programs cloned before minimize read it; fleet's inference export
// restores the casts: RestoreWeightCasts); fleet records the copy as a pass-made var, made again
// from the weight after a load. A program cloned from main after the pass reads the copies, which
// only main's loads remake.
//
// Requires: a whole training program: backward and the updates appended, after the data-parallel
//   passes when there are any and before MergeOptimizerOpsPass (which leaves multi_precision
//   updates alone).
// Guarantees: for each update U of the global block (an op whose schema has a MasterParam input,
//   given none) with Param = ParamOut = w (float32, persistable) and Grad = g, when
//     - nothing but U writes w, and the only other ops that read w are one `cast` C in the global
//       block, w -> c (float16 or bfloat16; c not persistable, written by C alone, read by ops of
//       the global block between C and U only), and the cast_grad below;
//     - g is written by exactly one op, a `cast_grad` B of the global block before U, gc -> g (gc:
//       c's gradient, c's dtype), and no op between B and U writes gc or a fused buffer gc is a
//       slice of (OpTraits::slices_slot / fused_slot: coalesce_tensor);
//     - g is read by U and otherwise only by ops that only order themselves after its writer
//       (OpTraits::only_orders: the stream syncs), in the global block;
//   C and B are removed; c becomes persistable, declared in startup, and startup's new last op is
//   cast w -> c (after every op there that writes w, rank 0's broadcast included); U reads Param
//   c, Grad gc and MasterParam w and writes ParamOut c and MasterParamOut w (op_role_var [c, gc]);
//   the ordering ops read and write gc; g is removed. copied() lists the weights, in the order of
//   their updates.
// Leaves alone: a weight whose gradient another op reads (a clip, a weight decay, gradient merge's
//   accumulation, loss scaling's check_finite_and_unscale) or which another op writes (LocalSGD's
//   averaging, sharding's broadcast) or reads (a black op beside the white one); sub-blocks; every
//   other op and var.
#pragma once

#include <string>
#include <vector>

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

// A weight the pass gave a kept copy, as a rewritten program shows it: the update whose
// MasterParam is a parameter (O2's masters are not) names the weight, its copy (Param) and the
// copy's 16-bit gradient (Grad), which stands for the weight's gradient.
struct WeightCopy {
  std::string weight, copy, grad;
};
std::vector<WeightCopy> FindWeightCopies(const Program& main);

// Undoes the copies' persistence in `program` (a clone to export for inference): each copy is
// made again by a cast of its weight before its first reader, so the model reads the float32
// weights, as O1's always did. The updates are left as they are (an inference export prunes them).
void RestoreWeightCasts(Program& program);

class AmpWeightCopyPass : public Pass {
 public:
  std::string name() const override { return "amp_weight_copy"; }
  void Apply(Program& main, Program& startup) const override;
  // The weights the last Apply gave a kept 16-bit copy.
  const std::vector<std::string>& copied() const { return copied_; }

 private:
  mutable std::vector<std::string> copied_;
};

}  // namespace transpiler
}  // namespace keel
