// The kernels of batch_norm (batch_norm_ops.cc has the op, its shape and formulas), forward and
// grad, once for every device (ops/device.h). The math is BatchNormMath<D, T>, an object a kernel
// keeps (its scratch and cuDNN's descriptors): Eigen in pieces of samples on the CPU, cuDNN on
// CUDA with keel's own update of the moving stats.
//
// Legend: N = batch, C = channels, S = the spatial size per channel (H * W, 1 for [N, C]),
// m = N * S (the values one channel sees).
//
// Channels last (data_layout NHWC: X [N, ..., C]) the CPU math and keel's own CUDA kernels see X
// as [N * ..., C] (PerChannelView, framework/op/image_layout.h): the same values per channel, in
// memory as they lie; cuDNN gets an NHWC descriptor with the real batch N (its batch norms refuse
// an N of a million, which the flattened view would give).
//
// Mixed precision: X and Y (and their gradients) may be float16 or bfloat16 while Scale, Bias, the
// moving and saved statistics and the parameter gradients stay float32 (P = Acc<T>), as Paddle
// allows; the math is float32.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "framework/op/image_layout.h"
#include "ops/device.h"

namespace keel {

class OpSchema;

// Synchronized batch norm's hook into the CPU math. With all_reduce set, training sums over every
// rank of the job: the forward sums [sum(x), sum(x^2)] per channel and m locally, all_reduce sums
// those 2C + 1 doubles over the ranks in place (one collective), and mean = sum(x) / M, the
// biased var = sum(x^2) / M - mean^2 normalize; the moving variance takes the unbiased
// var * M / (M - 1) (PyTorch's SyncBatchNorm). The grad writes dScale and dBias from the local
// sums (the data-parallel gradient all-reduce adds them up), then sums [sum(dy),
// sum(dy * (x - mean)), m] over the ranks (one collective) and forms dX with the global sums and M.
// Fixed stats (is_test, use_global_stats) never call it.
struct BatchNormSync {
  std::function<void(double* values, int64_t n)> all_reduce;
};

// Whether the op normalizes with its moving statistics (is_test or use_global_stats) rather than
// the batch's.
inline bool HasFixedStats(const OpDesc& op) {
  return op.Attr<bool>("is_test") || op.Attr<bool>("use_global_stats");
}

// batch_norm's slots, attrs, shape and grad maker (grad op `grad_type`) declared on `schema`;
// sync_batch_norm (sync_batch_norm_ops.cc) declares the same ones and adds ring_id.
OpSchema& BatchNormSchema(OpSchema& schema, const std::string& grad_type);

// The forward's tensors, as pointers: x and y of T, the [C] parameters and statistics of P.
template <typename T, typename P = Acc<T>>
struct BatchNormIO {
  const T* x;
  const P *scale, *bias, *mean_in, *var_in;
  T* y;
  P *mean_out, *var_out, *saved_mean, *saved_inv_std;
};
// The grad's; a gradient nobody wants is null.
template <typename T, typename P = Acc<T>>
struct BatchNormGradIO {
  const T *x, *dy;
  const P *scale, *saved_mean, *saved_inv_std;
  T* dx;
  P *dscale, *dbias;
};

// The device math, constructed from the attrs (momentum, epsilon, fixed stats: is_test or
// use_global_stats, the layout of X):
//   Forward(ctx, x_dims, io)   training: the batch's mean and biased variance normalize and update
//                              the moving stats; fixed stats: the moving stats normalize
//   Backward(ctx, x_dims, io)
template <typename D, typename T>
class BatchNormMath;

// The layout of X the op names.
inline ImageLayout BatchNormLayout(const OpDesc& op) {
  return ParseImageLayout(op.Attr<std::string>("data_layout"));
}

template <typename D, typename T>
class BatchNormKernel : public OpKernel {
 public:
  explicit BatchNormKernel(const OpDesc& op)
      : math_(op.Attr<float>("momentum"), op.Attr<float>("epsilon"), HasFixedStats(op),
              BatchNormLayout(op)) {}
  void Compute(ExecutionContext& ctx) override {
    using P = Acc<T>;
    const Tensor& x = ctx.Input("X");
    BatchNormIO<T> io;
    io.x = x.data<T>();
    io.scale = ctx.Input("Scale").data<P>();
    io.bias = ctx.Input("Bias").data<P>();
    io.mean_in = ctx.Input("Mean").data<P>();
    io.var_in = ctx.Input("Variance").data<P>();
    io.mean_out = ctx.Output("MeanOut")->mutable_data<P>(ctx.place());
    io.var_out = ctx.Output("VarianceOut")->mutable_data<P>(ctx.place());
    io.saved_mean = ctx.Output("SavedMean")->mutable_data<P>(ctx.place());
    io.saved_inv_std = ctx.Output("SavedVariance")->mutable_data<P>(ctx.place());
    io.y = ctx.Output("Y")->mutable_data<T>(ctx.place());
    math_.Forward(ctx, x.dims(), io);
  }

 protected:
  BatchNormMath<D, T> math_;
};

template <typename D, typename T>
class BatchNormGradKernel : public OpKernel {
 public:
  explicit BatchNormGradKernel(const OpDesc& op)
      : math_(op.Attr<float>("momentum"), op.Attr<float>("epsilon"), HasFixedStats(op),
              BatchNormLayout(op)) {}
  void Compute(ExecutionContext& ctx) override {
    using P = Acc<T>;
    const Tensor& x = ctx.Input("X");
    const Tensor& dy = ctx.Input(GradVarName("Y"));
    KEEL_ENFORCE(dy.dims() == x.dims(), "Y@GRAD ", dy.dims(), " must have X's shape ", x.dims());
    Tensor* dx = GradOutput(ctx, "X");
    Tensor* dscale = GradOutput(ctx, "Scale");
    Tensor* dbias = GradOutput(ctx, "Bias");
    BatchNormGradIO<T> io;
    io.x = x.data<T>();
    io.dy = dy.data<T>();
    io.scale = ctx.Input("Scale").data<P>();
    io.saved_mean = ctx.Input("SavedMean").data<P>();
    io.saved_inv_std = ctx.Input("SavedVariance").data<P>();
    io.dx = dx ? dx->mutable_data<T>(ctx.place()) : nullptr;
    io.dscale = dscale ? dscale->mutable_data<P>(ctx.place()) : nullptr;
    io.dbias = dbias ? dbias->mutable_data<P>(ctx.place()) : nullptr;
    math_.Backward(ctx, x.dims(), io);
  }

 protected:
  BatchNormMath<D, T> math_;
};

}  // namespace keel
