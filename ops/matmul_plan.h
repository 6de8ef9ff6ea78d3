// The GEMMs of a matmul op, shared by its CPU (math_ops.cc) and CUDA (math_ops.cu) kernels.
#pragma once

#include <cstdint>

#include "framework/runtime/ddim.h"

namespace keel {

// The GEMMs of one matmul: `batch` products op(X_b) [M x K] * op(Y_b) [K x N], where X_b starts
// x_stride elements into X (0: X is 2-D and broadcast over the batch), likewise Y_b.
struct MatMulPlan {
  int64_t batch = 1, M = 0, K = 0, N = 0;
  int64_t x_stride = 0, y_stride = 0;
};

// Assumes the shapes were validated by MatMulShape.
inline MatMulPlan PlanMatMul(const DDim& x, const DDim& y, bool tx, bool ty) {
  const int xr = x.size(), yr = y.size();
  const int64_t x_rows = x[xr - 2], x_cols = x[xr - 1];
  const int64_t y_rows = y[yr - 2], y_cols = y[yr - 1];
  MatMulPlan p;
  p.M = tx ? x_cols : x_rows;
  p.K = tx ? x_rows : x_cols;
  p.N = ty ? y_rows : y_cols;
  const int64_t x_batch = x.prod(0, xr - 2), y_batch = y.prod(0, yr - 2);
  if (yr == 2 && !tx) {
    // Batched X times a shared Y is one GEMM over X's rows stacked: [batch * M, K] * [K, N].
    p.M *= x_batch;
    return p;
  }
  p.batch = xr > 2 ? x_batch : y_batch;  // equal when both are batched
  p.x_stride = xr > 2 ? x_rows * x_cols : 0;
  p.y_stride = yr > 2 ? y_rows * y_cols : 0;
  return p;
}

}  // namespace keel
