// dropout on CUDA: the kernels are dropout_ops.h's, the same Philox draws as on the CPU.
#include "ops/cuda_util.cuh"
#include "ops/dropout_ops.h"

namespace keel {

KEEL_REGISTER_KERNEL(CUDA, dropout, DropoutKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, dropout_grad, DropoutGradKernel, float, double, bfloat16, float16);

}  // namespace keel
