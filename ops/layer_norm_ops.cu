// layer_norm on CUDA: the kernels are layer_norm_ops.h's; here is the math, one block per row and
// the parameter gradients one thread per column, summing the rows in order (deterministic).
#include "ops/cuda_util.cuh"
#include "ops/layer_norm_ops.h"

namespace keel {
namespace {

// One block per row of R elements: mean, biased variance (two passes), then
// Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias.
template <typename T>
__global__ void LayerNormRows(const T* x, const T* scale, const T* bias, T* y, T* mean, T* var,
                              int64_t R, T eps) {
  const int64_t i = blockIdx.x;
  const T* xr = x + i * R;
  T s = 0;
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) s += xr[j];
  const T mu = BlockSum(s) / static_cast<T>(R);
  T q = 0;
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) q += (xr[j] - mu) * (xr[j] - mu);
  const T v = BlockSum(q) / static_cast<T>(R);
  if (threadIdx.x == 0) {
    mean[i] = mu;
    var[i] = v;
  }
  const T inv_std = T(1) / fn::Sqrt(v + eps);
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) {
    T o = (xr[j] - mu) * inv_std;
    if (scale) o *= scale[j];
    if (bias) o += bias[j];
    y[i * R + j] = o;
  }
}

// One block per row, with xhat = (x - mean) * inv_std and g = dy * Scale:
//   dx = inv_std * (g - mean(g) - xhat * mean(g * xhat))
template <typename T>
__global__ void LayerNormGradRows(const T* x, const T* dy, const T* scale, const T* mean,
                                  const T* var, T* dx, int64_t R, T eps) {
  const int64_t i = blockIdx.x;
  const T* xr = x + i * R;
  const T* gr = dy + i * R;
  const T mu = mean[i];
  const T inv_std = T(1) / fn::Sqrt(var[i] + eps);
  T sg = 0, sgx = 0;
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) {
    const T g = scale ? gr[j] * scale[j] : gr[j];
    sg += g;
    sgx += g * (xr[j] - mu) * inv_std;
  }
  const T mean_g = BlockSum(sg) / static_cast<T>(R);
  const T mean_gx = BlockSum(sgx) / static_cast<T>(R);
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) {
    const T g = scale ? gr[j] * scale[j] : gr[j];
    const T xhat = (xr[j] - mu) * inv_std;
    dx[i * R + j] = inv_std * (g - mean_g - xhat * mean_gx);
  }
}

// dScale[j] = sum over rows of dy * xhat, dBias[j] = sum over rows of dy: one thread per column,
// rows summed in order (deterministic).
template <typename T>
__global__ void LayerNormParamGrads(const T* x, const T* dy, const T* mean, const T* var, T* dscale,
                                    T* dbias, int64_t rows, int64_t R, T eps) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < R;
       j += int64_t(blockDim.x) * gridDim.x) {
    T ds = 0, db = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const T g = dy[i * R + j];
      ds += g * (x[i * R + j] - mean[i]) * (T(1) / fn::Sqrt(var[i] + eps));
      db += g;
    }
    if (dscale) dscale[j] = ds;
    if (dbias) dbias[j] = db;
  }
}

inline int RowThreads(int64_t n) { return n >= 256 ? 256 : n > 64 ? 128 : 32; }

}  // namespace

template <typename T>
class LayerNormMath<CUDADevice, T> {
 public:
  void Forward(const ExecutionContext& ctx, const LayerNormIO<T>& io) {
    if (io.rows == 0 || io.R == 0) return;
    KEEL_ENFORCE(io.rows < (int64_t(1) << 31), "layer_norm: ", io.rows, " rows exceed the grid");
    LayerNormRows<T><<<io.rows, RowThreads(io.R), 0, Cuda(ctx).stream()>>>(
        io.x, io.scale, io.bias, io.y, io.mean, io.var, io.R, io.epsilon);
    KEEL_CUDA_LAUNCH_CHECK();
  }

  void Backward(const ExecutionContext& ctx, const LayerNormGradIO<T>& io) {
    if (io.R == 0) return;
    if (io.dscale || io.dbias) {
      LayerNormParamGrads<T><<<GridFor(io.R), 256, 0, Cuda(ctx).stream()>>>(
          io.x, io.dy, io.mean, io.var, io.dscale, io.dbias, io.rows, io.R, io.epsilon);
      KEEL_CUDA_LAUNCH_CHECK();
    }
    if (io.dx && io.rows > 0) {
      LayerNormGradRows<T><<<io.rows, RowThreads(io.R), 0, Cuda(ctx).stream()>>>(
          io.x, io.dy, io.scale, io.mean, io.var, io.dx, io.R, io.epsilon);
      KEEL_CUDA_LAUNCH_CHECK();
    }
  }
};

KEEL_REGISTER_KERNEL(CUDA, layer_norm, LayerNormKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, layer_norm_grad, LayerNormGradKernel, float, double);

}  // namespace keel
