// conv2d (PaddlePaddle Fluid 1.x slots and attrs) and its grad, on CPU by im2col + GEMM.
//
// Legend: N = batch, C = input channels, M = output channels (filters), g = groups,
// Cg = C / g, Mg = M / g, H x W = input plane, Ho x Wo = output plane, P = Ho * Wo,
// K = Cg * kh * kw (one column of the unfolded input).
//
//   Ho = (H + 2 * ph - (dh * (kh - 1) + 1)) / sh + 1, likewise Wo.
//   Output[n, g*Mg + m, p] = sum_k Filter_g[m, k] * col_n_g[k, p]
//
// Small output planes (P below kMinGemmCols) unfold several images side by side, so one GEMM of
// [Mg, K] x [K, B * P] covers B images; the product is then scattered back to NCHW. A 1x1 conv with
// stride 1 and no padding skips im2col: the input plane is already the column matrix.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/blas.h"
#include "ops/op_util.h"

namespace keel {
namespace {

// GEMMs narrower than this (in columns) batch several images.
constexpr int64_t kMinGemmCols = 512;
// Cap on the unfolded buffer of one batch, in elements (64 MiB of float).
constexpr int64_t kMaxColElems = int64_t{16} << 20;

std::string IntsStr(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

AttrCheckFn PairAtLeast(int lo) {
  return [lo](const Attribute& a) -> std::string {
    const auto& v = std::get<std::vector<int>>(a);
    if (v.size() != 2) return "must hold 2 values (height, width), got " + IntsStr(v);
    if (v[0] < lo || v[1] < lo) return "values must be >= " + std::to_string(lo);
    return "";
  };
}

AttrCheckFn NchwOnly() {
  return [](const Attribute& a) -> std::string {
    const auto& s = std::get<std::string>(a);
    return s == "NCHW" || s == "AnyLayout" ? "" : "only NCHW is supported, got '" + s + "'";
  };
}

// The geometry of one conv2d, from the input and filter shapes and the attrs.
struct ConvGeom {
  int64_t N, C, H, W;  // input
  int64_t M, kh, kw;   // filter
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t groups, Cg, Mg, K;
  int64_t Ho, Wo, P;
  bool one_by_one;  // 1x1, stride 1, no padding: col == input plane
};

// Output extent of one spatial dim; -1 when the input extent is unknown (build time), 0 when the
// dilated filter is larger than the padded input.
int64_t ConvOutSize(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation) {
  if (in < 0) return -1;
  const int64_t span = in + 2 * pad - (dilation * (k - 1) + 1);
  return span < 0 ? 0 : span / stride + 1;
}

ConvGeom MakeGeom(const DDim& x, const DDim& f, const std::vector<int>& strides,
                  const std::vector<int>& paddings, const std::vector<int>& dilations, int groups) {
  ConvGeom g;
  g.N = x[0], g.C = x[1], g.H = x[2], g.W = x[3];
  g.M = f[0], g.kh = f[2], g.kw = f[3];
  g.sh = strides[0], g.sw = strides[1];
  g.ph = paddings[0], g.pw = paddings[1];
  g.dh = dilations[0], g.dw = dilations[1];
  g.groups = groups;
  g.Cg = g.C / groups, g.Mg = g.M / groups;
  g.K = g.Cg * g.kh * g.kw;
  g.Ho = ConvOutSize(g.H, g.kh, g.sh, g.ph, g.dh);
  g.Wo = ConvOutSize(g.W, g.kw, g.sw, g.pw, g.dw);
  g.P = g.Ho * g.Wo;
  g.one_by_one = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
  return g;
}

// Images per GEMM: enough for kMinGemmCols columns, within kMaxColElems and N.
int64_t ImagesPerGemm(const ConvGeom& g) {
  if (g.one_by_one || g.P >= kMinGemmCols) return 1;
  int64_t b = (kMinGemmCols + g.P - 1) / g.P;
  b = std::min(b, std::max<int64_t>(1, kMaxColElems / std::max<int64_t>(1, g.K * g.P)));
  return std::max<int64_t>(1, std::min(b, g.N));
}

// Input [N, C, H, W] * Filter [M, C / groups, kh, kw] = Output [N, M, Ho, Wo].
void Conv2DShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("Input"), f = ctx.GetInputDim("Filter");
  const auto& strides = ctx.Attr<std::vector<int>>("strides");
  const auto& paddings = ctx.Attr<std::vector<int>>("paddings");
  const auto& dilations = ctx.Attr<std::vector<int>>("dilations");
  const int groups = ctx.Attr<int>("groups");
  KEEL_SHAPE_CHECK(x.size() == 4, "Input must be 4-D [N, C, H, W], got Input ", x, " (Filter ", f,
                   ")");
  KEEL_SHAPE_CHECK(f.size() == 4, "Filter must be 4-D [M, C / groups, kh, kw], got Filter ", f,
                   " (Input ", x, ")");
  KEEL_SHAPE_CHECK(ctx.GetInputDType("Input") == ctx.GetInputDType("Filter"), "Input is ",
                   DTypeName(ctx.GetInputDType("Input")), " but Filter is ",
                   DTypeName(ctx.GetInputDType("Filter")));
  KEEL_SHAPE_CHECK(f[0] > 0 && f[1] > 0 && f[2] > 0 && f[3] > 0, "Filter ", f,
                   " must be fully known (Input ", x, ")");
  KEEL_SHAPE_CHECK(f[0] % groups == 0, "Filter's ", f[0], " output channels must divide into ",
                   groups, " groups (Input ", x, ", Filter ", f, ")");
  KEEL_SHAPE_CHECK(ctx.DimEq(x[1], f[1] * groups), "Input's ", x[1],
                   " channels must equal Filter's in-channels ", f[1], " * groups ", groups,
                   " (Input ", x, ", Filter ", f, ")");
  DDim out{x[0], f[0], -1, -1};
  for (int d = 0; d < 2; ++d) {
    const int64_t o = ConvOutSize(x[2 + d], f[2 + d], strides[d], paddings[d], dilations[d]);
    KEEL_SHAPE_CHECK(x[2 + d] < 0 || o > 0, "the ", d == 0 ? "height" : "width",
                     " of Input is too small for the filter: Input ", x, ", Filter ", f,
                     ", strides ", IntsStr(strides), ", paddings ", IntsStr(paddings),
                     ", dilations ", IntsStr(dilations), " give output size ", o);
    out[2 + d] = o;
  }
  ctx.SetOutputDim("Output", out);
  ctx.SetOutputDType("Output", ctx.GetInputDType("Input"));
}

// Unfolds one image's group of channels x [Cg, H, W] into col rows of length P, row
// (c * kh + i) * kw + j holding x[c, oh * sh - ph + i * dh, ow * sw - pw + j * dw] (0 outside
// the input); consecutive rows are ld elements apart (ld >= P: several images side by side).
template <typename T>
void Im2Col(const T* x, const ConvGeom& g, T* col, int64_t ld) {
  for (int64_t c = 0; c < g.Cg; ++c) {
    const T* xc = x + c * g.H * g.W;
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        T* row = col + ((c * g.kh + i) * g.kw + j) * ld;
        // Output columns ow in [lo, hi) read inside the input: 0 <= ow * sw + off < W.
        const int64_t off = j * g.dw - g.pw;
        const int64_t lo = off >= 0 ? 0 : std::min(g.Wo, (-off + g.sw - 1) / g.sw);
        const int64_t hi =
            g.W - 1 - off < 0 ? lo : std::max(lo, std::min(g.Wo, (g.W - 1 - off) / g.sw + 1));
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          T* r = row + oh * g.Wo;
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          if (ih < 0 || ih >= g.H) {
            std::fill(r, r + g.Wo, T(0));
            continue;
          }
          const T* xr = xc + ih * g.W + off;
          std::fill(r, r + lo, T(0));
          if (g.sw == 1) {
            std::memcpy(r + lo, xr + lo, static_cast<size_t>(hi - lo) * sizeof(T));
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) r[ow] = xr[ow * g.sw];
          }
          std::fill(r + hi, r + g.Wo, T(0));
        }
      }
  }
}

