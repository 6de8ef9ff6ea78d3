// The kernels of conv2d (conv_ops.cc has the op and its shape), forward and grad, once for every
// device (ops/device.h). The math is ConvMath<D, T>, an object a kernel keeps: im2col + GEMM or
// oneDNN's primitives on the CPU (with their scratch), cuDNN on CUDA (with its descriptors and
// algorithm choices).
//
// Legend: N = batch, C = input channels, M = output channels (filters), H x W = input plane,
// Ho x Wo = output plane.
#pragma once

#include "ops/device.h"

namespace keel {

// The device math, constructed from the op:
//   Forward(ctx, x, filter, out, od)                   Output = Input (*) Filter; od: its data
//   Backward(ctx, x, filter, dout, dx, df, dxd, dfd)   dInput and dFilter (either may be null)
template <typename D, typename T>
class ConvMath;

// Output = Input (*) Filter. Output: N x M x Ho x Wo, Input: N x C x H x W, Filter: M x C/g x kh x
// kw.
template <typename D, typename T>
class Conv2DKernel : public OpKernel {
 public:
  explicit Conv2DKernel(const OpDesc& op) : math_(op) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Output");
    math_.Forward(ctx, ctx.Input("Input"), ctx.Input("Filter"), *out,
                  out->mutable_data<T>(ctx.place()));
  }

 private:
  ConvMath<D, T> math_;
};

// dInput = dOutput (*)' Filter (backward data); dFilter = Input (*)' dOutput (backward filter).
template <typename D, typename T>
class Conv2DGradKernel : public OpKernel {
 public:
  explicit Conv2DGradKernel(const OpDesc& op) : math_(op) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "Input");
    Tensor* df = GradOutput(ctx, "Filter");
    if (dx == nullptr && df == nullptr) return;
    T* dxd = dx ? dx->mutable_data<T>(ctx.place()) : nullptr;
    T* dfd = df ? df->mutable_data<T>(ctx.place()) : nullptr;
    math_.Backward(ctx, ctx.Input("Input"), ctx.Input("Filter"), ctx.Input(GradVarName("Output")),
                   dx, df, dxd, dfd);
  }

 private:
  ConvMath<D, T> math_;
};

}  // namespace keel
