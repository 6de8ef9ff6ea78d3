// batch_norm (PaddlePaddle Fluid 1.x slots and attrs) and its grad. The kernels are in
// batch_norm_ops.h and the CPU math
// batch_norm_cpu.h; here are the shape and the registrations.
//
// Legend: N = batch, C = channels, S = the spatial size per channel (H * W, 1 for [N, C]),
// m = N * S (the values one batch_norm channel sees).
#include <cstdint>
#include <string>

#include "framework/op/op_registry.h"
#include "ops/batch_norm_cpu.h"
#include "ops/batch_norm_ops.h"

namespace keel {
namespace {

// The dtype of the parameters and statistics beside X of `x`: float32 for the 16-bit types.
DType ParamDType(DType x) {
  return x == DType::kFloat16 || x == DType::kBFloat16 ? DType::kFloat32 : x;
}

// X [N, C, ...] (NHWC: [N, ..., C]) with Scale, Bias, Mean, Variance of [C]; Y like X; the stats
// outputs [C].
void BatchNormShape(InferShapeContext& ctx) {
  const ImageLayout layout = ParseImageLayout(ctx.Attr<std::string>("data_layout"));
  const DDim x = ctx.GetInputDim("X");
  KEEL_SHAPE_CHECK(x.size() >= 2 && x.size() <= 5, "X must be [N, C] or ", ImageDimsName(layout),
                   " (rank 2 to 5, data_layout ", ImageLayoutName(layout), "), got X ", x);
  const int axis = ChannelAxis(layout, x.size());
  const int64_t C = x[axis];
  const DType xt = ctx.GetInputDType("X"), pt = ParamDType(xt);
  for (const char* slot : {"Scale", "Bias", "Mean", "Variance"}) {
    const DDim d = ctx.GetInputDim(slot);
    KEEL_SHAPE_CHECK(d.size() == 1 && ctx.DimEq(d[0], C), slot, " ", d,
                     " must be [C] with C = X's dim ", axis, " (X ", x, ", data_layout ",
                     ImageLayoutName(layout), ")");
    KEEL_SHAPE_CHECK(ctx.GetInputDType(slot) == pt, slot, " is ",
                     DTypeName(ctx.GetInputDType(slot)), " but must be ", DTypeName(pt),
                     " for X of ", DTypeName(xt),
                     " (float16 and bfloat16 X take float32 parameters and statistics)");
  }
  ctx.ShareDimAndDType("X", "Y");
  for (const char* slot : {"MeanOut", "VarianceOut", "SavedMean", "SavedVariance"}) {
    ctx.SetOutputDim(slot, DDim{C});
    ctx.SetOutputDType(slot, pt);
  }
}

}  // namespace

// ---------------------------------------------------------------- registration

OpSchema& BatchNormSchema(OpSchema& schema, const std::string& grad_type) {
  return schema.Input("X", "[N, C] or [N, C, H, W] (NHWC: [N, H, W, C])")
      .Input("Scale", "[C]")
      .Input("Bias", "[C]")
      .Input("Mean", "[C], the moving mean (persistable)")
      .Input("Variance", "[C], the moving variance (persistable)")
      .Output("Y", "shape of X")
      .Output("MeanOut", "[C], the updated moving mean; the same var as Mean")
      .Output("VarianceOut", "[C], the updated moving variance; the same var as Variance")
      .Output("SavedMean", "[C], the mean used (batch mean in training)")
      .Output("SavedVariance", "[C], the inverse std used, 1 / sqrt(var + epsilon)")
      .Attr<float>("momentum", 0.9f, "moving = momentum * moving + (1 - momentum) * batch")
      .Attr<float>("epsilon", 1e-5f, "added to the variance", Positive())
      .Attr<bool>("is_test", false, "normalize with the moving stats and leave them unchanged")
      .Attr<bool>("use_global_stats", false,
                  "training too normalizes with the moving stats, leaves them unchanged and "
                  "backpropagates through them as constants (fine-tuning with frozen statistics)")
      .Attr<std::string>("data_layout", "NCHW",
                         "NCHW (channels on dim 1), or NHWC (channels on the last dim); AnyLayout "
                         "reads as NCHW",
                         OneOf({"NCHW", "NHWC", "AnyLayout"}))
      .Shape(BatchNormShape)
      .Grad(GradMaker(grad_type, {"X", "Scale", "Bias", "SavedMean", "SavedVariance"}, {"Y"},
                      {"X", "Scale", "Bias"}));
}

[[maybe_unused]] static OpSchema& keel_schema_batch_norm = BatchNormSchema(
    OpRegistry::Register("batch_norm")
        .Doc("Y = Scale * (X - mean) / sqrt(var + epsilon) + Bias per channel (dim 1; NHWC: the "
             "last dim). Training "
             "uses the batch's mean and biased variance and updates the moving stats in place "
             "(MeanOut is Mean, VarianceOut is Variance); is_test uses the moving stats."),
    "batch_norm_grad");
KEEL_REGISTER_GRAD_OP(batch_norm_grad, batch_norm);
KEEL_REGISTER_KERNEL(CPU, batch_norm, BatchNormKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, batch_norm_grad, BatchNormGradKernel, float, double, bfloat16, float16);

}  // namespace keel
