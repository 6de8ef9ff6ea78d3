// The kernels of batch_norm (batch_norm_ops.cc has the op, its shape and formulas), forward and
// grad, once for every device (ops/device.h). The math is BatchNormMath<D, T>, an object a kernel
// keeps (its scratch and cuDNN's descriptors): Eigen in pieces of samples on the CPU, cuDNN on
// CUDA with keel's own update of the moving stats.
//
// Legend: N = batch, C = channels, S = the spatial size per channel (H * W, 1 for [N, C]),
// m = N * S (the values one channel sees).
#pragma once

#include "ops/device.h"

namespace keel {

// The forward's tensors, as pointers (all of [C] but x and y).
template <typename T>
struct BatchNormIO {
  const T *x, *scale, *bias, *mean_in, *var_in;
  T *y, *mean_out, *var_out, *saved_mean, *saved_inv_std;
};
// The grad's; a gradient nobody wants is null.
template <typename T>
struct BatchNormGradIO {
  const T *x, *dy, *scale, *saved_mean, *saved_inv_std;
  T *dx, *dscale, *dbias;
};

// The device math, constructed from the attrs (momentum, epsilon, fixed stats: is_test or
// use_global_stats):
//   Forward(ctx, x_dims, io)   training: the batch's mean and biased variance normalize and update
//                              the moving stats; fixed stats: the moving stats normalize
//   Backward(ctx, x_dims, io)
template <typename D, typename T>
class BatchNormMath;

template <typename D, typename T>
class BatchNormKernel : public OpKernel {
 public:
  explicit BatchNormKernel(const OpDesc& op)
      : math_(op.Attr<float>("momentum"), op.Attr<float>("epsilon"),
              op.Attr<bool>("is_test") || op.Attr<bool>("use_global_stats")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    BatchNormIO<T> io;
    io.x = x.data<T>();
    io.scale = ctx.Input("Scale").data<T>();
    io.bias = ctx.Input("Bias").data<T>();
    io.mean_in = ctx.Input("Mean").data<T>();
    io.var_in = ctx.Input("Variance").data<T>();
    io.mean_out = ctx.Output("MeanOut")->mutable_data<T>(ctx.place());
    io.var_out = ctx.Output("VarianceOut")->mutable_data<T>(ctx.place());
    io.saved_mean = ctx.Output("SavedMean")->mutable_data<T>(ctx.place());
    io.saved_inv_std = ctx.Output("SavedVariance")->mutable_data<T>(ctx.place());
    io.y = ctx.Output("Y")->mutable_data<T>(ctx.place());
    math_.Forward(ctx, x.dims(), io);
  }

 private:
  BatchNormMath<D, T> math_;
};

template <typename D, typename T>
class BatchNormGradKernel : public OpKernel {
 public:
  explicit BatchNormGradKernel(const OpDesc& op)
      : math_(op.Attr<float>("momentum"), op.Attr<float>("epsilon"),
              op.Attr<bool>("is_test") || op.Attr<bool>("use_global_stats")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& dy = ctx.Input(GradVarName("Y"));
    KEEL_ENFORCE(dy.dims() == x.dims(), "Y@GRAD ", dy.dims(), " must have X's shape ", x.dims());
    Tensor* dx = GradOutput(ctx, "X");
    Tensor* dscale = GradOutput(ctx, "Scale");
    Tensor* dbias = GradOutput(ctx, "Bias");
    BatchNormGradIO<T> io;
    io.x = x.data<T>();
    io.dy = dy.data<T>();
    io.scale = ctx.Input("Scale").data<T>();
    io.saved_mean = ctx.Input("SavedMean").data<T>();
    io.saved_inv_std = ctx.Input("SavedVariance").data<T>();
    io.dx = dx ? dx->mutable_data<T>(ctx.place()) : nullptr;
    io.dscale = dscale ? dscale->mutable_data<T>(ctx.place()) : nullptr;
    io.dbias = dbias ? dbias->mutable_data<T>(ctx.place()) : nullptr;
    math_.Backward(ctx, x.dims(), io);
  }

 private:
  BatchNormMath<D, T> math_;
};

}  // namespace keel
