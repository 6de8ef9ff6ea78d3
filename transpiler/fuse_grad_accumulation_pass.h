// FuseGradAccumulationPass: gradient merge's accumulation done by the ops that make the gradients.
//
// GradientMergePass adds each run's gradient G into its persistable buffer with a
// sum(G@GRAD_MERGED, G) -> G@GRAD_MERGED after backward: the op that makes G writes it to memory,
// and the sum reads it back beside the buffer and writes the buffer, a pass over three times G's
// bytes at every run. Where that op can add its result into the values its output var holds
// (OpTraits::accumulates_outputs: the weight gradients of mul_grad and fused_gemm_epilogue_grad,
// whose GEMM adds each cache-sized block of its product as it makes it, and the latter's bias
// gradient), this pass points the op's output at the
// buffer itself and lists the slot in its attribute accumulate_into; the sum and G go. (Megatron
// calls this gradient accumulation fusion.)
//
// Requires: GradientMergePass has run (its sums in the global block, the buffers persistable and
//   zeroed by startup); after FuseGemmEpiloguePass when that runs (which leaves a mul_grad that
//   accumulates whole), before the data-parallel passes. Fleet's minimize runs it with gradient
//   merge (fleet/transpile.h) and maps the (parameter, gradient) pairs it returns to the buffers.
// Guarantees: for each sum op of the global block with X = [B, G] and Out = B, B persistable and
//   named G + "@GRAD_MERGED", when G is written by exactly one op W of the global block, through an
//   output slot W's type accumulates, and read by the sum alone, and W's kernel dtype is G's:
//   W writes B instead of G, its accumulate_into attribute lists that slot, the sum is removed
//   and so is G's var. The buffer then holds, after each run, what it held plus the run's
//   gradient, bit for bit as with the sum: the gradient rounded to float32, then added
//   (Device::GemmAdd; a GEMM with beta 1 would add inside oneDNN's sums, and took 2.6 ms where the
//   GEMM and the sum took 2.4). fused() lists the buffers.
// Leaves alone: a gradient another op reads or writes (a parameter read twice: the sum of its
//   partial gradients), or made by an op that cannot accumulate (a convolution's, a norm's, an
//   unfused bias add's); sub-blocks; the startup program.
#pragma once

#include <string>
#include <vector>

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

class FuseGradAccumulationPass : public Pass {
 public:
  std::string name() const override { return "fuse_grad_accumulation"; }
  void Apply(Program& main, Program& startup) const override;
  const std::vector<std::string>& fused() const { return fused_; }

 private:
  mutable std::vector<std::string> fused_;
};

}  // namespace transpiler
}  // namespace keel
