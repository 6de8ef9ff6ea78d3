// Layers of convolutional and sequence nets (PaddlePaddle Fluid 1.x slots and attrs): pool2d,
// batch_norm, dropout, layer_norm; each with its grad op and CPU kernels for float and double.
//
// Legend: N = batch, C = channels, H x W = input plane, Ho x Wo = output plane, S = the spatial
// size per channel (H * W, 1 for [N, C]), m = N * S (the values one batch_norm channel sees).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/cpu_threads.h"
#include "ops/functors/elementwise_functors.h"
#include "ops/functors/norm_functors.h"
#include "ops/functors/philox.h"
#include "ops/op_util.h"

namespace keel {
namespace {

AttrCheckFn OneOf(std::vector<std::string> allowed) {
  return [allowed](const Attribute& a) -> std::string {
    const auto& s = std::get<std::string>(a);
    std::string list;
    for (auto& x : allowed) {
      if (s == x) return "";
      list += (list.empty() ? "" : ", ") + x;
    }
    return "must be one of " + list + ", got '" + s + "'";
  };
}

AttrCheckFn InUnitInterval() {
  return [](const Attribute& a) -> std::string {
    const float p = std::get<float>(a);
    return p >= 0.0f && p <= 1.0f ? "" : "must lie in [0, 1]";
  };
}

AttrCheckFn Positive() {
  return [](const Attribute& a) -> std::string {
    return std::get<float>(a) > 0.0f ? "" : "must be > 0";
  };
}

// ------------------------------------------------------------------------------------- pool2d

struct PoolGeom {
  int64_t planes, H, W;  // planes = N * C
  int64_t kh, kw, sh, sw, ph, pw;
  int64_t Ho, Wo;
};

// Output extent of one spatial dim (Paddle 1.x); -1 when the input extent is unknown, 0 when the
// window is larger than the padded input.
//   floor: (in - k + 2p) / s + 1;  ceil_mode: (in - k + 2p + s - 1) / s + 1
int64_t PoolOutSize(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  if (in < 0) return -1;
  if (in + 2 * p < k) return 0;
  return (in - k + 2 * p + (ceil_mode ? s - 1 : 0)) / s + 1;
}

// The effective window: global_pooling covers the whole plane with no padding.
struct PoolWindow {
  int64_t kh, kw, sh, sw, ph, pw;
};
PoolWindow Window(const DDim& x, const std::vector<int>& ksize, const std::vector<int>& strides,
                  const std::vector<int>& paddings, bool global) {
  if (global) return PoolWindow{x[2], x[3], 1, 1, 0, 0};
  return PoolWindow{ksize[0], ksize[1], strides[0], strides[1], paddings[0], paddings[1]};
}

// X [N, C, H, W] -> Out [N, C, Ho, Wo]; global_pooling: Out [N, C, 1, 1].
void Pool2DShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X");
  const auto& ksize = ctx.Attr<std::vector<int>>("ksize");
  const auto& strides = ctx.Attr<std::vector<int>>("strides");
  const auto& paddings = ctx.Attr<std::vector<int>>("paddings");
  const bool global = ctx.Attr<bool>("global_pooling");
  const bool ceil_mode = ctx.Attr<bool>("ceil_mode");
  KEEL_SHAPE_CHECK(x.size() == 4, "X must be 4-D [N, C, H, W], got X ", x);
  DDim out{x[0], x[1], 1, 1};
  if (!global) {
    for (int d = 0; d < 2; ++d) {
      const int64_t o = PoolOutSize(x[2 + d], ksize[d], strides[d], paddings[d], ceil_mode);
      KEEL_SHAPE_CHECK(x[2 + d] < 0 || o > 0, "the ", d == 0 ? "height" : "width",
                       " of X is too small: X ", x, ", ksize ", IntsStr(ksize), ", strides ",
                       IntsStr(strides), ", paddings ", IntsStr(paddings), " give output size ", o);
      out[2 + d] = o;
    }
  }
  ctx.SetOutputDim("Out", out);
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

struct PoolAttrs {
  explicit PoolAttrs(const OpDesc& op)
      : max(op.Attr<std::string>("pooling_type") == "max"),
        ksize(op.Attr<std::vector<int>>("ksize")),
        strides(op.Attr<std::vector<int>>("strides")),
        paddings(op.Attr<std::vector<int>>("paddings")),
        global(op.Attr<bool>("global_pooling")),
        ceil_mode(op.Attr<bool>("ceil_mode")),
        exclusive(op.Attr<bool>("exclusive")) {}
  PoolGeom Geom(const DDim& x) const {
    const PoolWindow w = Window(x, ksize, strides, paddings, global);
    return PoolGeom{x[0] * x[1],
                    x[2],
                    x[3],
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
};

// Window [hs, he) x [ws, we) of output (oh, ow), clipped to the input (Paddle 1.x).
struct Span {
  int64_t lo, hi;
};
inline Span Clip(int64_t o, int64_t s, int64_t p, int64_t k, int64_t in) {
  const int64_t lo = o * s - p;
  return Span{std::max<int64_t>(lo, 0), std::min(lo + k, in)};
}

// The common 2x2 window with stride 2 and no padding, every window inside the input: no clipping,
// and each input element in at most one window.
inline bool Is2x2Tiling(const PoolGeom& g) {
  return g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0 &&
         2 * g.Ho <= g.H && 2 * g.Wo <= g.W;
}

// max: the largest value in the window, NaN if it holds one (as PyTorch); avg: the window's sum over its clipped size (exclusive) or
// over kh * kw (padding counted as zeros). An empty window (ceil_mode overhang) gives 0.
template <typename T>
class Pool2DKernel : public OpKernel {
 public:
  explicit Pool2DKernel(const OpDesc& op) : a_(op) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const PoolGeom g = a_.Geom(x.dims());
    const T* xd = x.data<T>();
    T* od = ctx.Output("Out")->mutable_data<T>(ctx.place());
    if (Is2x2Tiling(g)) {
      // Same values, in the same order of comparison, as the general loop below.
      const T lowest = -std::numeric_limits<T>::infinity();
      for (int64_t c = 0; c < g.planes; ++c)
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          const T* r0 = xd + (c * g.H + 2 * oh) * g.W;
          const T* r1 = r0 + g.W;
          T* o = od + (c * g.Ho + oh) * g.Wo;
          if (a_.max) {
            for (int64_t ow = 0; ow < g.Wo; ++ow)
              o[ow] = fn::MaxOrNan(
                  fn::MaxOrNan(fn::MaxOrNan(fn::MaxOrNan(lowest, r0[2 * ow]), r0[2 * ow + 1]),
                               r1[2 * ow]),
                  r1[2 * ow + 1]);
          } else {
            for (int64_t ow = 0; ow < g.Wo; ++ow)
              o[ow] = (((T(0) + r0[2 * ow]) + r0[2 * ow + 1]) + r1[2 * ow] + r1[2 * ow + 1]) /
                      T(4);
          }
        }
      return;
    }
    for (int64_t c = 0; c < g.planes; ++c) {
      const T* xp = xd + c * g.H * g.W;
      T* op = od + c * g.Ho * g.Wo;
      for (int64_t oh = 0; oh < g.Ho; ++oh) {
        const Span h = Clip(oh, g.sh, g.ph, g.kh, g.H);
        for (int64_t ow = 0; ow < g.Wo; ++ow) {
          const Span w = Clip(ow, g.sw, g.pw, g.kw, g.W);
          const int64_t n = std::max<int64_t>(0, h.hi - h.lo) * std::max<int64_t>(0, w.hi - w.lo);
          if (n == 0) {
            op[oh * g.Wo + ow] = T(0);
            continue;
          }
          T acc = a_.max ? -std::numeric_limits<T>::infinity() : T(0);
          for (int64_t ih = h.lo; ih < h.hi; ++ih) {
            const T* xr = xp + ih * g.W;
            if (a_.max) {
              for (int64_t iw = w.lo; iw < w.hi; ++iw) acc = fn::MaxOrNan(acc, xr[iw]);
            } else {
              for (int64_t iw = w.lo; iw < w.hi; ++iw) acc += xr[iw];
            }
          }
          if (!a_.max) acc /= static_cast<T>(a_.exclusive ? n : g.kh * g.kw);
          op[oh * g.Wo + ow] = acc;
        }
      }
    }
  }

