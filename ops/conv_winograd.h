// Winograd F(2x2, 3x3) for 3x3 convolutions with stride 1, no dilation, one group: forward,
// dInput (the forward of dOutput with the filter flipped and transposed) and dFilter.
//
// The output is cut into 2x2 tiles, each read from a 4x4 input tile. With
//   B' = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   A' = [1 1 1 0; 0 1 -1 -1],
// a tile's output is A' [(G g G') .* (B' d B')] A', summed over input channels: for each of the 16
// positions xi of the 4x4 transformed tile, one GEMM  Y_xi[tiles, M] = V_xi[tiles, C] * U_xi[M, C]'.
// That is 16 * C * M multiply-adds per 4 outputs instead of 36 * C * M: 2.25x fewer. dFilter
// follows by the chain rule: dU_xi[M, C] = Yg_xi' * V_xi with Yg the transformed dOutput tiles
// (A dY A'), then dg = G' dU G.
//
// The transforms work channels-last: a block of images is transposed to [n, y, x, c], so every
// transform step is a unit-stride loop over channels, which the compiler vectorizes whatever the
// plane size (the 8x8 planes of a ResNet's last stage give rows too short to vectorize along).
// Float32 results differ from direct convolution by rounding only (the transforms use 0.5 and 1).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace keel {
namespace winograd {

// Whether F(2x2, 3x3) serves this convolution, and pays: with fewer than 32 input or output
// channels the GEMMs get too thin (inner size C) for OpenBLAS to run them efficiently.
inline bool Applies(int64_t C, int64_t M, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                    int64_t dh, int64_t dw, int64_t ph, int64_t pw, int64_t groups) {
  return groups == 1 && kh == 3 && kw == 3 && sh == 1 && sw == 1 && dh == 1 && dw == 1 &&
         ph == pw && ph >= 0 && ph <= 2 && C >= 32 && M >= 32;
}

// dst[j * ldd + i] = src[i * lds + j] for i < rows, j < cols, in 8 x 8 blocks (AVX for float).
template <typename T>
void Transpose(const T* src, int64_t rows, int64_t cols, int64_t lds, T* dst, int64_t ldd) {
  for (int64_t i0 = 0; i0 < rows; i0 += 8)
    for (int64_t j0 = 0; j0 < cols; j0 += 8) {
      const int64_t i1 = std::min(rows, i0 + 8), j1 = std::min(cols, j0 + 8);
#if defined(__AVX__)
      if constexpr (std::is_same_v<T, float>) {
        if (i1 - i0 == 8 && j1 - j0 == 8) {
          const float* a = src + i0 * lds + j0;
          __m256 r0 = _mm256_loadu_ps(a), r1 = _mm256_loadu_ps(a + lds),
                 r2 = _mm256_loadu_ps(a + 2 * lds), r3 = _mm256_loadu_ps(a + 3 * lds),
                 r4 = _mm256_loadu_ps(a + 4 * lds), r5 = _mm256_loadu_ps(a + 5 * lds),
                 r6 = _mm256_loadu_ps(a + 6 * lds), r7 = _mm256_loadu_ps(a + 7 * lds);
          __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
                 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
          __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
          float* d = dst + j0 * ldd + i0;
          _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
          _mm256_storeu_ps(d + ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
          _mm256_storeu_ps(d + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
          _mm256_storeu_ps(d + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
          _mm256_storeu_ps(d + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
          _mm256_storeu_ps(d + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
          _mm256_storeu_ps(d + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
          _mm256_storeu_ps(d + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
          continue;
        }
      }
#endif
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) dst[j * ldd + i] = src[i * lds + j];
    }
}

template <typename T>
class Conv3x3 {
 public:
  // GEMM: C[M, N] = op(A) * op(B) + beta * C, row-major; op(A) is [M, K], op(B) is [K, N].
  using GemmFn = void (*)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A,
                          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);
  explicit Conv3x3(GemmFn gemm) : gemm_(gemm) {}

  // out [N, M, Ho, Wo] = conv(x [N, C, H, W], w [M, C, 3, 3]), pad p, Ho = H + 2p - 2.
  void Forward(const T* x, int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const T* w,
               int64_t M, T* out) {
    const Shape s(N, C, H, W, M, p);
    TransformFilter(w, M, C, /*flip_transpose=*/false);
    RunForward(x, s, out);
  }

  // dx [N, C, H, W] from dout [N, M, Ho, Wo] and w [M, C, 3, 3]: the forward convolution of
  // dout with w flipped in space and transposed ([C, M, 3, 3]), padded by 2 - p.
  void DataGrad(const T* dout, int64_t N, int64_t C, int64_t H, int64_t W, int64_t p, const T* w,
                int64_t M, T* dx) {
    const Shape s(N, M, H + 2 * p - 2, W + 2 * p - 2, C, 2 - p);
    TransformFilter(w, M, C, /*flip_transpose=*/true);
    RunForward(dout, s, dx);
  }

  // dw [M, C, 3, 3] = the gradient of sum(out .* dout) with respect to w.
  void FilterGrad(const T* x, int64_t N, int64_t C, int64_t H, int64_t W, int64_t p,
                  const T* dout, int64_t M, T* dw) {
    const Shape s(N, C, H, W, M, p);
    const int64_t B = BlockImages(s), per = s.th * s.tw;
    du_.assign(static_cast<size_t>(16 * M * C), T(0));
    for (int64_t n0 = 0; n0 < N; n0 += B) {
      const int64_t b = std::min(B, N - n0), tiles = b * per;
      TransformInput(x, s, n0, b);
      TransformOutputGrad(dout, s, n0, b);
      // dU_xi[M, C] += Yg_xi[tiles, M]' * V_xi[tiles, C]
      for (int xi = 0; xi < 16; ++xi)
        gemm_(true, false, M, C, tiles, y_.data() + xi * tiles * M, M,
              v_.data() + xi * tiles * C, C, T(1), du_.data() + xi * M * C, C);
    }
    // dg = G' dU G for every (m, c); G' = [1 .5 .5 0; 0 .5 -.5 0; 0 .5 .5 1].
    for (int64_t mc = 0; mc < M * C; ++mc) {
      T u[4][4], h[3][4];
      for (int xi = 0; xi < 16; ++xi) u[xi / 4][xi % 4] = du_[xi * M * C + mc];
      for (int j = 0; j < 4; ++j) {
        h[0][j] = u[0][j] + T(0.5) * (u[1][j] + u[2][j]);
        h[1][j] = T(0.5) * (u[1][j] - u[2][j]);
        h[2][j] = T(0.5) * (u[1][j] + u[2][j]) + u[3][j];
      }
      T* g = dw + mc * 9;
      for (int i = 0; i < 3; ++i) {
        g[i * 3 + 0] = h[i][0] + T(0.5) * (h[i][1] + h[i][2]);
        g[i * 3 + 1] = T(0.5) * (h[i][1] - h[i][2]);
        g[i * 3 + 2] = T(0.5) * (h[i][1] + h[i][2]) + h[i][3];
      }
    }
  }

 private:
  struct Shape {
    int64_t N, C, H, W, M, p;  // input [N, C, H, W], M filters, padding p on every side
    int64_t Ho, Wo, th, tw;    // output plane; tiles per column and per row
    Shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t m, int64_t pad)
        : N(n), C(c), H(h), W(w), M(m), p(pad) {
      Ho = H + 2 * p - 2, Wo = W + 2 * p - 2;
      th = (Ho + 1) / 2, tw = (Wo + 1) / 2;
    }
  };

  // Images per block: the larger transformed block (16 * tiles * max(C, M)) near 2^18 elements.
  static int64_t BlockImages(const Shape& s) {
    const int64_t per_image = 16 * s.th * s.tw * std::max(s.C, s.M);
    return std::max<int64_t>(1, std::min(s.N, (int64_t{1} << 18) / std::max<int64_t>(1, per_image)));
  }

  // U_xi[m, c] = (G g G')_xi, g = w[m, c] (or, flipped and transposed, w[c, m] rotated 180).
  void TransformFilter(const T* w, int64_t M, int64_t C, bool flip_transpose) {
    const int64_t Mo = flip_transpose ? C : M, Co = flip_transpose ? M : C;
    u_.resize(static_cast<size_t>(16 * Mo * Co));
    for (int64_t m = 0; m < Mo; ++m)
      for (int64_t c = 0; c < Co; ++c) {
        T g[3][3];
        for (int i = 0; i < 3; ++i)
          for (int j = 0; j < 3; ++j)
            g[i][j] = flip_transpose ? w[((c * C + m) * 3 + (2 - i)) * 3 + (2 - j)]
                                     : w[((m * C + c) * 3 + i) * 3 + j];
        T h[4][3];
        for (int j = 0; j < 3; ++j) {
          h[0][j] = g[0][j];
          h[1][j] = T(0.5) * (g[0][j] + g[1][j] + g[2][j]);
          h[2][j] = T(0.5) * (g[0][j] - g[1][j] + g[2][j]);
          h[3][j] = g[2][j];
        }
        for (int i = 0; i < 4; ++i) {
          T* u = u_.data() + (i * 4) * Mo * Co + m * Co + c;
          u[0 * Mo * Co] = h[i][0];
          u[1 * Mo * Co] = T(0.5) * (h[i][0] + h[i][1] + h[i][2]);
          u[2 * Mo * Co] = T(0.5) * (h[i][0] - h[i][1] + h[i][2]);
          u[3 * Mo * Co] = h[i][2];
        }
      }
  }

  void RunForward(const T* x, const Shape& s, T* out) {
    const int64_t B = BlockImages(s), per = s.th * s.tw;
    for (int64_t n0 = 0; n0 < s.N; n0 += B) {
      const int64_t b = std::min(B, s.N - n0), tiles = b * per;
      TransformInput(x, s, n0, b);
      y_.resize(static_cast<size_t>(16 * tiles * s.M));
      // Y_xi[tiles, M] = V_xi[tiles, C] * U_xi[M, C]'
      for (int xi = 0; xi < 16; ++xi)
        gemm_(false, true, tiles, s.M, s.C, v_.data() + xi * tiles * s.C, s.C,
              u_.data() + xi * s.M * s.C, s.C, T(0), y_.data() + xi * tiles * s.M, s.M);
      TransformOutput(s, n0, b, out);
    }
  }

  // planes [b, K, R, S] -> hwc [b, R, S, K].
  static void ToChannelsLast(const T* planes, int64_t b, int64_t K, int64_t R, int64_t S, T* hwc) {
    const int64_t P = R * S;
    for (int64_t n = 0; n < b; ++n) Transpose(planes + n * K * P, K, P, P, hwc + n * P * K, K);
  }

  // V_xi[t, c] = (B' d B)_xi for the tiles t of images [n0, n0 + b), t = (n * th + a) * tw + bb.
  void TransformInput(const T* x, const Shape& s, int64_t n0, int64_t b) {
    const int64_t C = s.C, tiles = b * s.th * s.tw;
    hwc_.resize(static_cast<size_t>(b * s.H * s.W * C));
    ToChannelsLast(x + n0 * C * s.H * s.W, b, C, s.H, s.W, hwc_.data());
    v_.resize(static_cast<size_t>(16 * tiles * C));
    zero_.assign(static_cast<size_t>(C), T(0));
    for (int64_t n = 0; n < b; ++n)
      for (int64_t a = 0; a < s.th; ++a)
        for (int64_t bb = 0; bb < s.tw; ++bb) {
          const T* d[16];
          for (int i = 0; i < 4; ++i) {
            const int64_t y = 2 * a + i - s.p;
            for (int j = 0; j < 4; ++j) {
              const int64_t xx = 2 * bb + j - s.p;
              d[i * 4 + j] = y >= 0 && y < s.H && xx >= 0 && xx < s.W
                                 ? hwc_.data() + ((n * s.H + y) * s.W + xx) * C
                                 : zero_.data();
            }
          }
          const int64_t t = (n * s.th + a) * s.tw + bb;
          InputTile(C, d, v_.data() + t * C, tiles * C);
        }
  }

  // v[xi * stride + c] = (B' d B)_xi, d_ij = d[i * 4 + j][c]: one tile, vectorized over c. The
  // results go through a local buffer, which cannot alias the inputs, so the compiler vectorizes.
  static void InputTile(int64_t C, const T* const* d, T* v, int64_t stride) {
    constexpr int64_t kChunk = 64;
    alignas(64) T buf[16][kChunk];
    for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
      const int64_t n = std::min(kChunk, C - c0);
      const T *d00 = d[0] + c0, *d01 = d[1] + c0, *d02 = d[2] + c0, *d03 = d[3] + c0;
      const T *d10 = d[4] + c0, *d11 = d[5] + c0, *d12 = d[6] + c0, *d13 = d[7] + c0;
      const T *d20 = d[8] + c0, *d21 = d[9] + c0, *d22 = d[10] + c0, *d23 = d[11] + c0;
      const T *d30 = d[12] + c0, *d31 = d[13] + c0, *d32 = d[14] + c0, *d33 = d[15] + c0;
      for (int64_t c = 0; c < n; ++c) {
        // Rows first: f_k = (B' d)_k, k = 0..3, each a row of 4 columns; then columns.
        const T f00 = d00[c] - d20[c], f01 = d01[c] - d21[c], f02 = d02[c] - d22[c],
                f03 = d03[c] - d23[c];
        const T f10 = d10[c] + d20[c], f11 = d11[c] + d21[c], f12 = d12[c] + d22[c],
                f13 = d13[c] + d23[c];
        const T f20 = d20[c] - d10[c], f21 = d21[c] - d11[c], f22 = d22[c] - d12[c],
                f23 = d23[c] - d13[c];
        const T f30 = d10[c] - d30[c], f31 = d11[c] - d31[c], f32 = d12[c] - d32[c],
                f33 = d13[c] - d33[c];
        buf[0][c] = f00 - f02, buf[1][c] = f01 + f02, buf[2][c] = f02 - f01;
        buf[3][c] = f01 - f03;
        buf[4][c] = f10 - f12, buf[5][c] = f11 + f12, buf[6][c] = f12 - f11;
        buf[7][c] = f11 - f13;
        buf[8][c] = f20 - f22, buf[9][c] = f21 + f22, buf[10][c] = f22 - f21;
        buf[11][c] = f21 - f23;
        buf[12][c] = f30 - f32, buf[13][c] = f31 + f32, buf[14][c] = f32 - f31;
        buf[15][c] = f31 - f33;
      }
      for (int xi = 0; xi < 16; ++xi)
        std::memcpy(v + xi * stride + c0, buf[xi], static_cast<size_t>(n) * sizeof(T));
    }
  }

  // out tiles = A' Y A for the images [n0, n0 + b), clipped to Ho x Wo, back to NCHW.
  void TransformOutput(const Shape& s, int64_t n0, int64_t b, T* out) {
    const int64_t M = s.M, tiles = b * s.th * s.tw;
    hwc_.resize(static_cast<size_t>(b * s.Ho * s.Wo * M));
    for (int64_t n = 0; n < b; ++n)
      for (int64_t a = 0; a < s.th; ++a)
        for (int64_t bb = 0; bb < s.tw; ++bb) {
          const int64_t t = (n * s.th + a) * s.tw + bb;
          const int64_t y0 = 2 * a, x0 = 2 * bb;
          T* o[4];
          for (int k = 0; k < 4; ++k) {
            const int64_t y = y0 + k / 2, xx = x0 + k % 2;
            // A clipped position is computed into a spare row and dropped.
            o[k] = y < s.Ho && xx < s.Wo ? hwc_.data() + ((n * s.Ho + y) * s.Wo + xx) * M
                                         : nullptr;
          }
          spare_.resize(static_cast<size_t>(M));
          for (int k = 0; k < 4; ++k)
            if (!o[k]) o[k] = spare_.data();
          OutputTile(M, y_.data() + t * M, tiles * M, o[0], o[1], o[2], o[3]);
        }
    // [b, Ho, Wo, M] -> out [n0 + n, M, Ho, Wo]
    const int64_t P = s.Ho * s.Wo;
    for (int64_t n = 0; n < b; ++n)
      Transpose(hwc_.data() + n * P * M, P, M, M, out + (n0 + n) * M * P, P);
  }

  // One tile's 2x2 output from y[xi * stride + m], vectorized over m.
  static void OutputTile(int64_t M, const T* __restrict y, int64_t stride, T* __restrict o00,
                         T* __restrict o01, T* __restrict o10, T* __restrict o11) {
    for (int64_t m = 0; m < M; ++m) {
      const T* p = y + m;
      // Rows: s0 = q0 + q1 + q2, s1 = q1 - q2 - q3 (per column j), then columns likewise.
      const T s00 = p[0] + p[4 * stride] + p[8 * stride];
      const T s01 = p[1 * stride] + p[5 * stride] + p[9 * stride];
      const T s02 = p[2 * stride] + p[6 * stride] + p[10 * stride];
      const T s03 = p[3 * stride] + p[7 * stride] + p[11 * stride];
      const T s10 = p[4 * stride] - p[8 * stride] - p[12 * stride];
      const T s11 = p[5 * stride] - p[9 * stride] - p[13 * stride];
      const T s12 = p[6 * stride] - p[10 * stride] - p[14 * stride];
      const T s13 = p[7 * stride] - p[11 * stride] - p[15 * stride];
      o00[m] = s00 + s01 + s02;
      o01[m] = s01 - s02 - s03;
      o10[m] = s10 + s11 + s12;
      o11[m] = s11 - s12 - s13;
    }
  }

  // Yg_xi[t, m] = (A g A')_xi for the 2x2 tiles g of dout (zero beyond Ho x Wo),
  // A = [1 0; 1 1; 1 -1; 0 -1].
  void TransformOutputGrad(const T* dout, const Shape& s, int64_t n0, int64_t b) {
    const int64_t M = s.M, tiles = b * s.th * s.tw;
    ghwc_.resize(static_cast<size_t>(b * s.Ho * s.Wo * M));
    ToChannelsLast(dout + n0 * M * s.Ho * s.Wo, b, M, s.Ho, s.Wo, ghwc_.data());
    y_.resize(static_cast<size_t>(16 * tiles * M));
    zero_.assign(static_cast<size_t>(std::max(M, s.C)), T(0));
    for (int64_t n = 0; n < b; ++n)
      for (int64_t a = 0; a < s.th; ++a)
        for (int64_t bb = 0; bb < s.tw; ++bb) {
          const T* g[4];
          for (int k = 0; k < 4; ++k) {
            const int64_t y = 2 * a + k / 2, xx = 2 * bb + k % 2;
            g[k] = y < s.Ho && xx < s.Wo ? ghwc_.data() + ((n * s.Ho + y) * s.Wo + xx) * M
                                         : zero_.data();
          }
          const int64_t t = (n * s.th + a) * s.tw + bb;
          OutputGradTile(M, g[0], g[1], g[2], g[3], y_.data() + t * M, tiles * M);
        }
  }

  static void OutputGradTile(int64_t M, const T* g00, const T* g01, const T* g10, const T* g11,
                             T* y, int64_t stride) {
    constexpr int64_t kChunk = 64;
    alignas(64) T buf[16][kChunk];
    for (int64_t m0 = 0; m0 < M; m0 += kChunk) {
      const int64_t n = std::min(kChunk, M - m0);
      const T *a00 = g00 + m0, *a01 = g01 + m0, *a10 = g10 + m0, *a11 = g11 + m0;
      for (int64_t m = 0; m < n; ++m) {
        // h = A g: rows (g0, g0 + g1, g0 - g1, -g1); then each row times A'.
        const T h00 = a00[m], h01 = a01[m];
        const T h10 = a00[m] + a10[m], h11 = a01[m] + a11[m];
        const T h20 = a00[m] - a10[m], h21 = a01[m] - a11[m];
        const T h30 = -a10[m], h31 = -a11[m];
        buf[0][m] = h00, buf[1][m] = h00 + h01, buf[2][m] = h00 - h01, buf[3][m] = -h01;
        buf[4][m] = h10, buf[5][m] = h10 + h11, buf[6][m] = h10 - h11, buf[7][m] = -h11;
        buf[8][m] = h20, buf[9][m] = h20 + h21, buf[10][m] = h20 - h21, buf[11][m] = -h21;
        buf[12][m] = h30, buf[13][m] = h30 + h31, buf[14][m] = h30 - h31, buf[15][m] = -h31;
      }
      for (int xi = 0; xi < 16; ++xi)
        std::memcpy(y + xi * stride + m0, buf[xi], static_cast<size_t>(n) * sizeof(T));
    }
  }

  GemmFn gemm_;
  // scratch, kept across runs
  std::vector<T> u_, v_, y_, du_, hwc_, ghwc_, zero_, spare_;
};

}  // namespace winograd
}  // namespace keel
