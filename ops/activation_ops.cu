// The activations on CUDA: the kernels are activation_ops.h's, element-wise ones launching the
// shared functors. Here is softmax's and log_softmax's math: one block per row.
#include "ops/activation_ops.h"
#include "ops/cuda_util.cuh"

namespace keel {
namespace {

// Rows of n elements with stride `post` (X viewed as [pre, n, post]); row r = (i, k) starts at
// i * n * post + k. One block per row; threads stride over the row.
//   softmax:      out = exp(x - max) / sum(exp(x - max))
//   log_softmax:  out = x - max - log(sum(exp(x - max)))
template <typename T, bool kLog>
__global__ void SoftmaxRows(const T* x, T* out, int64_t n, int64_t post) {
  const int64_t r = blockIdx.x;
  const int64_t base = (r / post) * n * post + r % post;
  T mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = max(mx, x[base + j * post]);
  mx = BlockMax(mx);
  T sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += fn::Exp(x[base + j * post] - mx);
  sum = BlockSum(sum);
  if (kLog) {
    const T lse = fn::Log(sum);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      out[base + j * post] = x[base + j * post] - mx - lse;
  } else {
    const T inv = T(1) / sum;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      out[base + j * post] = fn::Exp(x[base + j * post] - mx) * inv;
  }
}

//   softmax:      dx = out * (dout - sum(dout * out))
//   log_softmax:  dx = dout - exp(out) * sum(dout)
template <typename T, bool kLog>
__global__ void SoftmaxGradRows(const T* out, const T* dout, T* dx, int64_t n, int64_t post) {
  const int64_t r = blockIdx.x;
  const int64_t base = (r / post) * n * post + r % post;
  T s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t k = base + j * post;
    s += kLog ? dout[k] : dout[k] * out[k];
  }
  s = BlockSum(s);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t k = base + j * post;
    dx[k] = kLog ? dout[k] - fn::Exp(out[k]) * s : out[k] * (dout[k] - s);
  }
}

inline int RowThreads(int64_t n) { return n >= 256 ? 256 : n > 64 ? 128 : 32; }

}  // namespace

template <typename T, bool kLog>
struct SoftmaxMath<CUDADevice, T, kLog> {
  static void Forward(const ExecutionContext& ctx, const AxisSplit& s, const T* x, T* out) {
    const int64_t rows = s.pre * s.post;
    if (rows == 0 || s.n == 0) return;
    KEEL_ENFORCE(rows < (int64_t(1) << 31), ctx.op().type(), ": ", rows, " rows exceed the grid");
    SoftmaxRows<T, kLog><<<rows, RowThreads(s.n), 0, Cuda(ctx).stream()>>>(x, out, s.n, s.post);
    KEEL_CUDA_LAUNCH_CHECK();
  }

  static void Grad(const ExecutionContext& ctx, const AxisSplit& s, const T* out, const T* dout,
                   T* dx) {
    const int64_t rows = s.pre * s.post;
    if (rows == 0 || s.n == 0) return;
    KEEL_ENFORCE(rows < (int64_t(1) << 31), ctx.op().type(), ": ", rows, " rows exceed one launch");
    SoftmaxGradRows<T, kLog>
        <<<rows, RowThreads(s.n), 0, Cuda(ctx).stream()>>>(out, dout, dx, s.n, s.post);
    KEEL_CUDA_LAUNCH_CHECK();
  }
};

KEEL_REGISTER_KERNEL(CUDA, relu, ReluKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, relu_grad, ReluGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, tanh, TanhKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, tanh_grad, TanhGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, sigmoid, SigmoidKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, sigmoid_grad, SigmoidGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, gelu, GeluKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, gelu_grad, GeluGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, leaky_relu, LeakyReluKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, leaky_relu_grad, LeakyReluGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, clip, ClipKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, clip_grad, ClipGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, softmax, SoftmaxFwdKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, softmax_grad, SoftmaxBwdKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, log_softmax, LogSoftmaxFwdKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, log_softmax_grad, LogSoftmaxBwdKernel, float, double);

}  // namespace keel
