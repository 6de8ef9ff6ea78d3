// The math ops on CUDA: the kernels are math_ops.h's, their GEMMs cuBLAS (row-major GEMMs mapped
// onto its column-major calls; TF32 only with FLAGS_allow_tf32) and their element-wise work
// launches of the shared functors (ops/device.h's vocabulary in ops/cuda_util.cuh).
#include "ops/cuda_util.cuh"
#include "ops/math_ops.h"

namespace keel {

KEEL_REGISTER_KERNEL(CUDA, mul, MulKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, mul_grad, MulGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, matmul, MatMulKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, matmul_grad, MatMulGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, elementwise_add, ElementwiseAddKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, elementwise_sub, ElementwiseSubKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, elementwise_mul, ElementwiseMulKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, elementwise_div, ElementwiseDivKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, elementwise_add_grad, ElementwiseAddGradKernel, float, double, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CUDA, elementwise_sub_grad, ElementwiseSubGradKernel, float, double, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CUDA, elementwise_mul_grad, ElementwiseMulGradKernel, float, double, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CUDA, elementwise_div_grad, ElementwiseDivGradKernel, float, double, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CUDA, sum, SumKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, sum_grad, SumGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, scale, ScaleKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, scale_grad, ScaleGradKernel, float, double, bfloat16, float16);

}  // namespace keel
