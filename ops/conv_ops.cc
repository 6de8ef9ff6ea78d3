// conv2d (PaddlePaddle Fluid 1.x slots and attrs) and its grad, on CPU by im2col + GEMM. The
// kernels are in conv_ops.h; here are the shape, the CPU math and the registrations.
//
// Legend: N = batch, C = input channels, M = output channels (filters), g = groups,
// Cg = C / g, Mg = M / g, H x W = input plane, Ho x Wo = output plane, P = Ho * Wo,
// K = Cg * kh * kw (one column of the unfolded input).
//
//   Ho = (H + 2 * ph - (dh * (kh - 1) + 1)) / sh + 1, likewise Wo.
//   Output[n, g*Mg + m, p] = sum_k Filter_g[m, k] * col_n_g[k, p]
//
// Small output planes (P below kMinGemmCols) unfold several images side by side, so one GEMM of
// [Mg, K] x [K, B * P] covers B images; the product is then scattered back to NCHW. Larger planes
// unfold in chunks of whole output rows of about kMinGemmCols columns, each GEMM writing its
// columns of the NCHW output directly (ldc = P): narrow GEMMs keep the unfolded chunk in cache and
// run much faster than one over the whole plane. A 1x1 conv with stride 1 and no padding skips
// im2col: the input plane is already the column matrix.
//
// float32 convs run by oneDNN's primitives instead (ops/conv_onednn.h, --conv_onednn): measured
// 1.2x (ResNet-20) to 1.4x (LeNet) faster per training step than these kernels. These remain for
// float64 (gradient checks) and geometries oneDNN refuses. bfloat16 convs run by oneDNN's bfloat16
// primitives, or widened to float32. (A Winograd F(2x2, 3x3) path for
// 32+-channel 3x3 convs was removed with that measurement: it no longer ran by default.)
#include "ops/conv_ops.h"

#include <gflags/gflags.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/image_layout.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/blas.h"
#include "framework/runtime/cpu_threads.h"
#include "ops/conv_onednn.h"
#include "ops/image_layout_cpu.h"
#include "ops/op_util.h"

DEFINE_bool(conv_onednn, true,
            "Run float32 conv2d and its gradients by oneDNN's convolution primitives (blocked "
            "layouts, reordered from and to NCHW per call); false: keel's own im2col + GEMM "
            "kernels.");

