// dropout (PaddlePaddle Fluid 1.x slots and attrs) and its grad. The kernels, math included, are
// in dropout_ops.h; here are the shape and the registrations.
#include "ops/dropout_ops.h"

#include <string>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/op_util.h"

namespace keel {
namespace {

AttrCheckFn InUnitInterval() {
  return [](const Attribute& a) -> std::string {
    const float p = std::get<float>(a);
    return p >= 0.0f && p <= 1.0f ? "" : "must lie in [0, 1]";
  };
}

void DropoutShape(InferShapeContext& ctx) {
  ctx.ShareDimAndDType("X", "Out");
  if (ctx.HasOutput("Mask")) {
    ctx.SetOutputDim("Mask", ctx.GetInputDim("X"));
    ctx.SetOutputDType("Mask", DType::kUInt8);
  }
}

}  // namespace

KEEL_REGISTER_OP(dropout)
    .Doc(
        "Zeroes each element of X with probability dropout_prob. "
        "upscale_in_train: kept values "
        "are scaled by 1 / (1 - p) and is_test is the identity; "
        "downgrade_in_infer: training "
        "keeps values as they are and is_test scales by 1 - p.")
    .Input("X", "any shape")
    .OptionalInput("ReplayMask",
                   "uint8, shape of X: a mask an earlier run of this dropout drew, applied "
                   "instead of drawing (recompute replays the forward this way)")
    .Output("Out", "shape of X")
    .OptionalOutput("Mask", "uint8, shape of X: 1 where kept (written in training only)")
    .Attr<float>("dropout_prob", 0.5f, "the probability of zeroing", InUnitInterval())
    .Attr<bool>("is_test", false, "inference: no dropping")
    .Attr<int>("seed", 0, "0: derived from the program's random_seed (or nondeterministic)")
    .Attr<bool>("fix_seed", false, "reseed every run: the same mask each run")
    .Attr<std::string>("dropout_implementation", "upscale_in_train",
                       "\"upscale_in_train\" or \"downgrade_in_infer\"",
                       OneOf({"upscale_in_train", "downgrade_in_infer"}))
    .Shape(DropoutShape)
    .Grad(GradMaker("dropout_grad", {"Mask"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(dropout_grad, dropout)
    .Shape(GradShapeLike("X", GradVarName("Out")))
    .KernelDTypeFrom(GradVarName("Out"));
KEEL_REGISTER_KERNEL(CPU, dropout, DropoutKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, dropout_grad, DropoutGradKernel, float, double, bfloat16, float16);

}  // namespace keel
