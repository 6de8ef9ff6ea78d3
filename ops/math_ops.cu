// The math ops on CUDA: the kernels are math_ops.h's, their GEMMs cuBLAS (row-major GEMMs mapped
// onto its column-major calls; TF32 only with FLAGS_allow_tf32) and their element-wise work
// launches of the shared functors (ops/device.h's vocabulary in ops/cuda_util.cuh).
#include "ops/cuda_util.cuh"
#include "ops/math_ops.h"

namespace keel {

KEEL_REGISTER_KERNEL(CUDA, mul, MulKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, mul_grad, MulGradKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, matmul, MatMulKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, matmul_grad, MatMulGradKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, elementwise_add, ElementwiseAddKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, elementwise_sub, ElementwiseSubKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, elementwise_mul, ElementwiseMulKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, elementwise_div, ElementwiseDivKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, elementwise_add_grad, ElementwiseAddGradKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, elementwise_sub_grad, ElementwiseSubGradKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, elementwise_mul_grad, ElementwiseMulGradKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, elementwise_div_grad, ElementwiseDivGradKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, sum, SumKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, sum_grad, SumGradKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, scale, ScaleKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, scale_grad, ScaleGradKernel, float, double);

}  // namespace keel