// The adjoint of Im2Col: dx[c, ih, iw] += col[row, p] for every (row, p) that Im2Col read from
// (c, ih, iw). dx must be zeroed (or hold a sum to add to) beforehand.
template <typename T>
void Col2Im(const T* col, int64_t ld, const ConvGeom& g, T* dx) {
  for (int64_t c = 0; c < g.Cg; ++c) {
    T* dc = dx + c * g.H * g.W;
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const T* row = col + ((c * g.kh + i) * g.kw + j) * ld;
        const int64_t off = j * g.dw - g.pw;
        const int64_t lo = off >= 0 ? 0 : std::min(g.Wo, (-off + g.sw - 1) / g.sw);
        const int64_t hi =
            g.W - 1 - off < 0 ? lo : std::max(lo, std::min(g.Wo, (g.W - 1 - off) / g.sw + 1));
        for (int64_t oh = 0; oh < g.Ho; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + i * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          const T* r = row + oh * g.Wo;
          T* dr = dc + ih * g.W + off;
          if (g.sw == 1) {
            for (int64_t ow = lo; ow < hi; ++ow) dr[ow] += r[ow];
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) dr[ow * g.sw] += r[ow];
          }
        }
      }
  }
}

// C = alpha * op(A) * op(B) + beta * C over contiguous row-major matrices.
template <typename T>
void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, const T* B,
          T beta, T* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M * N; ++i) C[i] = beta == T(0) ? T(0) : C[i] * beta;
    return;
  }
  blas::Gemm<T>(ta, tb, M, N, K, alpha, A, B, beta, C);
}

