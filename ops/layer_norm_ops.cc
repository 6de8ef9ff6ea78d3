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
  const DType xt = ctx.GetInputDType("X");
  const DType pt = xt == DType::kFloat16 || xt == DType::kBFloat16 ? DType::kFloat32 : xt;
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
    KEEL_SHAPE_CHECK(ctx.GetInputDType(slot) == pt, slot, " is ",
                     DTypeName(ctx.GetInputDType(slot)), " but must be ", DTypeName(pt),
                     " for X of ", DTypeName(xt),
                     " (float16 and bfloat16 X take float32 Scale and Bias)");
  }
  ctx.ShareDimAndDType("X", "Y");
  for (const char* slot : {"Mean", "Variance"}) {
    ctx.SetOutputDim(slot, DDim{rows});
    ctx.SetOutputDType(slot, pt);
  }
}

}  // namespace

// Eigen over each row; the 16-bit types widen each row of X (and dY) into float32 scratch, compute
// in float32 and round the row of Y (dX) once.
template <typename T>
class LayerNormMath<CPUDevice, T> {
  using P = Acc<T>;

 public:
  void Forward(const ExecutionContext&, const LayerNormIO<T>& io) {
    const int64_t R = io.R;
    for (int64_t i = 0; i < io.rows; ++i) {
      ConstVec<P> xr = In(io.x + i * R, R, &xrow_);
      Vec<P> y = Out(io.y + i * R, R, &yrow_);
      const P mu = xr.sum() / static_cast<P>(R);
      const P v = (xr - mu).square().sum() / static_cast<P>(R);
      io.mean[i] = mu;
      io.var[i] = v;
      y = (xr - mu) * (P(1) / std::sqrt(v + io.epsilon));
      if (io.scale) y *= ConstVec<P>(io.scale, R);
      if (io.bias) y += ConstVec<P>(io.bias, R);
      Flush(yrow_, io.y + i * R, R);
    }
  }

  void Backward(const ExecutionContext&, const LayerNormGradIO<T>& io) {
    const int64_t R = io.R;
    if (io.dscale) std::fill(io.dscale, io.dscale + R, P(0));
    if (io.dbias) std::fill(io.dbias, io.dbias + R, P(0));
    xhat_.resize(R);
    g_.resize(R);
    Vec<P> xhat(xhat_.data(), R), g(g_.data(), R);
    for (int64_t i = 0; i < io.rows; ++i) {
      ConstVec<P> dyr = In(io.dy + i * R, R, &yrow_);
      const P inv_std = P(1) / std::sqrt(io.var[i] + io.epsilon);
      xhat = (In(io.x + i * R, R, &xrow_) - io.mean[i]) * inv_std;
      if (io.dscale) Vec<P>(io.dscale, R) += dyr * xhat;
      if (io.dbias) Vec<P>(io.dbias, R) += dyr;
      if (!io.dx) continue;
      g = dyr;
      if (io.scale) g *= ConstVec<P>(io.scale, R);
      const P mean_g = g.sum() / static_cast<P>(R);
      const P mean_gx = (g * xhat).sum() / static_cast<P>(R);
      Vec<P> dx = Out(io.dx + i * R, R, &xrow_);  // the row of X is read
      dx = inv_std * (g - mean_g - xhat * mean_gx);
      Flush(xrow_, io.dx + i * R, R);
    }
  }

 private:
  // A row as P: itself, or widened into `buf`.
  static ConstVec<P> In(const T* row, int64_t R, ScratchVector<P>* buf) {
    if constexpr (kIsHalf<T>) {
      buf->resize(R);
      WidenN(row, buf->data(), R);
      return ConstVec<P>(buf->data(), R);
    } else {
      return ConstVec<P>(row, R);
    }
  }
  // Where a row of P is written: the row itself, or `buf`, narrowed into the row by Flush.
  static Vec<P> Out(T* row, int64_t R, ScratchVector<P>* buf) {
    if constexpr (kIsHalf<T>) {
      buf->resize(R);
      return Vec<P>(buf->data(), R);
    } else {
      return Vec<P>(row, R);
    }
  }
  static void Flush(const ScratchVector<P>& buf, T* row, int64_t R) {
    if constexpr (kIsHalf<T>) NarrowN(buf.data(), row, R);
  }

  ScratchVector<P> xhat_, g_;     // one row each, kept across runs
  ScratchVector<P> xrow_, yrow_;  // the 16-bit types' rows in float32
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
KEEL_REGISTER_KERNEL(CPU, layer_norm, LayerNormKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, layer_norm_grad, LayerNormGradKernel, float, double, bfloat16, float16);

}  // namespace keel
