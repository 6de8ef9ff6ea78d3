// layer_norm (PaddlePaddle Fluid 1.x slots and attrs) and its grad. The kernels are in
// layer_norm_ops.h; here are the shape, the CPU math and the registrations.
#include "ops/layer_norm_ops.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/op_util.h"

namespace keel {
namespace {

// X flattened at begin_norm_axis to [rows, R]: Scale and Bias [R], Mean and Variance [rows].
void LayerNormShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X");
  const int axis = ctx.Attr<int>("begin_norm_axis");
  KEEL_SHAPE_CHECK(axis >= 1 && axis < x.size(), "begin_norm_axis ", axis,
                   " must lie in [1, rank) for X ", x);
  int64_t rows = 1, R = 1;
  for (int i = 0; i < x.size(); ++i) {
    int64_t& p = i < axis ? rows : R;
    p = p < 0 || x[i] < 0 ? -1 : p * x[i];
  }
  for (const char* slot : {"Scale", "Bias"}) {
    if (!ctx.HasInput(slot)) continue;
    const DDim d = ctx.GetInputDim(slot);
    KEEL_SHAPE_CHECK(d.size() == 1 && ctx.DimEq(d[0], R), slot, " ", d, " must be [", R,
                     "], the size of X ", x, " from begin_norm_axis ", axis);
    KEEL_SHAPE_CHECK(ctx.GetInputDType(slot) == ctx.GetInputDType("X"), slot, " is ",
                     DTypeName(ctx.GetInputDType(slot)), " but X is ",
                     DTypeName(ctx.GetInputDType("X")));
  }
  ctx.ShareDimAndDType("X", "Y");
  for (const char* slot : {"Mean", "Variance"}) {
    ctx.SetOutputDim(slot, DDim{rows});
    ctx.SetOutputDType(slot, ctx.GetInputDType("X"));
  }
}

}  // namespace

// Eigen over each row.
template <typename T>
class LayerNormMath<CPUDevice, T> {
 public:
  void Forward(const ExecutionContext&, const LayerNormIO<T>& io) {
    const int64_t R = io.R;
    for (int64_t i = 0; i < io.rows; ++i) {
      ConstVec<T> xr(io.x + i * R, R);
      Vec<T> y(io.y + i * R, R);
      const T mu = xr.sum() / static_cast<T>(R);
      const T v = (xr - mu).square().sum() / static_cast<T>(R);
      io.mean[i] = mu;
      io.var[i] = v;
      y = (xr - mu) * (T(1) / std::sqrt(v + io.epsilon));
      if (io.scale) y *= ConstVec<T>(io.scale, R);
      if (io.bias) y += ConstVec<T>(io.bias, R);
    }
  }

  void Backward(const ExecutionContext&, const LayerNormGradIO<T>& io) {
    const int64_t R = io.R;
    if (io.dscale) std::fill(io.dscale, io.dscale + R, T(0));
    if (io.dbias) std::fill(io.dbias, io.dbias + R, T(0));
    xhat_.resize(R);
    g_.resize(R);
    Vec<T> xhat(xhat_.data(), R), g(g_.data(), R);
    for (int64_t i = 0; i < io.rows; ++i) {
      ConstVec<T> dyr(io.dy + i * R, R);
      const T inv_std = T(1) / std::sqrt(io.var[i] + io.epsilon);
      xhat = (ConstVec<T>(io.x + i * R, R) - io.mean[i]) * inv_std;
      if (io.dscale) Vec<T>(io.dscale, R) += dyr * xhat;
      if (io.dbias) Vec<T>(io.dbias, R) += dyr;
      if (!io.dx) continue;
      g = dyr;
      if (io.scale) g *= ConstVec<T>(io.scale, R);
      const T mean_g = g.sum() / static_cast<T>(R);
      const T mean_gx = (g * xhat).sum() / static_cast<T>(R);
      Vec<T>(io.dx + i * R, R) = inv_std * (g - mean_g - xhat * mean_gx);
    }
  }

 private:
  ScratchVector<T> xhat_, g_;  // one row each, kept across runs
};

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(layer_norm)
    .Doc(
        "Normalizes X over the dims from begin_norm_axis on: X [N, T, D] with "
        "begin_norm_axis 2 "
        "gives Y [N, T, D], Mean and Variance [N * T], Scale and Bias [D].")
    .Input("X", "any shape, rank >= 2")
    .OptionalInput("Scale", "[R], R = product of X's dims from begin_norm_axis")
    .OptionalInput("Bias", "[R]")
    .Output("Y", "shape of X")
    .Output("Mean", "[rows], rows = product of X's dims before begin_norm_axis")
    .Output("Variance", "[rows], the biased variance")
    .Attr<int>("begin_norm_axis", 1, "the first normalized dim")
    .Attr<float>("epsilon", 1e-5f, "added to the variance", Positive())
    .Shape(LayerNormShape)
    .Grad(GradMaker("layer_norm_grad", {"X", "Scale", "Bias", "Mean", "Variance"}, {"Y"},
                    {"X", "Scale", "Bias"}));
KEEL_REGISTER_GRAD_OP(layer_norm_grad, layer_norm);
KEEL_REGISTER_KERNEL(CPU, layer_norm, LayerNormKernel, float, double);
KEEL_REGISTER_KERNEL(CPU, layer_norm_grad, LayerNormGradKernel, float, double);

}  // namespace keel
