#include "framework/runtime/blas.h"

#include <Eigen/Core>

#ifdef KEEL_WITH_CBLAS
#include <cblas.h>
#endif

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
  if (beta == T(0)) c.setZero();
  else if (beta != T(1)) c *= beta;
  if (!ta && !tb) c.noalias() += alpha * a * b;
  else if (ta && !tb) c.noalias() += alpha * a.transpose() * b;
  else if (!ta && tb) c.noalias() += alpha * a * b.transpose();
  else c.noalias() += alpha * a.transpose() * b.transpose();
}

}  // namespace

void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
#ifdef KEEL_WITH_CBLAS
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
  EigenGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
#ifdef KEEL_WITH_CBLAS
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
  EigenGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

#ifdef KEEL_WITH_CBLAS
extern "C" void openblas_set_num_threads(int);
void SetNumThreads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }
const char* Backend() { return "openblas"; }
#else
void SetNumThreads(int) {}
const char* Backend() { return "eigen"; }
#endif

}  // namespace blas
}  // namespace keel