namespace keel {
namespace {

// GEMMs narrower than this (in columns) batch several images.
constexpr int64_t kMinGemmCols = 256;
// Cap on the unfolded buffer of one batch, in elements (64 MiB of float).
constexpr int64_t kMaxColElems = int64_t{16} << 20;

AttrCheckFn LayoutName() {
  return [](const Attribute& a) -> std::string {
    const auto& s = std::get<std::string>(a);
    return IsImageLayoutName(s) ? "" : "must be NCHW or NHWC (AnyLayout: NCHW), got '" + s + "'";
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
  bool nhwc;        // Input and Output are channels last (the dims above are still N, C, H, W)
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
  g.nhwc = false;
  return g;
}

// Images per GEMM: enough for kMinGemmCols columns, within kMaxColElems and N.
int64_t ImagesPerGemm(const ConvGeom& g) {
  if (g.one_by_one || g.P >= kMinGemmCols) return 1;
  int64_t b = (kMinGemmCols + g.P - 1) / g.P;
  b = std::min(b, std::max<int64_t>(1, kMaxColElems / std::max<int64_t>(1, g.K * g.P)));
  return std::max<int64_t>(1, std::min(b, g.N));
}

// Input [N, C, H, W] * Filter [M, C / groups, kh, kw] = Output [N, M, Ho, Wo]; channels last,
// Input [N, H, W, C] and Output [N, Ho, Wo, M] with the same Filter.
void Conv2DShape(InferShapeContext& ctx) {
  const ImageLayout layout = ParseImageLayout(ctx.Attr<std::string>("data_format"));
  const DDim given = ctx.GetInputDim("Input"), f = ctx.GetInputDim("Filter");
  const DDim x = ToNchw(given, layout);
  const auto& strides = ctx.Attr<std::vector<int>>("strides");
  const auto& paddings = ctx.Attr<std::vector<int>>("paddings");
  const auto& dilations = ctx.Attr<std::vector<int>>("dilations");
  const int groups = ctx.Attr<int>("groups");
  KEEL_SHAPE_CHECK(x.size() == 4, "Input must be 4-D ", ImageDimsName(layout), " (data_format ",
                   ImageLayoutName(layout), "), got Input ", given, " (Filter ", f, ")");
  KEEL_SHAPE_CHECK(f.size() == 4, "Filter must be 4-D [M, C / groups, kh, kw], got Filter ", f,
                   " (Input ", given, ")");
  KEEL_SHAPE_CHECK(ctx.GetInputDType("Input") == ctx.GetInputDType("Filter"), "Input is ",
                   DTypeName(ctx.GetInputDType("Input")), " but Filter is ",
                   DTypeName(ctx.GetInputDType("Filter")));
  KEEL_SHAPE_CHECK(f[0] > 0 && f[1] > 0 && f[2] > 0 && f[3] > 0, "Filter ", f,
                   " must be fully known (Input ", given, ")");
  KEEL_SHAPE_CHECK(f[0] % groups == 0, "Filter's ", f[0], " output channels must divide into ",
                   groups, " groups (Input ", given, ", Filter ", f, ")");
  KEEL_SHAPE_CHECK(ctx.DimEq(x[1], f[1] * groups), "Input's ", x[1],
                   " channels must equal Filter's in-channels ", f[1], " * groups ", groups,
                   " (Input ", given, ", Filter ", f, ", data_format ", ImageLayoutName(layout),
                   ")");
  DDim out{x[0], f[0], -1, -1};
  for (int d = 0; d < 2; ++d) {
    const int64_t o = ConvOutSize(x[2 + d], f[2 + d], strides[d], paddings[d], dilations[d]);
    KEEL_SHAPE_CHECK(x[2 + d] < 0 || o > 0, "the ", d == 0 ? "height" : "width",
                     " of Input is too small for the filter: Input ", given, ", Filter ", f,
                     ", strides ", IntsStr(strides), ", paddings ", IntsStr(paddings),
                     ", dilations ", IntsStr(dilations), " give output size ", o);
    out[2 + d] = o;
  }
  ctx.SetOutputDim("Output", FromNchw(out, layout));
  ctx.SetOutputDType("Output", ctx.GetInputDType("Input"));
}

// GCC turns short copy / zero loops into memcpy / memset calls, which cost more than the copies
// for rows of 8 to 32 elements; keep them inline.
#if defined(__GNUC__) && !defined(__clang__)
#define KEEL_INLINE_LOOPS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define KEEL_INLINE_LOOPS
#endif

// Output columns ow in [lo, hi) of filter column j read inside the input: 0 <= ow * sw + off < W,
// off = j * dw - pw. Likewise output rows oh in [lo, hi) of filter row i.
struct Span {
  int64_t off, lo, hi;
};
inline Span ValidSpan(int64_t tap, int64_t dil, int64_t pad, int64_t stride, int64_t in,
                      int64_t out) {
  Span s;
  s.off = tap * dil - pad;
  s.lo = s.off >= 0 ? 0 : std::min(out, (-s.off + stride - 1) / stride);
  s.hi = in - 1 - s.off < 0 ? s.lo : std::max(s.lo, std::min(out, (in - 1 - s.off) / stride + 1));
  return s;
}

// The common case of a 3x3 pad-1 conv, stride S in {1, 2}, with input rows S times as wide as
// output rows and a column shift off in {-1, 0, 1}, for a compile-time width WO: output column k
// reads input column S * k + off, which lies inside the row for all k but k = 0 when off < 0 and
// k = WO - 1 when S == 1 and off > 0. Each output row is then a fixed-size copy (or add) and at
// most one zero, which the compiler unrolls into a few vector moves.
template <typename T, int WO, int S>
KEEL_INLINE_LOOPS void Im2ColRowsFixed(const T* __restrict xc, int64_t W, int64_t sh, int64_t roff,
                                       int64_t base, int64_t oh0, int64_t oh1, int64_t off,
                                       T* __restrict row) {
  for (int64_t oh = oh0; oh < oh1; ++oh) {
    T* __restrict r = row + (oh - base) * WO;
    const T* __restrict xr = xc + (oh * sh + roff) * W;
    if (off == 0) {
      for (int k = 0; k < WO; ++k) r[k] = xr[S * k];
    } else if (off < 0) {
      r[0] = T(0);
      for (int k = 1; k < WO; ++k) r[k] = xr[S * k - 1];
    } else {
      constexpr int kHi = S == 1 ? WO - 1 : WO;
      for (int k = 0; k < kHi; ++k) r[k] = xr[S * k + 1];
      for (int k = kHi; k < WO; ++k) r[k] = T(0);
    }
  }
}

template <typename T, int WO, int S>
KEEL_INLINE_LOOPS void Col2ImRowsFixed(const T* __restrict row, int64_t W, int64_t sh, int64_t roff,
                                       int64_t base, int64_t oh0, int64_t oh1, int64_t off,
                                       T* __restrict dc) {
  for (int64_t oh = oh0; oh < oh1; ++oh) {
    const T* __restrict r = row + (oh - base) * WO;
    T* __restrict dr = dc + (oh * sh + roff) * W;
    if (off == 0) {
      for (int k = 0; k < WO; ++k) dr[S * k] += r[k];
    } else if (off < 0) {
      for (int k = 1; k < WO; ++k) dr[S * k - 1] += r[k];
    } else {
      constexpr int kHi = S == 1 ? WO - 1 : WO;
      for (int k = 0; k < kHi; ++k) dr[S * k + 1] += r[k];
    }
  }
}

// Whether Im2ColRowsFixed / Col2ImRowsFixed cover this geometry and column shift.
inline bool FixedRows(const ConvGeom& g, int64_t off) {
  return (g.sw == 1 || g.sw == 2) && g.W == g.sw * g.Wo && off >= -1 && off <= 1 &&
         (g.Wo == 8 || g.Wo == 16 || g.Wo == 32);
}

// Dispatches F<T, WO, S> over the widths and strides FixedRows accepts.
#define KEEL_FIXED_ROWS(F, ...)   \
  do {                            \
    if (g.sw == 1) {              \
      if (Wo == 8)                \
        F<T, 8, 1>(__VA_ARGS__);  \
      else if (Wo == 16)          \
        F<T, 16, 1>(__VA_ARGS__); \
      else                        \
        F<T, 32, 1>(__VA_ARGS__); \
    } else {                      \
      if (Wo == 8)                \
        F<T, 8, 2>(__VA_ARGS__);  \
      else if (Wo == 16)          \
        F<T, 16, 2>(__VA_ARGS__); \
      else                        \
        F<T, 32, 2>(__VA_ARGS__); \
    }                             \
  } while (0)

// Unfolds output rows [oh0, oh1) of one image's group of channels x [Cg, H, W] into col rows of
// length (oh1 - oh0) * Wo, row (c * kh + i) * kw + j holding, at (oh - oh0) * Wo + ow,
// x[c, oh * sh - ph + i * dh, ow * sw - pw + j * dw] (0 outside the input); consecutive rows are
// ld elements apart (several images side by side).
// Rows outside the input are zeroed in bulk; inside, each output row is a zero head, a copy (or a
// strided gather) and a zero tail, all inline loops (no per-row memcpy / memset calls).
template <typename T>
KEEL_INLINE_LOOPS void Im2Col(const T* __restrict x, const ConvGeom& g, T* __restrict col,
                              int64_t ld, int64_t oh0, int64_t oh1) {
  const int64_t Wo = g.Wo;
  for (int64_t i = 0; i < g.kh; ++i) {
    const Span rs = ValidSpan(i, g.dh, g.ph, g.sh, g.H, g.Ho);
    // Valid rows of this chunk: [vlo, vhi), within [oh0, oh1).
    const int64_t vlo = std::min(std::max(rs.lo, oh0), oh1);
    const int64_t vhi = std::max(std::min(rs.hi, oh1), vlo);
    for (int64_t j = 0; j < g.kw; ++j) {
      const Span cs = ValidSpan(j, g.dw, g.pw, g.sw, g.W, Wo);
      const int64_t lo = cs.lo, hi = cs.hi;
      // Whole rows copy as one block: stride 1, no column padding, input rows as wide as output.
      const bool block = g.sw == 1 && g.sh == 1 && lo == 0 && hi == Wo && Wo == g.W;
      const bool fixed = !block && FixedRows(g, cs.off);
      for (int64_t c = 0; c < g.Cg; ++c) {
        const T* xc = x + c * g.H * g.W;
        T* row = col + ((c * g.kh + i) * g.kw + j) * ld;
        if (vlo > oh0) Vec<T>(row, (vlo - oh0) * Wo).setZero();
        if (vhi < oh1) Vec<T>(row + (vhi - oh0) * Wo, (oh1 - vhi) * Wo).setZero();
        if (vhi <= vlo) continue;
        if (fixed) {
          KEEL_FIXED_ROWS(Im2ColRowsFixed, xc, g.W, g.sh, rs.off, oh0, vlo, vhi, cs.off, row);
          continue;
        }
        if (block) {
          const int64_t ih0 = vlo * g.sh + rs.off;
          Vec<T>(row + (vlo - oh0) * Wo, (vhi - vlo) * Wo) =
              ConstVec<T>(xc + ih0 * g.W + cs.off, (vhi - vlo) * Wo);
          continue;
        }
        for (int64_t oh = vlo; oh < vhi; ++oh) {
          T* __restrict r = row + (oh - oh0) * Wo;
          const T* __restrict xr = xc + (oh * g.sh + rs.off) * g.W + cs.off;
          for (int64_t ow = 0; ow < lo; ++ow) r[ow] = T(0);
          if (g.sw == 1) {
            for (int64_t ow = lo; ow < hi; ++ow) r[ow] = xr[ow];
          } else if (g.sw == 2) {
            for (int64_t ow = lo; ow < hi; ++ow) r[ow] = xr[2 * ow];
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) r[ow] = xr[ow * g.sw];
          }
          for (int64_t ow = hi; ow < Wo; ++ow) r[ow] = T(0);
        }
      }
    }
  }
}

// The adjoint of Im2Col (same chunk of output rows [oh0, oh1)): dx[c, ih, iw] += col[row, p] for
// every (row, p) that Im2Col read from (c, ih, iw). dx must be zeroed (or hold a sum to add to)
// beforehand.
template <typename T>
KEEL_INLINE_LOOPS void Col2Im(const T* __restrict col, int64_t ld, const ConvGeom& g, int64_t oh0,
                              int64_t oh1, T* __restrict dx) {
  const int64_t Wo = g.Wo;
  for (int64_t i = 0; i < g.kh; ++i) {
    const Span rs = ValidSpan(i, g.dh, g.ph, g.sh, g.H, g.Ho);
    const int64_t vlo = std::max(rs.lo, oh0), vhi = std::min(rs.hi, oh1);
    if (vhi <= vlo) continue;
    for (int64_t j = 0; j < g.kw; ++j) {
      const Span cs = ValidSpan(j, g.dw, g.pw, g.sw, g.W, Wo);
      const int64_t lo = cs.lo, hi = cs.hi;
      const bool block = g.sw == 1 && g.sh == 1 && lo == 0 && hi == Wo && Wo == g.W;
      const bool fixed = !block && FixedRows(g, cs.off);
      for (int64_t c = 0; c < g.Cg; ++c) {
        T* dc = dx + c * g.H * g.W;
        const T* row = col + ((c * g.kh + i) * g.kw + j) * ld;
        if (fixed) {
          KEEL_FIXED_ROWS(Col2ImRowsFixed, row, g.W, g.sh, rs.off, oh0, vlo, vhi, cs.off, dc);
          continue;
        }
        if (block) {
          const int64_t ih0 = vlo * g.sh + rs.off;
          Vec<T>(dc + ih0 * g.W + cs.off, (vhi - vlo) * Wo) +=
              ConstVec<T>(row + (vlo - oh0) * Wo, (vhi - vlo) * Wo);
          continue;
        }
        for (int64_t oh = vlo; oh < vhi; ++oh) {
          const T* __restrict r = row + (oh - oh0) * Wo;
          T* __restrict dr = dc + (oh * g.sh + rs.off) * g.W + cs.off;
          if (g.sw == 1) {
            for (int64_t ow = lo; ow < hi; ++ow) dr[ow] += r[ow];
          } else if (g.sw == 2) {
            for (int64_t ow = lo; ow < hi; ++ow) dr[2 * ow] += r[ow];
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) dr[ow * g.sw] += r[ow];
          }
        }
      }
    }
  }
}

#undef KEEL_FIXED_ROWS
#undef KEEL_INLINE_LOOPS

// C = alpha * op(A) * op(B) + beta * C over row-major matrices with row strides lda, ldb, ldc.
template <typename T>
void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : C[i * ldc + j] * beta;
    return;
  }
  blas::Gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Output rows per GEMM chunk: one image's plane is split into chunks of whole output rows of about
