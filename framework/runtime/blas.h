// Row-major GEMM on CPU: C = alpha * op(A) * op(B) + beta * C, with op = transpose when asked.
// A is M x K after op, B is K x N after op, C is M x N; lda/ldb/ldc are row strides.
// float goes to oneDNN's sgemm (one OpenMP thread per call), split into pieces that depend on the
// shape only and run on the CPU thread budget (cpu_threads.h): the same bits on any number of
// threads. double goes to Eigen (tests and checks, not the hot path). bfloat16 and float16 go to
// oneDNN's matmul primitive (blas_half.cc).
#pragma once

#include <cstdint>
#include <string>

#include "framework/runtime/float16.h"

namespace keel {
namespace blas {

void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
          int64_t ldc);

// 16-bit GEMMs (mixed precision): bfloat16 or float16 A and B, float32 accumulation, C of A's
// type or float32 (a sum of several products kept in float32 until the end), alpha and beta in
// float32. oneDNN's matmul primitive (created once per shape and kept) where oneDNN has an
// implementation of its own for this CPU's instructions; where it would fall back to its
// reference loops (float16 before AVX512-FP16), A and B are widened to float32 for the float32
// GEMM instead, and the result narrowed. Same pieces on the thread budget as the float32 GEMM.
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta, bfloat16* C,
          int64_t ldc);
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta, float* C,
          int64_t ldc);
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float16* A, int64_t lda, const float16* B, int64_t ldb, float beta, float16* C,
          int64_t ldc);
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float16* A, int64_t lda, const float16* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

// Float32 operands with a float16 or bfloat16 C (an output a pass narrowed, OpTraits::
// narrows_outputs): blocks of C's rows, each computed by oneDNN's sgemm into a float32 scratch of
// the thread that stays in its cache and rounded into C from there. C holds the float32 GEMM's
// result rounded once, without a float32 result written to memory and read back. beta must be 0
// (C is not read).
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, bfloat16* C, int64_t ldc);
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float16* C, int64_t ldc);

// C += alpha * op(A) * op(B), float32, the product rounded to float32 before it is added: the bits
// of a GEMM into a temporary and a sum after, without the temporary written to memory and read
// back (blocks of C's rows computed into a per-thread scratch that stays in the cache, as above).
// Gradient merge's buffers, which the gradients' ops add into
// (transpiler/fuse_grad_accumulation_pass.h).
void GemmAccumulate(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                    int64_t ldc);

// Contiguous convenience form: lda = trans_a ? M : K, ldb = trans_b ? K : N, ldc = N. C is of A's
// type, or float32 for 16-bit A and B, or 16-bit for float32 A and B (beta 0).
template <typename T, typename TC>
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, Acc<T> alpha, const T* A,
          const T* B, Acc<T> beta, TC* C) {
  Gemm(trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
}

// `batch` GEMMs (float32, or 16-bit as above) of contiguous matrices (lda = trans_a ? M : K, ldb =
// trans_b ? K : N, ldc = N), the b-th at A + b * sa, B + b * sb (sb may be 0: one B for every A)
// and C + b * sc: small ones in batched primitive calls over runs of the batch cut by the shape
// alone, larger ones each as Gemm does.
void GemmBatched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t sa, const float* B, int64_t sb, float beta, float* C,
                 int64_t sc, int64_t batch);
void GemmBatched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const bfloat16* A, int64_t sa, const bfloat16* B, int64_t sb, float beta,
                 bfloat16* C, int64_t sc, int64_t batch);
void GemmBatched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const bfloat16* A, int64_t sa, const bfloat16* B, int64_t sb, float beta, float* C,
                 int64_t sc, int64_t batch);
void GemmBatched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float16* A, int64_t sa, const float16* B, int64_t sb, float beta, float16* C,
                 int64_t sc, int64_t batch);
void GemmBatched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float16* A, int64_t sa, const float16* B, int64_t sb, float beta, float* C,
                 int64_t sc, int64_t batch);

// Whether the 16-bit GEMM of type `dtype` (kBFloat16 or kFloat16) runs natively in oneDNN on this
// CPU (false: widened to float32), for logs and tests.
bool HalfGemmIsNative(DType dtype);

// The oneDNN implementation a 16-bit GEMM (C of the operands' type) of this shape and layout runs
// in, piece by piece ("brg:avx512_core_bf16", ...), or "widened"; for tests and logs.
std::string HalfGemmImplementation(DType dtype, bool trans_a, bool trans_b, int64_t M, int64_t N,
                                   int64_t K, int64_t lda, int64_t ldb, int64_t ldc);

// How many pieces a float GEMM of this shape is split into (1: one call): 1, 2, 4 or 8, from the
// shape alone, so the bits do not depend on the thread count.
int64_t GemmPieces(int64_t M, int64_t N, int64_t K);
// The length of each piece but the last when a side of `len` is cut into `pieces`: len / pieces
// rounded up, then up to a multiple of 16, so the cut makes `pieces` pieces at most (fewer only
// when the rounding to 16 leaves none for the last).
int64_t GemmPieceLength(int64_t len, int64_t pieces);
const char* Backend();  // "onednn"

}  // namespace blas
}  // namespace keel
