// Loss scaling for mixed precision (Paddle's check_finite_and_unscale and update_loss_scaling).
// keel skips the optimizer step on overflow (the update ops' SkipUpdate input is FoundInfinite),
// so update_loss_scaling has no X/Out gradient slots: Paddle zeroes the gradients there and still
// runs the optimizer, which decays Adam's moments on a step that never happened.
#include "ops/amp_ops.h"

#include <string>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/device_cpu.h"

namespace keel {
namespace {

void CheckFiniteAndUnscaleShape(InferShapeContext& ctx) {
  const int n = ctx.NumInputs("X");
  KEEL_SHAPE_CHECK(ctx.NumOutputs("Out") == n, "X lists ", n, " vars but Out ",
                   ctx.NumOutputs("Out"));
  const DDim s = ctx.GetInputDim("Scale");
  KEEL_SHAPE_CHECK(s.numel() == 1 || (!ctx.IsRuntime() && s.numel() < 0),
                   "Scale must hold one element, got ", s.str());
  for (int i = 0; i < n; ++i) {
    const DType t = ctx.GetInputDType("X", i);
    KEEL_SHAPE_CHECK(t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
                         t == DType::kBFloat16,
                     "X[", i, "] is ", DTypeName(t), "; the gradients must be float types");
    ctx.ShareDimAndDType("X", "Out", i);
  }
  ctx.SetOutputDim("FoundInfinite", DDim{1});
  ctx.SetOutputDType("FoundInfinite", DType::kBool);
}

void UpdateLossScalingShape(InferShapeContext& ctx) {
  for (const char* slot : {"FoundInfinite", "PrevLossScaling", "InGoodSteps", "InBadSteps"}) {
    const DDim d = ctx.GetInputDim(slot);
    KEEL_SHAPE_CHECK(d.numel() == 1 || (!ctx.IsRuntime() && d.numel() < 0), slot,
                     " must hold one element, got ", d.str());
  }
  KEEL_SHAPE_CHECK(ctx.GetInputDType("FoundInfinite") == DType::kBool,
                   "FoundInfinite must be bool");
  KEEL_SHAPE_CHECK(ctx.GetInputDType("InGoodSteps") == DType::kInt32 &&
                       ctx.GetInputDType("InBadSteps") == DType::kInt32,
                   "InGoodSteps and InBadSteps must be int32");
  ctx.ShareDimAndDType("PrevLossScaling", "LossScaling");
  ctx.ShareDimAndDType("InGoodSteps", "OutGoodSteps");
  ctx.ShareDimAndDType("InBadSteps", "OutBadSteps");
}

std::string CheckPositiveInt(const Attribute& a) {
  return std::get<int>(a) >= 1 ? "" : "must be >= 1";
}
std::string CheckGrowth(const Attribute& a) {
  return std::get<float>(a) > 1.0f ? "" : "must be > 1";
}
std::string CheckBackoff(const Attribute& a) {
  const float v = std::get<float>(a);
  return v > 0.0f && v < 1.0f ? "" : "must be in (0, 1)";
}

}  // namespace

KEEL_REGISTER_OP(check_finite_and_unscale)
    .Doc(
        "Out_k = X_k / Scale for every X_k (in place when Out_k is X_k); FoundInfinite = whether "
        "any X_k holds an inf or a NaN.")
    .InputList("X", "the scaled gradients, each float32, float64, float16 or bfloat16")
    .Input("Scale", "[1] float: the loss scale")
    .OutputList("Out", "the gradients divided by Scale (usually the X vars themselves)")
    .Output("FoundInfinite", "[1] bool")
    .Shape(CheckFiniteAndUnscaleShape)
    .KernelDTypeFrom("X");
KEEL_REGISTER_KERNEL(CPU, check_finite_and_unscale, CheckFiniteAndUnscaleKernel, float, double,
                     float16, bfloat16);

KEEL_REGISTER_OP(update_loss_scaling)
    .Doc(
        "Dynamic loss scaling: on overflow (FoundInfinite) good = 0 and bad + 1, and every "
        "decr_every_n_nan_or_inf-th such step the scale is multiplied by decr_ratio (at least 1); "
        "else bad = 0 and good + 1, and every incr_every_n_steps-th good step the scale is "
        "multiplied by incr_ratio (when finite). Counters restart at 0 when the scale moves.")
    .Input("FoundInfinite", "[1] bool, from check_finite_and_unscale")
    .Input("PrevLossScaling", "[1] float: the scale used this step")
    .Input("InGoodSteps", "[1] int32: finite steps in a row")
    .Input("InBadSteps", "[1] int32: overflowing steps in a row")
    .Output("LossScaling", "[1] float: the next step's scale (usually PrevLossScaling itself)")
    .Output("OutGoodSteps", "[1] int32 (usually InGoodSteps itself)")
    .Output("OutBadSteps", "[1] int32 (usually InBadSteps itself)")
    .Attr<int>("incr_every_n_steps", 2000, "finite steps before the scale grows", CheckPositiveInt)
    .Attr<int>("decr_every_n_nan_or_inf", 1, "overflowing steps before the scale shrinks",
               CheckPositiveInt)
    .Attr<float>("incr_ratio", 2.0f, "growth factor", CheckGrowth)
    .Attr<float>("decr_ratio", 0.5f, "backoff factor", CheckBackoff)
    .Attr<bool>("stop_update", false, "leave the scale and the counters as they are")
    .Shape(UpdateLossScalingShape)
    .KernelDTypeFrom("PrevLossScaling");
KEEL_REGISTER_KERNEL(CPU, update_loss_scaling, UpdateLossScalingKernel, float);

}  // namespace keel