 private:
  PoolAttrs a_;
};

// max: dout goes to the first position in the window holding the max (Paddle's rule for ties; a
// NaN max: the first NaN); avg:
// dout / size goes to every position of the window.
template <typename T>
class Pool2DGradKernel : public OpKernel {
 public:
  explicit Pool2DGradKernel(const OpDesc& op) : a_(op) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& x = ctx.Input("X");
    const Tensor& out = ctx.Input("Out");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(dout.dims() == out.dims(), "Out@GRAD ", dout.dims(), " and Out ", out.dims(),
                 " differ");
    const PoolGeom g = a_.Geom(x.dims());
    const T* xd = x.data<T>();
    const T* od = out.data<T>();
    const T* gd = dout.data<T>();
    T* dxd = dx->mutable_data<T>(ctx.place());
    if (Is2x2Tiling(g)) {
      // Every covered element is written once; only a leftover odd row or column needs zeros.
      if (2 * g.Ho != g.H || 2 * g.Wo != g.W) std::fill(dxd, dxd + dx->numel(), T(0));
      for (int64_t c = 0; c < g.planes; ++c)
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          const int64_t r = (c * g.H + 2 * oh) * g.W;
          const T* x0 = xd + r;
          const T* x1 = x0 + g.W;
          T* d0 = dxd + r;
          T* d1 = d0 + g.W;
          const int64_t o = (c * g.Ho + oh) * g.Wo;
          for (int64_t ow = 0; ow < g.Wo; ++ow) {
            const T go = gd[o + ow];
            const int64_t i = 2 * ow;
            if (a_.max) {
              // The first of the window, in row-major order, equal to the max takes it all.
              const T y = od[o + ow];
              const bool a = fn::SameOrBothNan(x0[i], y),
                         b = !a && fn::SameOrBothNan(x0[i + 1], y),
                         c2 = !a && !b && fn::SameOrBothNan(x1[i], y),
                         d = !a && !b && !c2 && fn::SameOrBothNan(x1[i + 1], y);
              d0[i] = a ? go : T(0);
              d0[i + 1] = b ? go : T(0);
              d1[i] = c2 ? go : T(0);
              d1[i + 1] = d ? go : T(0);
            } else {
              const T share = go / T(4);
              d0[i] = d0[i + 1] = d1[i] = d1[i + 1] = share;
            }
          }
        }
      return;
    }
    std::fill(dxd, dxd + dx->numel(), T(0));
    for (int64_t c = 0; c < g.planes; ++c) {
      const T* xp = xd + c * g.H * g.W;
      T* dp = dxd + c * g.H * g.W;
      const int64_t o0 = c * g.Ho * g.Wo;
      for (int64_t oh = 0; oh < g.Ho; ++oh) {
        const Span h = Clip(oh, g.sh, g.ph, g.kh, g.H);
        for (int64_t ow = 0; ow < g.Wo; ++ow) {
          const Span w = Clip(ow, g.sw, g.pw, g.kw, g.W);
          const int64_t n = std::max<int64_t>(0, h.hi - h.lo) * std::max<int64_t>(0, w.hi - w.lo);
          if (n == 0) continue;
          const T go = gd[o0 + oh * g.Wo + ow];
          if (a_.max) {
            const T y = od[o0 + oh * g.Wo + ow];
            bool done = false;
            for (int64_t ih = h.lo; ih < h.hi && !done; ++ih)
              for (int64_t iw = w.lo; iw < w.hi; ++iw)
                if (fn::SameOrBothNan(xp[ih * g.W + iw], y)) {
                  dp[ih * g.W + iw] += go;
                  done = true;
                  break;
                }
          } else {
            const T share = go / static_cast<T>(a_.exclusive ? n : g.kh * g.kw);
            for (int64_t ih = h.lo; ih < h.hi; ++ih)
              for (int64_t iw = w.lo; iw < w.hi; ++iw) dp[ih * g.W + iw] += share;
          }
        }
      }
    }
  }