// kMinGemmCols columns (narrow GEMMs keep the unfolded chunk in cache and run faster); batched
// small planes and 1x1 convs take whole planes.
int64_t RowsPerChunk(const ConvGeom& g, int64_t b) {
  if (g.one_by_one || b > 1 || g.P <= kMinGemmCols) return std::max<int64_t>(1, g.Ho);
  return std::max<int64_t>(1, kMinGemmCols / std::max<int64_t>(1, g.Wo));
}

}  // namespace

// Attrs read once, in the constructor.
struct ConvAttrs {
  explicit ConvAttrs(const OpDesc& op)
      : strides(op.Attr<std::vector<int>>("strides")),
        paddings(op.Attr<std::vector<int>>("paddings")),
        dilations(op.Attr<std::vector<int>>("dilations")),
        groups(op.Attr<int>("groups")),
        layout(ParseImageLayout(op.Attr<std::string>("data_format"))) {}
  ConvGeom Geom(const Tensor& x, const Tensor& f) const {
    ConvGeom g = MakeGeom(ToNchw(x.dims(), layout), f.dims(), strides, paddings, dilations, groups);
    g.nhwc = layout == ImageLayout::kNHWC;
    return g;
  }
  std::vector<int> strides, paddings, dilations;
  int groups;
  ImageLayout layout;
};

