// pool2d (PaddlePaddle Fluid 1.x slots and attrs): 2-D max or average pooling over NCHW, and its
// grad. The kernels are in pool_ops.h; here are the shape, the CPU math and the registrations.
//
// Legend: N = batch, C = channels, H x W = input plane, Ho x Wo = output plane.
#include "ops/pool_ops.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/cpu_threads.h"
#include "ops/functors/elementwise_functors.h"
#include "ops/image_layout_cpu.h"
#include "ops/op_util.h"

namespace keel {
namespace {

// X [N, C, H, W] -> Out [N, C, Ho, Wo]; global_pooling: Out [N, C, 1, 1]. Channels last, X [N, H,
// W, C] -> Out [N, Ho, Wo, C].
void Pool2DShape(InferShapeContext& ctx) {
  const ImageLayout layout = ParseImageLayout(ctx.Attr<std::string>("data_format"));
  const DDim given = ctx.GetInputDim("X");
  const DDim x = ToNchw(given, layout);
  const auto& ksize = ctx.Attr<std::vector<int>>("ksize");
  const auto& strides = ctx.Attr<std::vector<int>>("strides");
  const auto& paddings = ctx.Attr<std::vector<int>>("paddings");
  const bool global = ctx.Attr<bool>("global_pooling");
  const bool ceil_mode = ctx.Attr<bool>("ceil_mode");
  KEEL_SHAPE_CHECK(x.size() == 4, "X must be 4-D ", ImageDimsName(layout), " (data_format ",
                   ImageLayoutName(layout), "), got X ", given);
  DDim out{x[0], x[1], 1, 1};
  if (!global) {
    for (int d = 0; d < 2; ++d) {
      const int64_t o = PoolOutSize(x[2 + d], ksize[d], strides[d], paddings[d], ceil_mode);
      KEEL_SHAPE_CHECK(x[2 + d] < 0 || o > 0, "the ", d == 0 ? "height" : "width",
                       " of X is too small: X ", given, ", ksize ", IntsStr(ksize), ", strides ",
                       IntsStr(strides), ", paddings ", IntsStr(paddings), " give output size ", o);
      out[2 + d] = o;
    }
  }
  ctx.SetOutputDim("Out", FromNchw(out, layout));
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

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

}  // namespace

// Direct loops over the NCHW windows, in the order of comparison and summation the grad relies
// on; the 16-bit types run them in float32 over widened copies (the grad sums the overlapping
// windows' shares in float32, rounded once), channels last over NCHW copies.
template <typename T>
class PoolMath<CPUDevice, T> {
  using V = std::conditional_t<kIsHalf<T>, float, T>;

 public:
  explicit PoolMath(const PoolAttrs& a) : a_(a) {}

  void Forward(const ExecutionContext&, const Tensor& x, const Tensor& out, T* od) {
    const PoolGeom g = a_.Geom(x.dims());
    V* ov = Out(od, out.numel(), &out_);
    Loops(g, In(g, x, g.H * g.W, &x_), ov);
    Finish(g, ov, od, out.numel(), g.Ho * g.Wo);
  }

  void Backward(const ExecutionContext&, const Tensor& x, const Tensor& out, const Tensor& dout,
                const Tensor& dx, T* dxd) {
    const PoolGeom g = a_.Geom(x.dims());
    V* dv = Out(dxd, dx.numel(), &dx_);
    GradLoops(g, In(g, x, g.H * g.W, &x_), In(g, out, g.Ho * g.Wo, &out_),
              In(g, dout, g.Ho * g.Wo, &dout_), dv);
    Finish(g, dv, dxd, dx.numel(), g.H * g.W);
  }

 private:
  bool Planar() const { return a_.layout == ImageLayout::kNCHW; }
  // `t` (HW positions per plane) as the loops read it: float32 and float64 NCHW in place; else
  // a copy in `buf`, widened and, channels last, in NCHW.
  const V* In(const PoolGeom& g, const Tensor& t, int64_t HW, ScratchVector<V>* buf) const {
    if constexpr (!kIsHalf<T>) {
      if (Planar()) return t.data<T>();
    }
    buf->resize(static_cast<size_t>(t.numel()));
    if constexpr (kIsHalf<T>) {
      if (Planar()) {
        WidenInPieces(t.data<T>(), buf->data(), t.numel());
        return buf->data();
      }
    }
    NhwcToNchw(t.data<T>(), buf->data(), g.N, g.C, HW);
    return buf->data();
  }
  // Where the loops write an output of n values: `p`, or `buf` when Finish must move it there.
  V* Out(T* p, int64_t n, ScratchVector<V>* buf) const {
    if constexpr (!kIsHalf<T>) {
      if (Planar()) return p;
    }
    buf->resize(static_cast<size_t>(n));
    return buf->data();
  }
  void Finish(const PoolGeom& g, const V* v, T* p, int64_t n, int64_t HW) const {
    if (!Planar()) {
      NchwToNhwc(v, p, g.N, g.C, HW);
    } else if constexpr (kIsHalf<T>) {
      NarrowInPieces(v, p, n);
    }
  }