 private:
  PoolAttrs a_;
};

// --------------------------------------------------------------------------------- batch_norm

// batch_norm's work in pieces of whole samples (contiguous memory), cut by the shape only, on the
// CPU thread budget. Per-channel sums are summed per piece, then over the pieces in order, so
// results are the same bits on any number of threads.
struct SamplePieces {
  int64_t per, count;
  SamplePieces(int64_t N, int64_t C, int64_t S)
      : per(std::max<int64_t>(1, cpu_threads::kElementwiseGrain / std::max<int64_t>(1, C * S))),
        count((N + per - 1) / per) {}
  // fn(n0, n1, piece) for each piece [n0, n1) of the samples.
  template <typename Fn>
  void Run(int64_t N, const Fn& fn) const {
    cpu_threads::ParallelFor(count, [&](int64_t p) { fn(p * per, std::min(N, (p + 1) * per), p); });
  }
};

// sums[c] = sum over pieces p (in order) of partial[p * C + c].
void SumPieces(const ScratchVector<double>& partial, int64_t pieces, int64_t C, double* sums) {
  for (int64_t c = 0; c < C; ++c) {
    double acc = 0;
    for (int64_t p = 0; p < pieces; ++p) acc += partial[p * C + c];
    sums[c] = acc;
  }
}