// Unfolds output rows [oh0, oh1) of images [n0, n0 + b) of group gi into col ([K, b * cols],
// cols = (oh1 - oh0) * Wo).
template <typename T>
void UnfoldBatch(const T* x, const ConvGeom& g, int64_t n0, int64_t b, int64_t gi, int64_t oh0,
                 int64_t oh1, T* col) {
  const int64_t cols = (oh1 - oh0) * g.Wo;
  for (int64_t k = 0; k < b; ++k)
    Im2Col(x + ((n0 + k) * g.C + gi * g.Cg) * g.H * g.W, g, col + k * cols, b * cols, oh0, oh1);
}

// Per-piece scratch of a conv kernel, kept across runs.
template <typename T>
struct ConvScratch {
  ScratchVector<T> col, prod, dft, dw;
};
// A conv kernel's scratch: its pieces', and the NCHW copies of channels-last tensors that the
// im2col + GEMM loops read and write.
template <typename T>
struct ConvScratches {
  std::vector<std::unique_ptr<ConvScratch<T>>> pieces;
  ScratchVector<T> x, y, dy, dx;
};

// The batch is cut into pieces of whole images that run on the CPU thread budget; the cut
// depends on the shape only (at least ~4 MFLOP a piece, at most 4 pieces), so results are the
// same bits on any number of threads. Filter gradients are summed over pieces in piece order.
// ~4 MFLOP is some 50 us of work, far above handing a piece to a pool thread. Measured on 2
// threads, interleaved: LeNet (convs of 5.5 and 20 MFLOP at batch 64, one piece each with the
// earlier 32 MFLOP minimum) 4.2-4.3 ms a step against 4.9-5.2; ResNet-20 and one thread alike.
int64_t ImagesPerPiece(const ConvGeom& g) {
  constexpr double kMinPieceFlops = 4e6;
  const double flops = 2.0 * g.N * g.M * g.P * g.K;
  const int64_t pieces = std::clamp<int64_t>(static_cast<int64_t>(flops / kMinPieceFlops), 1,
                                             std::min<int64_t>(g.N, 4));
  return (g.N + pieces - 1) / pieces;
}

