// The kernels of layer_norm (layer_norm_ops.cc has the op and its shape), forward and grad, once
// for every device (ops/device.h). X is flattened at begin_norm_axis to [rows, R]; the math is
// LayerNormMath<D, T>, an object a kernel keeps (the CPU's row scratch): Eigen rows on the CPU,
// one block per row on CUDA, the parameter gradients summed over rows in order on both.
#pragma once

#include <cstdint>

#include "ops/device.h"

namespace keel {

// Per row: Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias, var biased (divided by R).
// Scale and bias may be null. X and Y of T; Scale, Bias, Mean, Variance of P = Acc<T>: float16 and
// bfloat16 X take float32 parameters and statistics (as Paddle's), and the math is float32.
template <typename T, typename P = Acc<T>>
struct LayerNormIO {
  int64_t rows, R;
  P epsilon;
  const T* x;
  const P *scale, *bias;
  T* y;
  P *mean, *var;
};
// Per row, with xhat = (x - mean) * inv_std and g = dy * Scale:
//   dx = inv_std * (g - mean(g) - xhat * mean(g * xhat))
//   dScale = sum over rows of dy * xhat, dBias = sum over rows of dy
// Scale and every gradient may be null.
template <typename T, typename P = Acc<T>>
struct LayerNormGradIO {
  int64_t rows, R;
  P epsilon;
  const T *x, *dy;
  const P *scale, *mean, *var;
  T* dx;
  P *dscale, *dbias;
};

// The device math: Forward(ctx, io), Backward(ctx, io).
template <typename D, typename T>
class LayerNormMath;

template <typename D, typename T>
class LayerNormKernel : public OpKernel {
 public:
  explicit LayerNormKernel(const OpDesc& op)
      : axis_(op.Attr<int>("begin_norm_axis")), epsilon_(op.Attr<float>("epsilon")) {}
  void Compute(ExecutionContext& ctx) override {
    using P = Acc<T>;
    const Tensor& x = ctx.Input("X");
    const Tensor* scale = ctx.InputOrNull("Scale");
    const Tensor* bias = ctx.InputOrNull("Bias");
    LayerNormIO<T> io;
    io.rows = x.dims().prod(0, axis_);
    io.R = x.dims().prod(axis_, x.dims().size());
    io.epsilon = static_cast<P>(epsilon_);
    io.x = x.data<T>();
    io.scale = scale ? scale->data<P>() : nullptr;
    io.bias = bias ? bias->data<P>() : nullptr;
    io.y = ctx.Output("Y")->mutable_data<T>(ctx.place());
    io.mean = ctx.Output("Mean")->mutable_data<P>(ctx.place());
    io.var = ctx.Output("Variance")->mutable_data<P>(ctx.place());
    math_.Forward(ctx, io);
  }

 private:
  int axis_;
  float epsilon_;
  LayerNormMath<D, T> math_;
};

template <typename D, typename T>
class LayerNormGradKernel : public OpKernel {
 public:
  explicit LayerNormGradKernel(const OpDesc& op)
      : axis_(op.Attr<int>("begin_norm_axis")), epsilon_(op.Attr<float>("epsilon")) {}
  void Compute(ExecutionContext& ctx) override {
    using P = Acc<T>;
    Tensor* dx = GradOutput(ctx, "X");
    Tensor* dscale = GradOutput(ctx, "Scale");
    Tensor* dbias = GradOutput(ctx, "Bias");
    const Tensor& x = ctx.Input("X");
    const Tensor& dy = ctx.Input(GradVarName("Y"));
    KEEL_ENFORCE(dy.dims() == x.dims(), "Y@GRAD ", dy.dims(), " must have X's shape ", x.dims());
    const Tensor* scale = ctx.InputOrNull("Scale");
    LayerNormGradIO<T> io;
    io.rows = x.dims().prod(0, axis_);
    io.R = x.dims().prod(axis_, x.dims().size());
    io.epsilon = static_cast<P>(epsilon_);
    io.x = x.data<T>();
    io.dy = dy.data<T>();
    io.scale = scale ? scale->data<P>() : nullptr;
    io.mean = ctx.Input("Mean").data<P>();
    io.var = ctx.Input("Variance").data<P>();
    io.dscale = dscale ? dscale->mutable_data<P>(ctx.place()) : nullptr;
    io.dbias = dbias ? dbias->mutable_data<P>(ctx.place()) : nullptr;
    io.dx = dx ? dx->mutable_data<T>(ctx.place()) : nullptr;
    math_.Backward(ctx, io);
  }

 private:
  int axis_;
  float epsilon_;
  LayerNormMath<D, T> math_;
};

}  // namespace keel