// X [N, C, ...] with Scale, Bias, Mean, Variance of [C]; Y like X; the stats outputs [C].
void BatchNormShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X");
  KEEL_SHAPE_CHECK(x.size() >= 2 && x.size() <= 5,
                   "X must be [N, C] or [N, C, H, W] (rank 2 to 5), got X ", x);
  const int64_t C = x[1];
  for (const char* slot : {"Scale", "Bias", "Mean", "Variance"}) {
    const DDim d = ctx.GetInputDim(slot);
    KEEL_SHAPE_CHECK(d.size() == 1 && ctx.DimEq(d[0], C), slot, " ", d,
                     " must be [C] with C = X's dim 1 (X ", x, ")");
    KEEL_SHAPE_CHECK(ctx.GetInputDType(slot) == ctx.GetInputDType("X"), slot, " is ",
                     DTypeName(ctx.GetInputDType(slot)), " but X is ",
                     DTypeName(ctx.GetInputDType("X")));
  }
  ctx.ShareDimAndDType("X", "Y");
  for (const char* slot : {"MeanOut", "VarianceOut", "SavedMean", "SavedVariance"}) {
    ctx.SetOutputDim(slot, DDim{C});
    ctx.SetOutputDType(slot, ctx.GetInputDType("X"));
  }
}

// Training: Y = Scale * (X - mean) / sqrt(var + epsilon) + Bias with the batch's per-channel mean
// and biased variance (divided by m, as Paddle does), and the moving stats become momentum * moving
// + (1 - momentum) * batch, using the same biased batch variance (Paddle's convention; PyTorch
// would use the unbiased one here). SavedMean = mean, SavedVariance = 1 / sqrt(var + epsilon).
// is_test or use_global_stats: the moving stats normalize, stay unchanged, and are copied to the
// Saved* outputs (as mean and inverse std) for the grad.
template <typename T>
class BatchNormKernel : public OpKernel {
 public:
  explicit BatchNormKernel(const OpDesc& op)
      : momentum_(op.Attr<float>("momentum")),
        epsilon_(op.Attr<float>("epsilon")),
        is_test_(op.Attr<bool>("is_test") || op.Attr<bool>("use_global_stats")) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const int64_t N = x.dims()[0], C = x.dims()[1], S = x.dims().prod(2, x.dims().size());
    const T* xd = x.data<T>();
    const T* scale = ctx.Input("Scale").data<T>();
    const T* bias = ctx.Input("Bias").data<T>();
    const T* mean_in = ctx.Input("Mean").data<T>();
    const T* var_in = ctx.Input("Variance").data<T>();
    T* mean_out = ctx.Output("MeanOut")->mutable_data<T>(ctx.place());
    T* var_out = ctx.Output("VarianceOut")->mutable_data<T>(ctx.place());
    T* saved_mean = ctx.Output("SavedMean")->mutable_data<T>(ctx.place());
    T* saved_inv_std = ctx.Output("SavedVariance")->mutable_data<T>(ctx.place());
    T* yd = ctx.Output("Y")->mutable_data<T>(ctx.place());
    mean_.assign(C, 0.0);
    var_.assign(C, 0.0);
    if (is_test_) {
      for (int64_t c = 0; c < C; ++c) {
        mean_[c] = mean_in[c];
        var_[c] = var_in[c];
        mean_out[c] = mean_in[c];  // no-ops when MeanOut is Mean, as in programs
        var_out[c] = var_in[c];
      }
    } else {
      const double m = static_cast<double>(N * S);
      // Two passes (mean, then squared deviations): exact enough in float for large m. Pieces of
      // channels; each channel sums over n in order, as on one thread.
      const SamplePieces pieces(N, C, S);
      partial_.assign(static_cast<size_t>(pieces.count * C), 0.0);
      pieces.Run(N, [&](int64_t n0, int64_t n1, int64_t p) {
        double* acc = partial_.data() + p * C;
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t c = 0; c < C; ++c) acc[c] += ConstVec<T>(xd + (n * C + c) * S, S).sum();
      });
      SumPieces(partial_, pieces.count, C, mean_.data());
      for (int64_t c = 0; c < C; ++c) mean_[c] = m > 0 ? mean_[c] / m : 0.0;
      partial_.assign(static_cast<size_t>(pieces.count * C), 0.0);
      pieces.Run(N, [&](int64_t n0, int64_t n1, int64_t p) {
        double* acc = partial_.data() + p * C;
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t c = 0; c < C; ++c)
            acc[c] +=
                (ConstVec<T>(xd + (n * C + c) * S, S) - static_cast<T>(mean_[c])).square().sum();
      });
      SumPieces(partial_, pieces.count, C, var_.data());
      const double mom = momentum_;
      for (int64_t c = 0; c < C; ++c) {
        var_[c] = m > 0 ? var_[c] / m : 0.0;
        mean_out[c] = fn::MovingStat(mom, mean_in[c], mean_[c]);
        var_out[c] = fn::MovingStat(mom, var_in[c], var_[c]);
      }
    }
    for (int64_t c = 0; c < C; ++c) {
      const double inv_std = fn::InvStd(var_[c], epsilon_);
      saved_mean[c] = static_cast<T>(mean_[c]);
      saved_inv_std[c] = static_cast<T>(inv_std);
      // y = x * a + b with a = scale * inv_std, b = bias - mean * a.
      mean_[c] = scale[c] * inv_std;
      var_[c] = bias[c] - saved_mean[c] * mean_[c];
    }
    SamplePieces(N, C, S).Run(N, [&](int64_t n0, int64_t n1, int64_t) {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t off = (n * C + c) * S;
          Vec<T>(yd + off, S) =
              ConstVec<T>(xd + off, S) * static_cast<T>(mean_[c]) + static_cast<T>(var_[c]);
        }
    });
  }

 private:
  float momentum_, epsilon_;
  bool is_test_;
  // Per channel: the mean and variance, then the affine coefficients a and b.
  ScratchVector<double> mean_, var_;
  ScratchVector<double> partial_;  // per piece of samples, per channel
};

