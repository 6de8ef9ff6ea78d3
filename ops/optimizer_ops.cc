// Optimizer update ops. ParamOut is normally the same variable as Param: the update is in place.
#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/op_util.h"

namespace keel {
namespace {

void SgdShape(InferShapeContext& ctx) {
  DDim p = ctx.GetInputDim("Param");
  DDim g = ctx.GetInputDim("Grad");
  DDim lr = ctx.GetInputDim("LearningRate");
  KEEL_SHAPE_CHECK(ctx.DimsEq(p, g), "Param ", p.str(), " and Grad ", g.str(),
                   " must have the same shape");
  KEEL_SHAPE_CHECK(ctx.GetInputDType("Param") == ctx.GetInputDType("Grad"), "Param is ",
                   DTypeName(ctx.GetInputDType("Param")), ", Grad is ",
                   DTypeName(ctx.GetInputDType("Grad")), "; they must match");
  KEEL_SHAPE_CHECK(lr.numel() == 1 || (!ctx.IsRuntime() && lr.numel() < 0),
                   "LearningRate must hold one element, got ", lr.str());
  ctx.SetOutputDim("ParamOut", p);
  ctx.SetOutputDType("ParamOut", ctx.GetInputDType("Param"));
}

// param_out = param - lr * grad.
template <typename T>
class SgdKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& param = ctx.Input("Param");
    const Tensor& grad = ctx.Input("Grad");
    Tensor* param_out = ctx.Output("ParamOut");
    KEEL_ENFORCE(param.numel() == grad.numel(), "Param ", param.dims().str(), " and Grad ",
                 grad.dims().str(), " must have the same shape");
    const T lr = ctx.Input("LearningRate").item<T>();
    const int64_t n = param.numel();
    Vec<T>(param_out->mutable_data<T>(ctx.place()), n) =
        ConstVec<T>(param.data<T>(), n) - lr * ConstVec<T>(grad.data<T>(), n);
  }
};

}  // namespace

KEEL_REGISTER_OP(sgd)
    .Doc("ParamOut = Param - LearningRate * Grad, in place when ParamOut is Param.")
    .Input("Param", "the parameter")
    .Input("Grad", "its gradient, shape of Param")
    .Input("LearningRate", "[1] float tensor")
    .Output("ParamOut", "the updated parameter (usually the Param variable itself)")
    .Shape(SgdShape)
    .KernelDTypeFrom("Param");
KEEL_REGISTER_CPU_KERNEL(sgd, SgdKernel, float, double);

}  // namespace keel