template <typename T>
void GrowScratch(std::vector<std::unique_ptr<ConvScratch<T>>>* scratch, size_t n) {
  while (scratch->size() < n) scratch->push_back(std::make_unique<ConvScratch<T>>());
}

// The geometry as oneDNN's primitives take it (ops/conv_onednn.h), for n images.
onednn::ConvShape OneDnnShape(const ConvGeom& g) {
  return {g.N,  g.C,  g.H,  g.W,  g.M,      g.kh, g.kw, g.sh,  g.sw,
          g.ph, g.pw, g.dh, g.dw, g.groups, g.Ho, g.Wo, g.nhwc};
}

// A channels-last tensor of n images of C channels and HW positions, copied to NCHW into `copy`
// for the loops; an NCHW one as it is.
template <typename T>
const T* Planar(const ConvGeom& g, const T* p, int64_t C, int64_t HW, ScratchVector<T>* copy) {
  if (!g.nhwc) return p;
  copy->resize(static_cast<size_t>(g.N * C * HW));
  NhwcToNchw(p, copy->data(), g.N, C, HW);
  return copy->data();
}
// Where the loops write an output of n images of C channels and HW positions: `p` for NCHW, else
// `copy` (Unplanar then moves it to `p`).
template <typename T>
T* PlanarOut(const ConvGeom& g, T* p, int64_t C, int64_t HW, ScratchVector<T>* copy) {
  if (!g.nhwc || p == nullptr) return p;
  copy->resize(static_cast<size_t>(g.N * C * HW));
  return copy->data();
}
template <typename T>
void Unplanar(const ConvGeom& g, const T* planar, T* p, int64_t C, int64_t HW) {
  if (g.nhwc && p != nullptr) NchwToNhwc(planar, p, g.N, C, HW);
}

namespace {

// Output of the images of x (g.N of them) into od.
template <typename T>
void RunForward(const ConvGeom& g, const T* xd, const T* fd, T* od, ConvScratch<T>& s) {
  const int64_t B = ImagesPerGemm(g);
  if (!g.one_by_one) {
    const int64_t cols = B > 1 ? B * g.P : std::min(RowsPerChunk(g, 1), g.Ho) * g.Wo;
    s.col.resize(static_cast<size_t>(g.K * cols));
  }
  if (B > 1) s.prod.resize(static_cast<size_t>(g.Mg * B * g.P));
  for (int64_t n0 = 0; n0 < g.N; n0 += B) {
    const int64_t b = std::min(B, g.N - n0);
    const int64_t rows = RowsPerChunk(g, b);
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      const T* w = fd + gi * g.Mg * g.K;
      T* dst = od + (n0 * g.M + gi * g.Mg) * g.P;
      if (b == 1) {
        // One image, in chunks of output rows written straight into NCHW (ldc = P).
        for (int64_t oh0 = 0; oh0 < g.Ho; oh0 += rows) {
          const int64_t oh1 = std::min(g.Ho, oh0 + rows), cols = (oh1 - oh0) * g.Wo;
          // 1x1: the input plane is the column matrix.
          const T* col = xd + (n0 * g.C + gi * g.Cg) * g.H * g.W + oh0 * g.Wo;
          int64_t ldcol = g.P;
          if (!g.one_by_one) {
            UnfoldBatch(xd, g, n0, 1, gi, oh0, oh1, s.col.data());
            col = s.col.data(), ldcol = cols;
          }
          // out_g[:, chunk] = w_g * col. w_g: Mg x K, col: K x cols
          Gemm<T>(false, false, g.Mg, cols, g.K, T(1), w, g.K, col, ldcol, T(0), dst + oh0 * g.Wo,
                  g.P);
        }
        continue;
      }
      UnfoldBatch(xd, g, n0, b, gi, 0, g.Ho, s.col.data());
      // prod = w_g * col. prod: Mg x (b * P), w_g: Mg x K, col: K x (b * P)
      Gemm<T>(false, false, g.Mg, b * g.P, g.K, T(1), w, g.K, s.col.data(), b * g.P, T(0),
              s.prod.data(), b * g.P);
      {
        for (int64_t m = 0; m < g.Mg; ++m)
          for (int64_t k = 0; k < b; ++k)
            std::memcpy(dst + (k * g.M + m) * g.P, s.prod.data() + (m * b + k) * g.P,
                        static_cast<size_t>(g.P) * sizeof(T));
      }
    }
  }
}

