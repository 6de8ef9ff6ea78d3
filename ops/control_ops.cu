// The control-flow ops on CUDA: the kernels are control_ops.h's (conditional_block copies its
// one-byte condition to the host and waits; the comparisons and logical ops are element-wise
// launches), assign's ops/device.h's.
#include "ops/control_ops.h"
#include "ops/cuda_util.cuh"

namespace keel {

KEEL_REGISTER_KERNEL(CUDA, conditional_block, ConditionalBlockKernel, bool);
KEEL_REGISTER_KERNEL(CUDA, less_than, CompareOp<fn::LessThan>::Kernel, float, double, int32_t,
                     int64_t);
KEEL_REGISTER_KERNEL(CUDA, less_equal, CompareOp<fn::LessEqual>::Kernel, float, double, int32_t,
                     int64_t);
KEEL_REGISTER_KERNEL(CUDA, greater_than, CompareOp<fn::GreaterThan>::Kernel, float, double, int32_t,
                     int64_t);
KEEL_REGISTER_KERNEL(CUDA, greater_equal, CompareOp<fn::GreaterEqual>::Kernel, float, double,
                     int32_t, int64_t);
KEEL_REGISTER_KERNEL(CUDA, equal, CompareOp<fn::Equal>::Kernel, float, double, int32_t, int64_t);
KEEL_REGISTER_KERNEL(CUDA, not_equal, CompareOp<fn::NotEqual>::Kernel, float, double, int32_t,
                     int64_t);
KEEL_REGISTER_KERNEL(CUDA, logical_and, LogicalOp<true>::Kernel, bool);
KEEL_REGISTER_KERNEL(CUDA, logical_or, LogicalOp<false>::Kernel, bool);
KEEL_REGISTER_KERNEL(CUDA, assign, CopyKernel, float, double, int32_t, int64_t, bool, bfloat16,
                     float16);

}  // namespace keel
