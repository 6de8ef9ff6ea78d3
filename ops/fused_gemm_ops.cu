// fused_gemm_epilogue on CUDA: fused_gemm_ops.h's kernels, their GEMMs cuBLAS (as mul's) and the
// bias add and its column sums launches of the shared broadcast loops.
#include "ops/cuda_util.cuh"
#include "ops/fused_gemm_ops.h"

namespace keel {

KEEL_REGISTER_KERNEL(CUDA, fused_gemm_epilogue, FusedGemmEpilogueKernel, float, double, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CUDA, fused_gemm_epilogue_grad, FusedGemmEpilogueGradKernel, float, double,
                     bfloat16, float16);

}  // namespace keel
