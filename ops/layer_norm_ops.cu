// layer_norm on CUDA: the kernels are layer_norm_ops.h's; here is the math, one block per row and
// the parameter gradients a block per 32 columns, summing the rows in a fixed order
// (deterministic).
#include "ops/cuda_util.cuh"
#include "ops/layer_norm_ops.h"

namespace keel {
namespace {

// One block per row of R elements: mean, biased variance (two passes), then
// Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias. X, Y of T; the rest of P = Acc<T>, in which
// the math runs.
template <typename T, typename P>
__global__ void LayerNormRows(const T* x, const P* scale, const P* bias, T* y, P* mean, P* var,
                              int64_t R, P eps) {
  const int64_t i = blockIdx.x;
  const T* xr = x + i * R;
  P s = 0;
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) s += Widen(xr[j]);
  const P mu = BlockSum(s) / static_cast<P>(R);
  P q = 0;
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) {
    const P d = Widen(xr[j]) - mu;
    q += d * d;
  }
  const P v = BlockSum(q) / static_cast<P>(R);
  if (threadIdx.x == 0) {
    mean[i] = mu;
    var[i] = v;
  }
  const P inv_std = P(1) / fn::Sqrt(v + eps);
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) {
    P o = (Widen(xr[j]) - mu) * inv_std;
    if (scale) o *= scale[j];
    if (bias) o += bias[j];
    y[i * R + j] = Narrow<T>(o);
  }
}

// One block per row, with xhat = (x - mean) * inv_std and g = dy * Scale:
//   dx = inv_std * (g - mean(g) - xhat * mean(g * xhat))
template <typename T, typename P>
__global__ void LayerNormGradRows(const T* x, const T* dy, const P* scale, const P* mean,
                                  const P* var, T* dx, int64_t R, P eps) {
  const int64_t i = blockIdx.x;
  const T* xr = x + i * R;
  const T* gr = dy + i * R;
  const P mu = mean[i];
  const P inv_std = P(1) / fn::Sqrt(var[i] + eps);
  P sg = 0, sgx = 0;
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) {
    const P g = scale ? Widen(gr[j]) * scale[j] : Widen(gr[j]);
    sg += g;
    sgx += g * (Widen(xr[j]) - mu) * inv_std;
  }
  const P mean_g = BlockSum(sg) / static_cast<P>(R);
  const P mean_gx = BlockSum(sgx) / static_cast<P>(R);
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) {
    const P g = scale ? Widen(gr[j]) * scale[j] : Widen(gr[j]);
    const P xhat = (Widen(xr[j]) - mu) * inv_std;
    dx[i * R + j] = Narrow<T>(inv_std * (g - mean_g - xhat * mean_gx));
  }
}

// dScale[j] = sum over rows of dy * xhat, dBias[j] = sum over rows of dy. A block of
// kParamCols x kParamGroups threads per kParamCols columns: thread (c, g) sums rows g, g +
// kParamGroups, ... of its column in order, then thread (c, 0) adds the groups' sums in order
// (deterministic). (One thread per column summing every row took 141 us for the transformer's
// 512 rows of 32 on an H200: 32 threads for the whole GPU.)
constexpr int kParamCols = 32, kParamGroups = 16;

template <typename T, typename P>
__global__ void LayerNormParamGrads(const T* x, const T* dy, const P* mean, const P* var, P* dscale,
                                    P* dbias, int64_t rows, int64_t R, P eps) {
  __shared__ P s_ds[kParamGroups][kParamCols + 1], s_db[kParamGroups][kParamCols + 1];
  const int c = threadIdx.x, g = threadIdx.y;
  const int64_t j = blockIdx.x * int64_t(kParamCols) + c;
  P ds = 0, db = 0;
  if (j < R) {
    for (int64_t i = g; i < rows; i += kParamGroups) {
      const P d = Widen(dy[i * R + j]);
      ds += d * (Widen(x[i * R + j]) - mean[i]) * (P(1) / fn::Sqrt(var[i] + eps));
      db += d;
    }
  }
  s_ds[g][c] = ds;
  s_db[g][c] = db;
  __syncthreads();
  if (g != 0 || j >= R) return;
  for (int k = 1; k < kParamGroups; ++k) {
    ds += s_ds[k][c];
    db += s_db[k][c];
  }
  if (dscale) dscale[j] = ds;
  if (dbias) dbias[j] = db;
}

inline int RowThreads(int64_t n) { return n >= 256 ? 256 : n > 64 ? 128 : 32; }

}  // namespace

template <typename T>
class LayerNormMath<CUDADevice, T> {
 public:
  void Forward(const ExecutionContext& ctx, const LayerNormIO<T>& io) {
    if (io.rows == 0 || io.R == 0) return;
    KEEL_ENFORCE(io.rows < (int64_t(1) << 31), "layer_norm: ", io.rows, " rows exceed the grid");
    LayerNormRows<T, Acc<T>><<<io.rows, RowThreads(io.R), 0, Cuda(ctx).stream()>>>(
        io.x, io.scale, io.bias, io.y, io.mean, io.var, io.R, io.epsilon);
    KEEL_CUDA_LAUNCH_CHECK();
  }

  void Backward(const ExecutionContext& ctx, const LayerNormGradIO<T>& io) {
    if (io.R == 0) return;
    if (io.dscale || io.dbias) {
      const int64_t blocks = (io.R + kParamCols - 1) / kParamCols;
      KEEL_ENFORCE(blocks < (int64_t(1) << 31), "layer_norm_grad: ", io.R,
                   " columns exceed the grid");
      LayerNormParamGrads<T, Acc<T>>
          <<<blocks, dim3(kParamCols, kParamGroups), 0, Cuda(ctx).stream()>>>(
              io.x, io.dy, io.mean, io.var, io.dscale, io.dbias, io.rows, io.R, io.epsilon);
      KEEL_CUDA_LAUNCH_CHECK();
    }
    if (io.dx && io.rows > 0) {
      LayerNormGradRows<T, Acc<T>><<<io.rows, RowThreads(io.R), 0, Cuda(ctx).stream()>>>(
          io.x, io.dy, io.scale, io.mean, io.var, io.dx, io.R, io.epsilon);
      KEEL_CUDA_LAUNCH_CHECK();
    }
  }
};

KEEL_REGISTER_KERNEL(CUDA, layer_norm, LayerNormKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, layer_norm_grad, LayerNormGradKernel, float, double, bfloat16, float16);

}  // namespace keel
