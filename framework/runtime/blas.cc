#include "framework/runtime/blas.h"

#include <oneapi/dnnl/dnnl.h>

#include <Eigen/Core>
#include <algorithm>
#include <vector>

#include "framework/error.h"
#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/half_convert.h"

namespace keel {
namespace blas {

namespace {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using Strided = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;
template <typename T>
using StridedOut = Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>>;

template <typename T>
void EigenGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
               const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  Strided<T> a(A, ta ? K : M, ta ? M : K, Eigen::OuterStride<>(lda));
  Strided<T> b(B, tb ? N : K, tb ? K : N, Eigen::OuterStride<>(ldb));
  StridedOut<T> c(C, M, N, Eigen::OuterStride<>(ldc));
  if (beta == T(0))
    c.setZero();
  else if (beta != T(1))
    c *= beta;
  if (!ta && !tb)
    c.noalias() += alpha * a * b;
  else if (ta && !tb)
    c.noalias() += alpha * a.transpose() * b;
  else if (!ta && tb)
    c.noalias() += alpha * a * b.transpose();
  else
    c.noalias() += alpha * a.transpose() * b.transpose();
}

void OneDnnSgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cpu_threads::UseOneOpenMPThread();
  dnnl_status_t st =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  KEEL_ENFORCE(st == dnnl_success, "oneDNN sgemm of ", M, "x", N, "x", K, " failed (status ",
               static_cast<int>(st), ")");
}

}  // namespace

int64_t GemmPieces(int64_t M, int64_t N, int64_t K) {
  // About 64 MFLOP or more per piece (~0.4 ms on one core), each >= 64 rows or columns, at most
  // 8, and a power of two, so that 2, 4 or 8 threads get even shares. A piece is a GEMM of its
  // own that packs the whole operand it does not cut again: the seed MLP's 128x1280x1280 products
  // ran 23 % slower in 8 pieces than whole on one thread, 14 % in 4 (docs/performance.md).
  const double flops =
      2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  int64_t pieces = static_cast<int64_t>(flops / 64e6);
  pieces = std::clamp<int64_t>(std::min<int64_t>(pieces, std::max(M, N) / 64), 1, 8);
  while ((pieces & (pieces - 1)) != 0) --pieces;  // the power of two at or below
  return pieces;
}

int64_t GemmPieceLength(int64_t len, int64_t pieces) {
  return ((len + pieces - 1) / pieces + 15) / 16 * 16;
}

void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const int64_t pieces = GemmPieces(M, N, K);
  if (pieces == 1) return OneDnnSgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  // Pieces of C's longer side, a function of the shape alone: every element is computed the same
  // way whatever the number of threads.
  const bool split_n = N >= M;
  const int64_t len = split_n ? N : M;
  const int64_t step = GemmPieceLength(len, pieces);
  cpu_threads::ParallelFor((len + step - 1) / step, [&](int64_t p) {
    const int64_t begin = p * step, n = std::min(step, len - begin);
    if (split_n) {
      OneDnnSgemm(ta, tb, M, n, K, alpha, A, lda, tb ? B + begin * ldb : B + begin, ldb, beta,
                  C + begin, ldc);
    } else {
      OneDnnSgemm(ta, tb, n, N, K, alpha, ta ? A + begin : A + begin * lda, lda, B, ldb, beta,
                  C + begin * ldc, ldc);
    }
  });
}

namespace {

// The float32 results of one block of a narrowing GEMM: per thread, kept up to 8 MB, a larger one
// (a block of 16 rows of more than 131072 columns) allocated for its call alone.
class PieceScratch {
 public:
  explicit PieceScratch(int64_t n) {
    constexpr int64_t kKept = (8 << 20) / sizeof(float);
    thread_local std::vector<float> kept;
    if (n <= kKept) {
      if (static_cast<int64_t>(kept.size()) < n) kept.resize(static_cast<size_t>(n));
      data_ = kept.data();
    } else {
      own_.resize(static_cast<size_t>(n));
      data_ = own_.data();
    }
  }
  float* data() const { return data_; }

 private:
  std::vector<float> own_;
  float* data_ = nullptr;
};

// Blocks of C's rows, a function of the shape alone, each computed by one oneDNN sgemm into a
// float32 scratch of about 512 KB, which stays in the core's L2 cache, and handed to
// store(scratch, first row, rows) from there: rounded into a 16-bit C (NarrowingGemm), or added
// into C (GemmAccumulate). (Rounding the float32 GEMM's own pieces, 1280 x 160 for the seed MLP's
// largest weight gradient, 800 KB, saved nothing over a separate cast: 2.32 against 2.10 + 0.27
// ms; blocks of whole rows of C took 2.06-2.13 ms on the same Zen 5 core.) Blocks have a multiple
// of 16 rows (99-row blocks took 2.13-2.17 ms); the last one takes a remainder under 16 rows in
// with it, so no block has fewer than 16 rows but a C of fewer: a block of a row or two might
// take oneDNN's matrix-vector path. Blocked so, an element's value is the same K-long sum as in
// the float32 GEMM's pieces: oneDNN's sgemm adds its K products in the same order
// (NarrowingGemm.IsTheFloat32GemmRoundedBitForBit checks the bits on shapes with even and uneven
// blocks).
template <typename Store>
void BlockedGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, const Store& store) {
  if (M == 0 || N == 0) return;
  constexpr int64_t kBlockFloats = 128 * 1024;
  const int64_t rows = std::max<int64_t>(16, kBlockFloats / N / 16 * 16);
  // The last block takes a remainder under 16 rows in with it.
  const int64_t blocks = std::max<int64_t>(1, M % rows >= 16 ? M / rows + 1 : M / rows);
  cpu_threads::ParallelFor(blocks, [&](int64_t b) {
    const int64_t begin = b * rows, n = b + 1 == blocks ? M - begin : rows;
    const PieceScratch s(n * N);
    OneDnnSgemm(ta, tb, n, N, K, alpha, ta ? A + begin : A + begin * lda, lda, B, ldb, 0.0f,
                s.data(), N);
    store(s.data(), begin, n);
  });
}

template <typename TC>
void NarrowingGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  KEEL_ENFORCE(beta == 0.0f, "GEMM of ", M, "x", N, "x", K,
               " from float32 operands into a 16-bit C: beta must be 0 (C is not read), got ",
               beta);
  BlockedGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb,
              [&](const float* s, int64_t begin, int64_t n) {
                NarrowRows(s, N, C + begin * ldc, ldc, n, N);
              });
}

}  // namespace

void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, bfloat16* C, int64_t ldc) {
  NarrowingGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float16* C, int64_t ldc) {
  NarrowingGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void GemmAccumulate(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
  BlockedGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb,
              [&](const float* s, int64_t begin, int64_t n) {
                for (int64_t r = 0; r < n; ++r) {
                  float* c = C + (begin + r) * ldc;
                  const float* p = s + r * N;
                  for (int64_t j = 0; j < N; ++j) c[j] += p[j];
                }
              });
}

void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  EigenGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

const char* Backend() { return "onednn"; }

}  // namespace blas
}  // namespace keel
