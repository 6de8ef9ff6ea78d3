// Loss scaling on CUDA: the kernels are amp_ops.h's; the scale and the overflow flag stay on the
// device.
#include "ops/amp_ops.h"
#include "ops/cuda_util.cuh"

namespace keel {

KEEL_REGISTER_KERNEL(CUDA, check_finite_and_unscale, CheckFiniteAndUnscaleKernel, float, double,
                     float16, bfloat16);
KEEL_REGISTER_KERNEL(CUDA, update_loss_scaling, UpdateLossScalingKernel, float);

}  // namespace keel