  template <typename V>
  void Loops(const PoolGeom& g, const V* xd, V* od) const {
    if (Is2x2Tiling(g)) {
      // Same values, in the same order of comparison, as the general loop below.
      const V lowest = -std::numeric_limits<V>::infinity();
      ForPlanes(g, [&](int64_t c) {
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          const V* r0 = xd + (c * g.H + 2 * oh) * g.W;
          const V* r1 = r0 + g.W;
          V* o = od + (c * g.Ho + oh) * g.Wo;
          if (a_.max) {
            for (int64_t ow = 0; ow < g.Wo; ++ow)
              o[ow] = fn::MaxOrNan(
                  fn::MaxOrNan(fn::MaxOrNan(fn::MaxOrNan(lowest, r0[2 * ow]), r0[2 * ow + 1]),
                               r1[2 * ow]),
                  r1[2 * ow + 1]);
          } else {
            for (int64_t ow = 0; ow < g.Wo; ++ow)
              o[ow] = (((V(0) + r0[2 * ow]) + r0[2 * ow + 1]) + r1[2 * ow] + r1[2 * ow + 1]) / V(4);
          }
        }
      });
      return;
    }
    ForPlanes(g, [&](int64_t c) {
      const V* xp = xd + c * g.H * g.W;
      V* op = od + c * g.Ho * g.Wo;
      for (int64_t oh = 0; oh < g.Ho; ++oh) {
        const Span h = Clip(oh, g.sh, g.ph, g.kh, g.H);
        for (int64_t ow = 0; ow < g.Wo; ++ow) {
          const Span w = Clip(ow, g.sw, g.pw, g.kw, g.W);
          const int64_t n = std::max<int64_t>(0, h.hi - h.lo) * std::max<int64_t>(0, w.hi - w.lo);
          if (n == 0) {
            op[oh * g.Wo + ow] = V(0);
            continue;
          }
          V acc = a_.max ? -std::numeric_limits<V>::infinity() : V(0);
          for (int64_t ih = h.lo; ih < h.hi; ++ih) {
            const V* xr = xp + ih * g.W;
            if (a_.max) {
              for (int64_t iw = w.lo; iw < w.hi; ++iw) acc = fn::MaxOrNan(acc, xr[iw]);
            } else {
              for (int64_t iw = w.lo; iw < w.hi; ++iw) acc += xr[iw];
            }
          }
          if (!a_.max) acc /= static_cast<V>(a_.exclusive ? n : g.kh * g.kw);
          op[oh * g.Wo + ow] = acc;
        }
      }
    });
  }

