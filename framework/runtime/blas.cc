#include "framework/runtime/blas.h"

#include <oneapi/dnnl/dnnl.h>

#include <Eigen/Core>
#include <algorithm>

#include "framework/error.h"
#include "framework/runtime/cpu_threads.h"

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
  // About 32 MFLOP (~0.15 ms on one core) per piece, at most 8, each >= 64 rows or columns.
  const double flops =
      2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  int64_t pieces = static_cast<int64_t>(flops / 32e6);
  pieces = std::min<int64_t>(pieces, std::max(M, N) / 64);
  return std::clamp<int64_t>(pieces, 1, 8);
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
  const int64_t step = (len / pieces + 15) / 16 * 16;
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

void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  EigenGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

const char* Backend() { return "onednn"; }

}  // namespace blas
}  // namespace keel