// With xhat = (x - mean) * inv_std, sums over the channel's m values:
//   dBias = sum(dy), dScale = sum(dy * xhat)
//   training: dx = scale * inv_std * (dy - dBias / m - xhat * dScale / m)
//   is_test or use_global_stats (fixed stats): dx = scale * inv_std * dy
template <typename T>
class BatchNormGradKernel : public OpKernel {
 public:
  explicit BatchNormGradKernel(const OpDesc& op)
      : is_test_(op.Attr<bool>("is_test") || op.Attr<bool>("use_global_stats")) {}

  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    Tensor* dscale = ctx.OutputOrNull(GradVarName("Scale"));
    Tensor* dbias = ctx.OutputOrNull(GradVarName("Bias"));
    const Tensor& x = ctx.Input("X");
    const Tensor& dy = ctx.Input(GradVarName("Y"));
    KEEL_ENFORCE(dy.dims() == x.dims(), "Y@GRAD ", dy.dims(), " must have X's shape ", x.dims());
    const int64_t N = x.dims()[0], C = x.dims()[1], S = x.dims().prod(2, x.dims().size());
    const T* xd = x.data<T>();
    const T* gd = dy.data<T>();
    const T* scale = ctx.Input("Scale").data<T>();
    const T* mean = ctx.Input("SavedMean").data<T>();
    const T* inv_std = ctx.Input("SavedVariance").data<T>();
    sum_dy_.assign(C, 0.0);
    sum_dy_xc_.assign(C, 0.0);  // sum(dy * (x - mean))
    const SamplePieces pieces(N, C, S);
    partial_.assign(static_cast<size_t>(2 * pieces.count * C), 0.0);
    pieces.Run(N, [&](int64_t n0, int64_t n1, int64_t p) {
      double* dy_acc = partial_.data() + p * C;
      double* dyxc_acc = partial_.data() + (pieces.count + p) * C;
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t off = (n * C + c) * S;
          ConstVec<T> g(gd + off, S);
          dy_acc[c] += g.sum();
          dyxc_acc[c] += (g * (ConstVec<T>(xd + off, S) - mean[c])).sum();
        }
    });
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t p = 0; p < pieces.count; ++p) {
        sum_dy_[c] += partial_[p * C + c];
        sum_dy_xc_[c] += partial_[(pieces.count + p) * C + c];
      }
    }
    if (dbias) {
      T* p = dbias->mutable_data<T>(ctx.place());
      for (int64_t c = 0; c < C; ++c) p[c] = static_cast<T>(sum_dy_[c]);
    }
    if (dscale) {
      T* p = dscale->mutable_data<T>(ctx.place());
      for (int64_t c = 0; c < C; ++c) p[c] = static_cast<T>(sum_dy_xc_[c] * inv_std[c]);
    }
    if (dx == nullptr) return;
    T* dxd = dx->mutable_data<T>(ctx.place());
    // dx = A * dy + B * x + D per channel: the training formula expanded in x.
    const double m = static_cast<double>(N * S);
    coef_a_.resize(C), coef_b_.resize(C), coef_d_.resize(C);
    for (int64_t c = 0; c < C; ++c) {
      const double is = inv_std[c], A = scale[c] * is;
      const double B = is_test_ ? 0.0 : -A * is * is * sum_dy_xc_[c] / m;
      coef_a_[c] = static_cast<T>(A);
      coef_b_[c] = static_cast<T>(B);
      coef_d_[c] = static_cast<T>(is_test_ ? 0.0 : -B * mean[c] - A * sum_dy_[c] / m);
    }
    pieces.Run(N, [&](int64_t n0, int64_t n1, int64_t) {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t off = (n * C + c) * S;
          Vec<T>(dxd + off, S) = ConstVec<T>(gd + off, S) * coef_a_[c] +
                                 ConstVec<T>(xd + off, S) * coef_b_[c] + coef_d_[c];
        }
    });
  }

 private:
  bool is_test_;
  ScratchVector<double> sum_dy_, sum_dy_xc_;   // per channel
  ScratchVector<double> partial_;              // per piece of samples, per channel
  ScratchVector<T> coef_a_, coef_b_, coef_d_;  // per channel
};

