// The kernels of pool2d (pool_ops.cc has the op and its shape), forward and grad, once for every
// device (ops/device.h). The math is PoolMath<D, T>, an object a kernel keeps (cuDNN's
// descriptors live in it): direct loops on the CPU, cuDNN on CUDA.
//
// Legend: N = batch, C = channels, H x W = input plane, Ho x Wo = output plane.
//
// Channels last (data_format NHWC, framework/op/image_layout.h): X [N, H, W, C] and Out [N, Ho,
// Wo, C]; cuDNN pools them as they lie, the CPU loops run over NCHW copies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/op/image_layout.h"
#include "ops/device.h"

namespace keel {

struct PoolGeom {
  int64_t planes, H, W;  // planes = N * C
  int64_t N, C;
  int64_t kh, kw, sh, sw, ph, pw;
  int64_t Ho, Wo;
};

// Output extent of one spatial dim (Paddle 1.x); -1 when the input extent is unknown, 0 when the
// window is larger than the padded input.
//   floor: (in - k + 2p) / s + 1;  ceil_mode: (in - k + 2p + s - 1) / s + 1
inline int64_t PoolOutSize(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  if (in < 0) return -1;
  if (in + 2 * p < k) return 0;
  return (in - k + 2 * p + (ceil_mode ? s - 1 : 0)) / s + 1;
}

// The effective window: global_pooling covers the whole plane with no padding. x: NCHW dims.
struct PoolWindow {
  int64_t kh, kw, sh, sw, ph, pw;
};
inline PoolWindow Window(const DDim& x, const std::vector<int>& ksize,
                         const std::vector<int>& strides, const std::vector<int>& paddings,
                         bool global) {
  if (global) return PoolWindow{x[2], x[3], 1, 1, 0, 0};
  return PoolWindow{ksize[0], ksize[1], strides[0], strides[1], paddings[0], paddings[1]};
}

struct PoolAttrs {
  explicit PoolAttrs(const OpDesc& op)
      : max(op.Attr<std::string>("pooling_type") == "max"),
        ksize(op.Attr<std::vector<int>>("ksize")),
        strides(op.Attr<std::vector<int>>("strides")),
        paddings(op.Attr<std::vector<int>>("paddings")),
        global(op.Attr<bool>("global_pooling")),
        ceil_mode(op.Attr<bool>("ceil_mode")),
        exclusive(op.Attr<bool>("exclusive")),
        layout(ParseImageLayout(op.Attr<std::string>("data_format"))) {}
  // The geometry of X of `given` dims (in the op's layout).
  PoolGeom Geom(const DDim& given) const {
    const DDim x = ToNchw(given, layout);
    const PoolWindow w = Window(x, ksize, strides, paddings, global);
    return PoolGeom{x[0] * x[1],
                    x[2],
                    x[3],
                    x[0],
                    x[1],
                    w.kh,
                    w.kw,
                    w.sh,
                    w.sw,
                    w.ph,
                    w.pw,
                    PoolOutSize(x[2], w.kh, w.sh, w.ph, ceil_mode && !global),
                    PoolOutSize(x[3], w.kw, w.sw, w.pw, ceil_mode && !global)};
  }
  bool max;
  std::vector<int> ksize, strides, paddings;
  bool global, ceil_mode, exclusive;
  ImageLayout layout;
};

// The device math, constructed from the attrs:
//   Forward(ctx, x, out, od)              od: Out's data, allocated
//   Backward(ctx, x, out, dout, dx, dxd)  dxd: X@GRAD's data, allocated
// max: the largest value in the window, NaN if it holds one; avg: the window's sum over its
// clipped size (exclusive) or over kh * kw. The grad sends dOut to the window's max (ties: the
// first position on the CPU, cuDNN's choice on CUDA) or dOut / size to every position.
template <typename D, typename T>
class PoolMath;

template <typename D, typename T>
class Pool2DKernel : public OpKernel {
 public:
  explicit Pool2DKernel(const OpDesc& op) : math_(PoolAttrs(op)) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    Tensor* out = ctx.Output("Out");
    math_.Forward(ctx, x, *out, out->mutable_data<T>(ctx.place()));
  }

 private:
  PoolMath<D, T> math_;
};

template <typename D, typename T>
class Pool2DGradKernel : public OpKernel {
 public:
  explicit Pool2DGradKernel(const OpDesc& op) : math_(PoolAttrs(op)) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "X");
    if (dx == nullptr) return;
    const Tensor& x = ctx.Input("X");
    const Tensor& out = ctx.Input("Out");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(dout.dims() == out.dims(), "Out@GRAD ", dout.dims(), " and Out ", out.dims(),
                 " differ");
    math_.Backward(ctx, x, out, dout, *dx, dx->mutable_data<T>(ctx.place()));
  }

 private:
  PoolMath<D, T> math_;
};

}  // namespace keel