// Input and filter gradients of the images of x (g.N of them); dxd or dfd may be null.
template <typename T>
void RunBackward(const ConvGeom& g, const T* xd, const T* fd, const T* gd, T* dxd, T* dfd,
                 ConvScratch<T>& s) {
  // dFilter accumulates transposed, as [groups][K][Mg]: the GEMM runs the tall product col *
  // dout' about twice as fast as the wide dout * col' for the few filters of small convs.
  if (dfd) s.dft.assign(static_cast<size_t>(g.groups * g.K * g.Mg), T(0));
  // col2im accumulates into dx; the 1x1 path writes it by GEMM directly.
  if (dxd && !g.one_by_one) std::fill(dxd, dxd + g.N * g.C * g.H * g.W, T(0));
  const int64_t B = ImagesPerGemm(g);
  if (!g.one_by_one) {
    const int64_t cols = B > 1 ? B * g.P : std::min(RowsPerChunk(g, 1), g.Ho) * g.Wo;
    s.col.resize(static_cast<size_t>(g.K * cols));
  }
  if (B > 1) s.prod.resize(static_cast<size_t>(g.Mg * B * g.P));
  for (int64_t n0 = 0; n0 < g.N; n0 += B) {
    const int64_t b = std::min(B, g.N - n0);
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      // dout_g: [Mg, b * P], gathered from NCHW when b > 1.
      const T* dg = gd + (n0 * g.M + gi * g.Mg) * g.P;
      if (b > 1) {
        for (int64_t m = 0; m < g.Mg; ++m)
          for (int64_t k = 0; k < b; ++k)
            std::memcpy(s.prod.data() + (m * b + k) * g.P, dg + (k * g.M + m) * g.P,
                        static_cast<size_t>(g.P) * sizeof(T));
        dg = s.prod.data();
      }
      const T* w = fd + gi * g.Mg * g.K;
      const T* xg = xd + (n0 * g.C + gi * g.Cg) * g.H * g.W;
      T* dxg = dxd ? dxd + (n0 * g.C + gi * g.Cg) * g.H * g.W : nullptr;
      // Chunks of output rows (whole planes when b > 1 or 1x1); dout's chunk is read in place
      // (ld P) for one image, from the gathered [Mg, b * P] otherwise.
      const int64_t rows = RowsPerChunk(g, b), lddg = b > 1 ? b * g.P : g.P;
      for (int64_t oh0 = 0; oh0 < g.Ho; oh0 += rows) {
        const int64_t oh1 = std::min(g.Ho, oh0 + rows), cols = (oh1 - oh0) * g.Wo;
        const int64_t width = b * cols;
        const T* dgc = b > 1 ? dg : dg + oh0 * g.Wo;
        if (dfd) {
          const T* col = xg + oh0 * g.Wo;  // 1x1: the input plane, ld P
          int64_t ldcol = g.P;
          if (!g.one_by_one) {
            UnfoldBatch(xd, g, n0, b, gi, oh0, oh1, s.col.data());
            col = s.col.data(), ldcol = width;
          }
          // df_g' += col * dout_g'. df_g': K x Mg, col: K x width, dout_g: Mg x width
          Gemm<T>(false, true, g.K, g.Mg, width, T(1), col, ldcol, dgc, lddg, T(1),
                  s.dft.data() + gi * g.K * g.Mg, g.Mg);
        }
        if (dxd) {
          // dcol = w_g' * dout_g. dcol: K x width, w_g: Mg x K, dout_g: Mg x width
          if (g.one_by_one) {
            Gemm<T>(true, false, g.K, cols, g.Mg, T(1), w, g.K, dgc, lddg, T(0), dxg + oh0 * g.Wo,
                    g.P);
            continue;
          }
          Gemm<T>(true, false, g.K, width, g.Mg, T(1), w, g.K, dgc, lddg, T(0), s.col.data(),
                  width);
          for (int64_t k = 0; k < b; ++k)
            Col2Im(s.col.data() + k * cols, width, g, oh0, oh1, dxg + k * g.C * g.H * g.W);
        }
      }
    }
  }
  if (dfd) {
    for (int64_t gi = 0; gi < g.groups; ++gi)
      for (int64_t m = 0; m < g.Mg; ++m)
        for (int64_t k = 0; k < g.K; ++k)
          dfd[(gi * g.Mg + m) * g.K + k] = s.dft[(gi * g.K + k) * g.Mg + m];
  }
}