// ------------------------------------------------------------------------------------ dropout

void DropoutShape(InferShapeContext& ctx) {
  ctx.ShareDimAndDType("X", "Out");
  if (ctx.HasOutput("Mask")) {
    ctx.SetOutputDim("Mask", ctx.GetInputDim("X"));
    ctx.SetOutputDType("Mask", DType::kUInt8);
  }
}

struct DropoutAttrs {
  explicit DropoutAttrs(const OpDesc& op)
      : p(op.Attr<float>("dropout_prob")),
        is_test(op.Attr<bool>("is_test")),
        fix_seed(op.Attr<bool>("fix_seed")),
        upscale(op.Attr<std::string>("dropout_implementation") == "upscale_in_train") {}
  // The factor on kept values in training: 1 / (1 - p) when upscaling (0 when all drop).
  double TrainScale() const { return !upscale ? 1.0 : p >= 1.0f ? 0.0 : 1.0 / (1.0 - p); }
  // The factor on every value at test time.
  double TestScale() const { return upscale ? 1.0 : 1.0 - p; }
  float p;
  bool is_test, fix_seed, upscale;
};

// Training: Mask = (u >= p) for a uniform 32-bit draw u per element, Out = X * Mask * TrainScale.
// is_test: Out = X * TestScale and Mask is left unwritten. The draws are Philox4x32 keyed by
// ctx.seed() (the executor resolves attr seed, else the program's random_seed, else a random one)
// with the executor's run index as counter (restored on resume, so a resumed run draws the
// masks of the uninterrupted run), so the CUDA kernel draws the same mask; with fix_seed every run
// uses counter 0, the same mask each run (Paddle 1.x's fix_seed).
template <typename T>
class DropoutKernel : public OpKernel {
 public:
  explicit DropoutKernel(const OpDesc& op) : a_(op) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const int64_t n = x.numel();
    ConstVec<T> xv(x.data<T>(), n);
    Vec<T> out(ctx.Output("Out")->mutable_data<T>(ctx.place()), n);
    if (a_.is_test) {
      out = xv * static_cast<T>(a_.TestScale());
      return;
    }
    const uint64_t offset = a_.fix_seed ? 0 : static_cast<uint64_t>(ctx.run_index());
    const uint64_t seed = ctx.seed();
    uint8_t* mask = ctx.Output("Mask")->mutable_data<uint8_t>(ctx.place());
    const uint64_t threshold = fn::DropoutThreshold(a_.p);
    // One Philox block serves four elements (fn::DropoutKeep draws the same words one at a time).
    for (int64_t i = 0; i < n; i += 4) {
      const fn::Philox4 r = fn::DropoutBlock(seed, offset, static_cast<uint64_t>(i) >> 2);
      for (int64_t k = 0; k < 4 && i + k < n; ++k) mask[i + k] = r.v[k] >= threshold;
    }
    const T s = static_cast<T>(a_.TrainScale());
    const T* xd = x.data<T>();
    T* od = out.data();
    for (int64_t i = 0; i < n; ++i) od[i] = fn::DropoutApply(mask[i] != 0, xd[i], s);
  }

 private:
  DropoutAttrs a_;
};