  template <typename V>
  void GradLoops(const PoolGeom& g, const V* xd, const V* od, const V* gd, V* dxd) const {
    if (Is2x2Tiling(g)) {
      // Every covered element is written once; only a leftover odd row or column needs zeros.
      const bool leftover = 2 * g.Ho != g.H || 2 * g.Wo != g.W;
      ForPlanes(g, [&](int64_t c) {
        if (leftover) std::fill(dxd + c * g.H * g.W, dxd + (c + 1) * g.H * g.W, V(0));
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          const int64_t r = (c * g.H + 2 * oh) * g.W;
          const V* x0 = xd + r;
          const V* x1 = x0 + g.W;
          V* d0 = dxd + r;
          V* d1 = d0 + g.W;
          const int64_t o = (c * g.Ho + oh) * g.Wo;
          for (int64_t ow = 0; ow < g.Wo; ++ow) {
            const V go = gd[o + ow];
            const int64_t i = 2 * ow;
            if (a_.max) {
              // The first of the window, in row-major order, equal to the max takes it all.
              const V y = od[o + ow];
              const bool a = fn::SameOrBothNan(x0[i], y), b = !a && fn::SameOrBothNan(x0[i + 1], y),
                         c2 = !a && !b && fn::SameOrBothNan(x1[i], y),
                         d = !a && !b && !c2 && fn::SameOrBothNan(x1[i + 1], y);
              d0[i] = a ? go : V(0);
              d0[i + 1] = b ? go : V(0);
              d1[i] = c2 ? go : V(0);
              d1[i + 1] = d ? go : V(0);
            } else {
              const V share = go / V(4);
              d0[i] = d0[i + 1] = d1[i] = d1[i + 1] = share;
            }
          }
        }
      });
      return;
    }
    ForPlanes(g, [&](int64_t c) {
      const V* xp = xd + c * g.H * g.W;
      V* dp = dxd + c * g.H * g.W;
      std::fill(dp, dp + g.H * g.W, V(0));
      const int64_t o0 = c * g.Ho * g.Wo;
      for (int64_t oh = 0; oh < g.Ho; ++oh) {
        const Span h = Clip(oh, g.sh, g.ph, g.kh, g.H);
        for (int64_t ow = 0; ow < g.Wo; ++ow) {
          const Span w = Clip(ow, g.sw, g.pw, g.kw, g.W);
          const int64_t n = std::max<int64_t>(0, h.hi - h.lo) * std::max<int64_t>(0, w.hi - w.lo);
          if (n == 0) continue;
          const V go = gd[o0 + oh * g.Wo + ow];
          if (a_.max) {
            const V y = od[o0 + oh * g.Wo + ow];
            bool done = false;
            for (int64_t ih = h.lo; ih < h.hi && !done; ++ih)
              for (int64_t iw = w.lo; iw < w.hi; ++iw)
                if (fn::SameOrBothNan(xp[ih * g.W + iw], y)) {
                  dp[ih * g.W + iw] += go;
                  done = true;
                  break;
                }
          } else {
            const V share = go / static_cast<V>(a_.exclusive ? n : g.kh * g.kw);
            for (int64_t ih = h.lo; ih < h.hi; ++ih)
              for (int64_t iw = w.lo; iw < w.hi; ++iw) dp[ih * g.W + iw] += share;
          }
        }
      }
    });
  }

  // fn(c) for every (sample, channel) plane, in pieces of whole planes on the thread budget, cut
  // by the shape only: a plane's windows read and write that plane alone, so the values are the
  // one-thread loop's.
  template <typename Fn>
  static void ForPlanes(const PoolGeom& g, const Fn& fn) {
    const int64_t grain =
        std::max<int64_t>(1, cpu_threads::kElementwiseGrain / std::max<int64_t>(1, g.H * g.W));
    cpu_threads::ParallelForRange(g.planes, grain, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) fn(c);
    });
  }

  PoolAttrs a_;
  ScratchVector<V> x_, out_, dout_, dx_;  // the copies In and Out make
};

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(pool2d)
    .Doc(
        "2-D max or average pooling, NCHW or (data_format NHWC) channels last. X [8, 16, 32, 32] "
        "with ksize {2, "
        "2}, strides {2, 2} "
        "gives Out [8, 16, 16, 16]; Ho = (H - kh + 2 * ph) / sh + 1, or with "
        "ceil_mode "
        "(H - kh + 2 * ph + sh - 1) / sh + 1. Windows are clipped to the "
        "input.")
    .Input("X", "[N, C, H, W] (NHWC: [N, H, W, C])")
    .Output("Out", "[N, C, Ho, Wo] (NHWC: [N, Ho, Wo, C])")
    .Attr<std::string>("pooling_type", "max", "\"max\" or \"avg\"", OneOf({"max", "avg"}))
    .Attr<std::vector<int>>("ksize", {1, 1}, "(kh, kw); ignored with global_pooling",
                            PairAtLeast(1))
    .Attr<std::vector<int>>("strides", {1, 1}, "(sh, sw)", PairAtLeast(1))
    .Attr<std::vector<int>>("paddings", {0, 0}, "(ph, pw), on each side", PairAtLeast(0))
    .Attr<bool>("global_pooling", false, "pool each whole plane to 1 x 1")
    .Attr<bool>("ceil_mode", false, "round the output size up instead of down")
    .Attr<bool>("exclusive", true, "avg divides by the window's in-input size, not kh * kw")
    .Attr<std::string>("data_format", "NCHW",
                       "NCHW, or NHWC (channels last: X [N, H, W, C], Out [N, Ho, Wo, C]); "
                       "AnyLayout reads as NCHW",
                       OneOf({"NCHW", "NHWC", "AnyLayout"}))
    .Shape(Pool2DShape)
    .Grad(GradMaker("pool2d_grad", {"X", "Out"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(pool2d_grad, pool2d);
KEEL_REGISTER_KERNEL(CPU, pool2d, Pool2DKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, pool2d_grad, Pool2DGradKernel, float, double, bfloat16, float16);

}  // namespace keel