// Attrs read once, in the constructor.
struct ConvAttrs {
  explicit ConvAttrs(const OpDesc& op)
      : strides(op.Attr<std::vector<int>>("strides")),
        paddings(op.Attr<std::vector<int>>("paddings")),
        dilations(op.Attr<std::vector<int>>("dilations")),
        groups(op.Attr<int>("groups")) {}
  ConvGeom Geom(const Tensor& x, const Tensor& f) const {
    return MakeGeom(x.dims(), f.dims(), strides, paddings, dilations, groups);
  }
  std::vector<int> strides, paddings, dilations;
  int groups;
};

// Unfolds images [n0, n0 + b) of group gi into col_ ([K, b * P]).
template <typename T>
void UnfoldBatch(const T* x, const ConvGeom& g, int64_t n0, int64_t b, int64_t gi, T* col) {
  for (int64_t k = 0; k < b; ++k)
    Im2Col(x + ((n0 + k) * g.C + gi * g.Cg) * g.H * g.W, g, col + k * g.P, b * g.P);
}

template <typename T>
class Conv2DKernel : public OpKernel {
 public:
  explicit Conv2DKernel(const OpDesc& op) : attrs_(op) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("Input");
    const Tensor& f = ctx.Input("Filter");
    Tensor* out = ctx.Output("Output");
    const ConvGeom g = attrs_.Geom(x, f);
    const T* xd = x.data<T>();
    const T* fd = f.data<T>();
    T* od = out->mutable_data<T>(ctx.place());
    const int64_t B = ImagesPerGemm(g);
    if (!g.one_by_one) col_.resize(static_cast<size_t>(g.K * B * g.P));
    if (B > 1) prod_.resize(static_cast<size_t>(g.Mg * B * g.P));
    for (int64_t n0 = 0; n0 < g.N; n0 += B) {
      const int64_t b = std::min(B, g.N - n0);
      for (int64_t gi = 0; gi < g.groups; ++gi) {
        const T* w = fd + gi * g.Mg * g.K;
        const T* col = xd + (n0 * g.C + gi * g.Cg) * g.H * g.W;  // 1x1: the plane itself
        if (!g.one_by_one) {
          UnfoldBatch(xd, g, n0, b, gi, col_.data());
          col = col_.data();
        }
        T* dst = od + (n0 * g.M + gi * g.Mg) * g.P;
        // out_g = w_g * col. out_g: Mg x (b * P), w_g: Mg x K, col: K x (b * P)
        Gemm<T>(false, false, g.Mg, b * g.P, g.K, T(1), w, col, T(0), b > 1 ? prod_.data() : dst);
        if (b > 1) {
          for (int64_t m = 0; m < g.Mg; ++m)
            for (int64_t k = 0; k < b; ++k)
              std::memcpy(dst + (k * g.M + m) * g.P, prod_.data() + (m * b + k) * g.P,
                          static_cast<size_t>(g.P) * sizeof(T));
        }
      }
    }
  }

 private:
  ConvAttrs attrs_;
  std::vector<T> col_, prod_;  // scratch, kept across runs
};