// dx = dout * Mask * TrainScale; is_test: dx = dout * TestScale.
template <typename T>
class DropoutGradKernel : public OpKernel {
 public:
  explicit DropoutGradKernel(const OpDesc& op) : a_(op) {}

  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    const int64_t n = dout.numel();
    const T* gd = dout.data<T>();
    T* dxd = dx->mutable_data<T>(ctx.place());
    if (a_.is_test) {
      Vec<T>(dxd, n) = ConstVec<T>(gd, n) * static_cast<T>(a_.TestScale());
      return;
    }
    const Tensor& mask = ctx.Input("Mask");
    KEEL_ENFORCE(mask.numel() == n, "Mask ", mask.dims(), " and Out@GRAD ", dout.dims(),
                 " differ in size");
    const uint8_t* md = mask.data<uint8_t>();
    const T s = static_cast<T>(a_.TrainScale());
    for (int64_t i = 0; i < n; ++i) dxd[i] = fn::DropoutApply(md[i] != 0, gd[i], s);
  }

 private:
  DropoutAttrs a_;
};

// --------------------------------------------------------------------------------- layer_norm

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

// Per row: Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias, var biased (divided by R).
template <typename T>
class LayerNormKernel : public OpKernel {
 public:
  explicit LayerNormKernel(const OpDesc& op)
      : axis_(op.Attr<int>("begin_norm_axis")), epsilon_(op.Attr<float>("epsilon")) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const int64_t rows = x.dims().prod(0, axis_), R = x.dims().prod(axis_, x.dims().size());
    const Tensor* scale = ctx.InputOrNull("Scale");
    const Tensor* bias = ctx.InputOrNull("Bias");
    const T* xd = x.data<T>();
    T* yd = ctx.Output("Y")->mutable_data<T>(ctx.place());
    T* mean = ctx.Output("Mean")->mutable_data<T>(ctx.place());
    T* var = ctx.Output("Variance")->mutable_data<T>(ctx.place());
    for (int64_t i = 0; i < rows; ++i) {
      ConstVec<T> xr(xd + i * R, R);
      Vec<T> y(yd + i * R, R);
      const T mu = xr.sum() / static_cast<T>(R);
      const T v = (xr - mu).square().sum() / static_cast<T>(R);
      mean[i] = mu;
      var[i] = v;
      y = (xr - mu) * (T(1) / std::sqrt(v + static_cast<T>(epsilon_)));
      if (scale) y *= ConstVec<T>(scale->data<T>(), R);
      if (bias) y += ConstVec<T>(bias->data<T>(), R);
    }
  }

 private:
  int axis_;
  float epsilon_;
};

