// NarrowGradsPass: fp16_allreduce in bfloat16 without its casts. A float32 parameter's gradient is
// made 16-bit by the op that computes it and read 16-bit by its update.
//
// fp16_allreduce (GradAllReducePass with a 16-bit comm_dtype) casts each float32 gradient, or the
// fused buffer holding it, to 16 bits before its all-reduce and back after: two passes over every
// gradient's memory, 0.41 ms of the seed MLP's 7.4 ms step on 2 workers of one core each, five
// times the 0.08 ms that halving the all-reduce's bytes saves there. Where the op that computes a
// gradient can store it rounded (OpTraits::narrows_outputs: the weight gradient of mul_grad and
// fused_gemm_epilogue_grad, whose GEMM rounds each block of its result while the block is in the
// core's cache, and the bias gradient of the latter and of elementwise_add_grad) and the only op
// that reads it is an update that
// widens it as it reads it (OpTraits::widens_inputs: sgd, momentum, adam, adamw), this pass makes
// the gradient's var 16-bit. GradAllReducePass then all-reduces it, or the fused buffer of such
// gradients, as it is, with no cast before or after. The update computes what it did with the
// casts, bit for bit: the gradient rounded once, summed across the ranks the same way (where a
// ring sums each element in rank order: shared memory, and any ring of 2 ranks), widened exactly.
//
// Requires: a float32 training program, backward and the updates appended (op_role_var pairs on
//   the gradients' writers, as append_backward leaves them), before GradAllReducePass, which runs
//   with comm_dtype = the pass's dtype. dtype is bfloat16 (float16 is a keel::Error naming it:
//   fp16_allreduce in float16 divides each sum by the ranks in float32 after the all-reduce, which
//   needs the float32 gradient back).
// Guarantees: for each (param, grad) pair of op_role_var on the global block's ops, when
//   - grad is float32, neither persistable nor row-sparse;
//   - exactly one op writes grad, in the global block, through an output slot its type narrows,
//     with a float32 kernel (OpRegistry::KernelDType);
//   - at least one op reads grad, and every op that reads it is in the global block and reads it
//     through input slots its type widens only;
//   grad's var becomes dtype. narrowed() lists those gradients, in the order of their pairs.
// Leaves alone: a gradient that another op reads (a clip, an L2 weight decay, gradient merge's
//   accumulation) or writes (a parameter read twice: its partial gradients' sum), or whose writer
//   cannot store it rounded (conv2d_grad's filter gradient, batch and layer norms' scale and bias
//   gradients); every op; the startup program.
#pragma once

#include <string>
#include <vector>

#include "framework/runtime/dtype.h"
#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

class NarrowGradsPass : public Pass {
 public:
  explicit NarrowGradsPass(DType dtype = DType::kBFloat16) : dtype_(dtype) {}
  std::string name() const override { return "narrow_grads"; }
  void Apply(Program& main, Program& startup) const override;
  const std::vector<std::string>& narrowed() const { return narrowed_; }

 private:
  DType dtype_;
  mutable std::vector<std::string> narrowed_;
};

}  // namespace transpiler
}  // namespace keel