template <typename T>
class Conv2DGradKernel : public OpKernel {
 public:
  explicit Conv2DGradKernel(const OpDesc& op) : attrs_(op) {}

  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("Input"));
    Tensor* df = ctx.OutputOrNull(GradVarName("Filter"));
    if (dx == nullptr && df == nullptr) return;
    const Tensor& x = ctx.Input("Input");
    const Tensor& f = ctx.Input("Filter");
    const Tensor& dout = ctx.Input(GradVarName("Output"));
    const ConvGeom g = attrs_.Geom(x, f);
    KEEL_ENFORCE(dout.dims() == DDim({g.N, g.M, g.Ho, g.Wo}), "Output@GRAD ", dout.dims(),
                 " must have the output's shape ", DDim({g.N, g.M, g.Ho, g.Wo}), " (Input ",
                 x.dims(), ", Filter ", f.dims(), ")");
    const T* xd = x.data<T>();
    const T* fd = f.data<T>();
    const T* gd = dout.data<T>();
    T* dxd = dx ? dx->mutable_data<T>(ctx.place()) : nullptr;
    T* dfd = df ? df->mutable_data<T>(ctx.place()) : nullptr;
    // dFilter accumulates transposed, as [groups][K][Mg]: OpenBLAS runs the tall product col *
    // dout' about twice as fast as the wide dout * col' for the few filters of small convs.
    if (dfd) dft_.assign(static_cast<size_t>(g.groups * g.K * g.Mg), T(0));
    // col2im accumulates into dx; the 1x1 path writes it by GEMM directly.
    if (dxd && !g.one_by_one) std::fill(dxd, dxd + dx->numel(), T(0));
    const int64_t B = ImagesPerGemm(g);
    if (!g.one_by_one) col_.resize(static_cast<size_t>(g.K * B * g.P));
    if (B > 1) prod_.resize(static_cast<size_t>(g.Mg * B * g.P));
    for (int64_t n0 = 0; n0 < g.N; n0 += B) {
      const int64_t b = std::min(B, g.N - n0);
      for (int64_t gi = 0; gi < g.groups; ++gi) {
        // dout_g: [Mg, b * P], gathered from NCHW when b > 1.
        const T* dg = gd + (n0 * g.M + gi * g.Mg) * g.P;
        if (b > 1) {
          for (int64_t m = 0; m < g.Mg; ++m)
            for (int64_t k = 0; k < b; ++k)
              std::memcpy(prod_.data() + (m * b + k) * g.P, dg + (k * g.M + m) * g.P,
                          static_cast<size_t>(g.P) * sizeof(T));
          dg = prod_.data();
        }
        const T* w = fd + gi * g.Mg * g.K;
        const T* xg = xd + (n0 * g.C + gi * g.Cg) * g.H * g.W;
        if (dfd) {
          const T* col = xg;
          if (!g.one_by_one) {
            UnfoldBatch(xd, g, n0, b, gi, col_.data());
            col = col_.data();
          }
          // df_g' += col * dout_g'. df_g': K x Mg, col: K x (b * P), dout_g: Mg x (b * P)
          Gemm<T>(false, true, g.K, g.Mg, b * g.P, T(1), col, dg, T(1),
                  dft_.data() + gi * g.K * g.Mg);
        }
        if (dxd) {
          T* dxg = dxd + (n0 * g.C + gi * g.Cg) * g.H * g.W;
          // dcol = w_g' * dout_g. dcol: K x (b * P), w_g: Mg x K, dout_g: Mg x (b * P)
          if (g.one_by_one) {
            Gemm<T>(true, false, g.K, g.P, g.Mg, T(1), w, dg, T(0), dxg);
            continue;
          }
          Gemm<T>(true, false, g.K, b * g.P, g.Mg, T(1), w, dg, T(0), col_.data());
          for (int64_t k = 0; k < b; ++k)
            Col2Im(col_.data() + k * g.P, b * g.P, g, dxg + k * g.C * g.H * g.W);
        }
      }
    }
    if (dfd) {
      for (int64_t gi = 0; gi < g.groups; ++gi)
        for (int64_t m = 0; m < g.Mg; ++m)
          for (int64_t k = 0; k < g.K; ++k)
            dfd[(gi * g.Mg + m) * g.K + k] = dft_[(gi * g.K + k) * g.Mg + m];
    }
  }

 private:
  ConvAttrs attrs_;
  std::vector<T> col_, prod_, dft_;  // scratch, kept across runs
};

}  // namespace

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(conv2d)
    .Doc(
        "2-D convolution (cross-correlation), NCHW. Input [8, 3, 32, 32] with "
        "Filter "
        "[16, 3, 3, 3], strides {1, 1}, paddings {1, 1} gives Output [8, 16, "
        "32, 32]; groups g "
        "splits the channels into g independent convolutions (Filter [M, C / "
        "g, kh, kw]).")
    .Input("Input", "[N, C, H, W]")
    .Input("Filter", "[M, C / groups, kh, kw]")
    .Output("Output", "[N, M, Ho, Wo], Ho = (H + 2 * ph - (dh * (kh - 1) + 1)) / sh + 1")
    .Attr<std::vector<int>>("strides", {1, 1}, "(sh, sw)", PairAtLeast(1))
    .Attr<std::vector<int>>("paddings", {0, 0}, "(ph, pw): zeros added on each side",
                            PairAtLeast(0))
    .Attr<std::vector<int>>("dilations", {1, 1}, "(dh, dw): spacing of the filter taps",
                            PairAtLeast(1))
    .Attr<int>("groups", 1, "channel groups; C and M must divide by it",
               [](const Attribute& a) -> std::string {
                 return std::get<int>(a) >= 1 ? "" : "must be >= 1";
               })
    .Attr<std::string>("data_format", "NCHW", "only NCHW (AnyLayout reads as NCHW)", NchwOnly())
    .Shape(Conv2DShape)
    .Grad(GradMaker("conv2d_grad", {"Input", "Filter"}, {"Output"}, {"Input", "Filter"}));
KEEL_REGISTER_GRAD_OP(conv2d_grad, conv2d);
KEEL_REGISTER_CPU_KERNEL(conv2d, Conv2DKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(conv2d_grad, Conv2DGradKernel, float, double);

}  // namespace keel