// float32 by oneDNN's primitives (in the same pieces of whole images, either layout) when they
// take the geometry, else and for float64 im2col + GEMM (channels last: over NCHW copies).
template <typename T>
void ConvForward(const ConvAttrs& attrs, ConvScratches<T>* ss, onednn::PiecedConv& onednn,
                 const Tensor& x, const Tensor& f, T* od) {
  const ConvGeom g = attrs.Geom(x, f);
  const T* fd = f.data<T>();
  if constexpr (std::is_same_v<T, float>) {
    if (FLAGS_conv_onednn && onednn.Forward(OneDnnShape(g), ImagesPerPiece(g), x.data<T>(), fd, od))
      return;
  }
  const T* xd = Planar(g, x.data<T>(), g.C, g.H * g.W, &ss->x);
  T* yd = PlanarOut(g, od, g.M, g.P, &ss->y);
  const int64_t per = ImagesPerPiece(g), pieces = (g.N + per - 1) / per;
  std::vector<std::unique_ptr<ConvScratch<T>>>* scratch = &ss->pieces;
  GrowScratch(scratch, static_cast<size_t>(pieces));
  cpu_threads::ParallelFor(pieces, [&](int64_t p) {
    ConvGeom gp = g;
    gp.N = std::min(per, g.N - p * per);
    RunForward(gp, xd + p * per * g.C * g.H * g.W, fd, yd + p * per * g.M * g.P, *(*scratch)[p]);
  });
  Unplanar(g, yd, od, g.M, g.P);
}

template <typename T>
void ConvBackward(const ConvAttrs& attrs, ConvScratches<T>* ss, onednn::PiecedConv& onednn,
                  const Tensor& x, const Tensor& f, const Tensor& dout, T* dxd, T* dfd) {
  const ConvGeom g = attrs.Geom(x, f);
  const DDim out = FromNchw(DDim({g.N, g.M, g.Ho, g.Wo}), attrs.layout);
  KEEL_ENFORCE(dout.dims() == out, "Output@GRAD ", dout.dims(), " must have the output's shape ",
               out, " (Input ", x.dims(), ", Filter ", f.dims(), ")");
  const T* fd = f.data<T>();
  if constexpr (std::is_same_v<T, float>) {
    if (FLAGS_conv_onednn && onednn.Backward(OneDnnShape(g), ImagesPerPiece(g), x.data<T>(), fd,
                                             dout.data<T>(), dxd, dfd))
      return;
  }
  const T* xd = Planar(g, x.data<T>(), g.C, g.H * g.W, &ss->x);
  const T* gd = Planar(g, dout.data<T>(), g.M, g.P, &ss->dy);
  T* const dx_user = dxd;
  dxd = PlanarOut(g, dxd, g.C, g.H * g.W, &ss->dx);
  const int64_t per = ImagesPerPiece(g), pieces = (g.N + per - 1) / per;
  const int64_t fsize = g.M * g.Cg * g.kh * g.kw;
  std::vector<std::unique_ptr<ConvScratch<T>>>* scratch = &ss->pieces;
  GrowScratch(scratch, static_cast<size_t>(pieces));
  cpu_threads::ParallelFor(pieces, [&](int64_t p) {
    ConvScratch<T>& s = *(*scratch)[p];
    ConvGeom gp = g;
    gp.N = std::min(per, g.N - p * per);
    // One piece writes the filter gradient in place; several each write their own part.
    T* dfp = nullptr;
    if (dfd) {
      if (pieces > 1) s.dw.resize(static_cast<size_t>(fsize));
      dfp = pieces > 1 ? s.dw.data() : dfd;
    }
    RunBackward(gp, xd + p * per * g.C * g.H * g.W, fd, gd + p * per * g.M * g.P,
                dxd ? dxd + p * per * g.C * g.H * g.W : nullptr, dfp, s);
  });
  if (dfd && pieces > 1) {
    std::copy((*scratch)[0]->dw.begin(), (*scratch)[0]->dw.begin() + fsize, dfd);
    for (int64_t p = 1; p < pieces; ++p)
      for (int64_t i = 0; i < fsize; ++i) dfd[i] += (*scratch)[p]->dw[i];
  }
  Unplanar(g, dxd, dx_user, g.C, g.H * g.W);
}

}  // namespace

// im2col + GEMM in pieces of whole images on the CPU thread budget; float32 by oneDNN's
// primitives when they take the geometry. bfloat16 (mixed precision) by oneDNN's bfloat16
// primitives (float32 accumulation) where this CPU has them; otherwise, as float16 would be,
// widened to float32 for the float32 conv, the results rounded once (float16 conv2d has no CPU
// kernel registered: oneDNN has no float16 convolutions before AVX512-FP16).
template <typename T>
class ConvMath<CPUDevice, T> {
  using A = Acc<T>;