// Per row, with xhat = (x - mean) * inv_std and g = dy * Scale:
//   dx = inv_std * (g - mean(g) - xhat * mean(g * xhat))
//   dScale = sum over rows of dy * xhat, dBias = sum over rows of dy
template <typename T>
class LayerNormGradKernel : public OpKernel {
 public:
  explicit LayerNormGradKernel(const OpDesc& op)
      : axis_(op.Attr<int>("begin_norm_axis")), epsilon_(op.Attr<float>("epsilon")) {}

  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    Tensor* dscale = ctx.OutputOrNull(GradVarName("Scale"));
    Tensor* dbias = ctx.OutputOrNull(GradVarName("Bias"));
    const Tensor& x = ctx.Input("X");
    const Tensor& dy = ctx.Input(GradVarName("Y"));
    KEEL_ENFORCE(dy.dims() == x.dims(), "Y@GRAD ", dy.dims(), " must have X's shape ", x.dims());
    const int64_t rows = x.dims().prod(0, axis_), R = x.dims().prod(axis_, x.dims().size());
    const Tensor* scale = ctx.InputOrNull("Scale");
    const T* xd = x.data<T>();
    const T* gd = dy.data<T>();
    const T* mean = ctx.Input("Mean").data<T>();
    const T* var = ctx.Input("Variance").data<T>();
    T* dsd = dscale ? dscale->mutable_data<T>(ctx.place()) : nullptr;
    T* dbd = dbias ? dbias->mutable_data<T>(ctx.place()) : nullptr;
    if (dsd) std::fill(dsd, dsd + R, T(0));
    if (dbd) std::fill(dbd, dbd + R, T(0));
    T* dxd = dx ? dx->mutable_data<T>(ctx.place()) : nullptr;
    xhat_.resize(R);
    g_.resize(R);
    Vec<T> xhat(xhat_.data(), R), g(g_.data(), R);
    for (int64_t i = 0; i < rows; ++i) {
      ConstVec<T> dyr(gd + i * R, R);
      const T inv_std = T(1) / std::sqrt(var[i] + static_cast<T>(epsilon_));
      xhat = (ConstVec<T>(xd + i * R, R) - mean[i]) * inv_std;
      if (dsd) Vec<T>(dsd, R) += dyr * xhat;
      if (dbd) Vec<T>(dbd, R) += dyr;
      if (!dxd) continue;
      g = dyr;
      if (scale) g *= ConstVec<T>(scale->data<T>(), R);
      const T mean_g = g.sum() / static_cast<T>(R);
      const T mean_gx = (g * xhat).sum() / static_cast<T>(R);
      Vec<T>(dxd + i * R, R) = inv_std * (g - mean_g - xhat * mean_gx);
    }
  }

 private:
  int axis_;
  float epsilon_;
  ScratchVector<T> xhat_, g_;  // one row each, kept across runs
};

}  // namespace

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(pool2d)
    .Doc(
        "2-D max or average pooling, NCHW. X [8, 16, 32, 32] with ksize {2, "
        "2}, strides {2, 2} "
        "gives Out [8, 16, 16, 16]; Ho = (H - kh + 2 * ph) / sh + 1, or with "
        "ceil_mode "
        "(H - kh + 2 * ph + sh - 1) / sh + 1. Windows are clipped to the "
        "input.")
    .Input("X", "[N, C, H, W]")
    .Output("Out", "[N, C, Ho, Wo]")
    .Attr<std::string>("pooling_type", "max", "\"max\" or \"avg\"", OneOf({"max", "avg"}))
    .Attr<std::vector<int>>("ksize", {1, 1}, "(kh, kw); ignored with global_pooling",
                            PairAtLeast(1))
    .Attr<std::vector<int>>("strides", {1, 1}, "(sh, sw)", PairAtLeast(1))
    .Attr<std::vector<int>>("paddings", {0, 0}, "(ph, pw), on each side", PairAtLeast(0))
    .Attr<bool>("global_pooling", false, "pool each whole plane to 1 x 1")
    .Attr<bool>("ceil_mode", false, "round the output size up instead of down")
    .Attr<bool>("exclusive", true, "avg divides by the window's in-input size, not kh * kw")
    .Attr<std::string>("data_format", "NCHW", "only NCHW", OneOf({"NCHW", "AnyLayout"}))
    .Shape(Pool2DShape)
    .Grad(GradMaker("pool2d_grad", {"X", "Out"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(pool2d_grad, pool2d);
KEEL_REGISTER_CPU_KERNEL(pool2d, Pool2DKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(pool2d_grad, Pool2DGradKernel, float, double);

KEEL_REGISTER_OP(batch_norm)
    .Doc(
        "Y = Scale * (X - mean) / sqrt(var + epsilon) + Bias per channel (dim "
        "1). Training uses "
        "the batch's mean and biased variance and updates the moving stats in "
        "place "
        "(MeanOut is Mean, VarianceOut is Variance); is_test uses the moving "
        "stats.")
    .Input("X", "[N, C] or [N, C, H, W]")
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
    .Attr<std::string>("data_layout", "NCHW", "only NCHW", OneOf({"NCHW", "AnyLayout"}))
    .Shape(BatchNormShape)
    .Grad(GradMaker("batch_norm_grad", {"X", "Scale", "Bias", "SavedMean", "SavedVariance"}, {"Y"},
                    {"X", "Scale", "Bias"}));
KEEL_REGISTER_GRAD_OP(batch_norm_grad, batch_norm);
KEEL_REGISTER_CPU_KERNEL(batch_norm, BatchNormKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(batch_norm_grad, BatchNormGradKernel, float, double);

KEEL_REGISTER_OP(dropout)
    .Doc(
        "Zeroes each element of X with probability dropout_prob. "
        "upscale_in_train: kept values "
        "are scaled by 1 / (1 - p) and is_test is the identity; "
        "downgrade_in_infer: training "
        "keeps values as they are and is_test scales by 1 - p.")
    .Input("X", "any shape")
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
KEEL_REGISTER_CPU_KERNEL(dropout, DropoutKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(dropout_grad, DropoutGradKernel, float, double);

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
KEEL_REGISTER_CPU_KERNEL(layer_norm, LayerNormKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(layer_norm_grad, LayerNormGradKernel, float, double);

}  // namespace keel
