// FuseGemmEpiloguePass: DistributedStrategy::fuse_gemm_epilogue (Paddle's BuildStrategy switch of
// that name). Each fully connected layer's mul and bias add become one fused_gemm_epilogue op, and
// their two grad ops one fused_gemm_epilogue_grad (ops/fused_gemm_ops.cc): the add no longer
// reads the product back and writes a second [M, N] tensor, and the add's gradient no longer
// copies dOut for the mul's gradient to read. Results are the unfused program's, bit for bit.
//
// Requires: nothing beyond a valid program; before or after append_backward. Fleet runs it after
//   gradient merge and sync batch norm and before the distributed passes, which then see the fused
//   grad op as the producer of the weight's and bias's gradients (it computes its outputs apart,
//   so the data-parallel pass may still split it to start an all-reduce early).
// Guarantees: in every block, a `mul` (y_num_col_dims 1, a 2-D weight Y [K, N]) whose Out t is
//   read by exactly one forward op, an `elementwise_add` of t and a 1-D bias [N] at axis
//   x_num_col_dims, becomes fused_gemm_epilogue(X, Y, Bias) -> the add's Out, at the add's
//   position (the mul is removed), when no op between them writes X or Y (the bias is read where
//   the add read it, so AMP's cast of it may lie between). Its backward,
//   when there is one, must be the add's elementwise_add_grad (X t) and the mul_grad reading the
//   add_grad's X@GRAD, that grad read by nothing else, with no op between the two that reads or
//   writes the mul_grad's outputs or writes its inputs; they become one fused_gemm_epilogue_grad
//   at the add_grad's position, writing the mul_grad's X@GRAD and Y@GRAD and the add_grad's
//   Y@GRAD, op_role_var the add_grad's then the mul_grad's. A layer whose backward does not match
//   is left whole (forward and backward). The vars t and its gradient are removed. Applying it
//   twice changes nothing more.
// Leaves alone: a mul whose product anything else reads (a row-parallel layer's all-reduce before
//   its bias add), adds of non-bias shapes, matmul, every other op, the startup program.
#pragma once

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

class FuseGemmEpiloguePass : public Pass {
 public:
  std::string name() const override { return "fuse_gemm_epilogue"; }
  void Apply(Program& main, Program& startup) const override;
};

}  // namespace transpiler
}  // namespace keel
