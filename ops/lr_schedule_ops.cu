// increment and lr_schedule on CUDA: the kernels are lr_schedule_ops.h's, computing on the device
// from the device step counter.
#include "ops/cuda_util.cuh"
#include "ops/lr_schedule_ops.h"

namespace keel {

KEEL_REGISTER_KERNEL(CUDA, increment, IncrementKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_KERNEL(CUDA, lr_schedule, LrScheduleKernel, float, double, int64_t);

}  // namespace keel