 public:
  explicit ConvMath(const OpDesc& op) : attrs_(op) {}
  void Forward(const ExecutionContext&, const Tensor& x, const Tensor& f,
               [[maybe_unused]] const Tensor& out, T* od) {
    if constexpr (kIsHalf<T>) {
      const ConvGeom g = attrs_.Geom(x, f);
      if (FLAGS_conv_onednn &&
          half_.Forward(OneDnnShape(g), ImagesPerPiece(g), x.data<T>(), f.data<T>(), od))
        return;
      ConvForward(attrs_, &scratch_, onednn_, Widened(x, &x_), Widened(f, &f_),
                  Sized(out.dims(), &out_));
      NarrowInPieces(out_.data<float>(), od, out.numel());
    } else {
      ConvForward(attrs_, &scratch_, onednn_, x, f, od);
    }
  }
  void Backward(const ExecutionContext&, const Tensor& x, const Tensor& f, const Tensor& dout,
                [[maybe_unused]] const Tensor* dx, [[maybe_unused]] const Tensor* df, T* dxd,
                T* dfd) {
    if constexpr (kIsHalf<T>) {
      const ConvGeom g = attrs_.Geom(x, f);
      if (FLAGS_conv_onednn && half_.Backward(OneDnnShape(g), ImagesPerPiece(g), x.data<T>(),
                                              f.data<T>(), dout.data<T>(), dxd, dfd))
        return;
      ConvBackward(attrs_, &scratch_, onednn_, Widened(x, &x_), Widened(f, &f_),
                   Widened(dout, &out_), dxd ? Sized(dx->dims(), &dx_) : nullptr,
                   dfd ? Sized(df->dims(), &df_) : nullptr);
      if (dxd) NarrowInPieces(dx_.data<float>(), dxd, dx->numel());
      if (dfd) NarrowInPieces(df_.data<float>(), dfd, df->numel());
    } else {
      ConvBackward(attrs_, &scratch_, onednn_, x, f, dout, dxd, dfd);
    }
  }

 private:
  // `t` widened to float32 into `keep`.
  static const Tensor& Widened(const Tensor& t, Tensor* keep) {
    WidenInPieces(t.data<T>(), Sized(t.dims(), keep), t.numel());
    return *keep;
  }
  static float* Sized(const DDim& d, Tensor* keep) {
    keep->Resize(d);
    return keep->mutable_data<float>();
  }

  ConvAttrs attrs_;
  ConvScratches<A> scratch_;
  onednn::PiecedConv onednn_{dnnl::memory::data_type::f32};  // float32's primitives
  onednn::PiecedConv half_{dnnl::memory::data_type::bf16};   // bfloat16's
  Tensor x_, f_, out_, dx_, df_;  // the 16-bit types' float32 copies (widened path)
};

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(conv2d)
    .Doc(
        "2-D convolution (cross-correlation), NCHW or (data_format NHWC) channels last. Input "
        "[8, 3, 32, 32] with Filter [16, 3, 3, 3], strides {1, 1}, paddings {1, 1} gives Output "
        "[8, 16, 32, 32] (NHWC: Input [8, 32, 32, 3], Output [8, 32, 32, 16]); groups g splits "
        "the channels into g independent convolutions (Filter [M, C / g, kh, kw]).")
    .Input("Input", "[N, C, H, W] (NHWC: [N, H, W, C])")
    .Input("Filter", "[M, C / groups, kh, kw], in either layout")
    .Output("Output",
            "[N, M, Ho, Wo] (NHWC: [N, Ho, Wo, M]), Ho = (H + 2 * ph - (dh * (kh - 1) + 1)) / sh "
            "+ 1")
    .Attr<std::vector<int>>("strides", {1, 1}, "(sh, sw)", PairAtLeast(1))
    .Attr<std::vector<int>>("paddings", {0, 0}, "(ph, pw): zeros added on each side",
                            PairAtLeast(0))
    .Attr<std::vector<int>>("dilations", {1, 1}, "(dh, dw): spacing of the filter taps",
                            PairAtLeast(1))
    .Attr<int>("groups", 1, "channel groups; C and M must divide by it",
               [](const Attribute& a) -> std::string {
                 return std::get<int>(a) >= 1 ? "" : "must be >= 1";
               })
    .Attr<std::string>("data_format", "NCHW",
                       "NCHW, or NHWC (channels last: Input [N, H, W, C], Output [N, Ho, Wo, M], "
                       "the same Filter); AnyLayout reads as NCHW",
                       LayoutName())
    .Shape(Conv2DShape)
    .Grad(GradMaker("conv2d_grad", {"Input", "Filter"}, {"Output"}, {"Input", "Filter"}));
KEEL_REGISTER_GRAD_OP(conv2d_grad, conv2d).ComputesOutputsApart();
KEEL_REGISTER_KERNEL(CPU, conv2d, Conv2DKernel, float, double, bfloat16);
KEEL_REGISTER_KERNEL(CPU, conv2d_grad, Conv2DGradKernel, float, double, bfloat16);

}  // namespace keel
