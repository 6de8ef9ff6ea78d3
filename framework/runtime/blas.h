// Row-major GEMM on CPU: C = alpha * op(A) * op(B) + beta * C, with op = transpose when asked.
// A is M x K after op, B is K x N after op, C is M x N; lda/ldb/ldc are row strides.
// float goes to oneDNN's sgemm (one OpenMP thread per call), split into pieces that depend on the
// shape only and run on the CPU thread budget (cpu_threads.h): the same bits on any number of
// threads. double goes to Eigen (tests and checks, not the hot path).
#pragma once

#include <cstdint>

namespace keel {
namespace blas {

void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
          int64_t ldc);

// Contiguous convenience form: lda = trans_a ? M : K, ldb = trans_b ? K : N, ldc = N.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          const T* B, T beta, T* C) {
  Gemm(trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
}

// How many pieces a float GEMM of this shape is split into (1: one call).
int64_t GemmPieces(int64_t M, int64_t N, int64_t K);
const char* Backend();  // "onednn"

}  // namespace blas
}  // namespace keel
