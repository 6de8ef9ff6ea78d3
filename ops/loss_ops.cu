// The losses on CUDA: the kernels are loss_ops.h's; here is their math. A hard label outside
// [0, D) that is not ignore_index gives that row a NaN loss (and a NaN gradient row) and is
// reported, with its value and row, for the op's next run to throw (DeviceReportSlot).
#include "ops/cuda_util.cuh"
#include "ops/functors/elementwise_functors.h"
#include "ops/functors/hd.h"
#include "ops/loss_ops.h"

namespace keel {
namespace {

// log(x) clamped below at -1e20 (Paddle's TolerableValue), as the CPU kernel.
template <typename T>
__device__ T TolerableLog(T x) {
  const T l = fn::Log(x);
  return l > T(-1e20) ? l : T(-1e20);
}

template <typename T>
__device__ T NaNOf() {
  return T(NAN);
}

// hard: y[i] = -log(x[i, label[i]]) (0 for ignored rows);  soft: y[i] = -sum_j l[i, j] log x[i, j].
template <typename T>
__global__ void CrossEntropyRows(const T* x, const int64_t* hard, const T* soft, T* y, int64_t n,
                                 int64_t d, int ignore_index, DeviceReport* report) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(blockDim.x) * gridDim.x) {
    if (soft != nullptr) {
      T s = 0;
      for (int64_t j = 0; j < d; ++j) s += soft[i * d + j] * TolerableLog(x[i * d + j]);
      y[i] = -s;
      continue;
    }
    const int64_t l = hard[i];
    if (l == ignore_index) {
      y[i] = T(0);
    } else if (l < 0 || l >= d) {
      Report(report, l, i);
      y[i] = NaNOf<T>();
    } else {
      y[i] = -TolerableLog(x[i * d + l]);
    }
  }
}

// One block per softmax row r = (i, k) of Logits viewed as [pre, n, post]; the row's elements sit
// at base + j * post. With m = max(x), lse = log(sum(exp(x - m))):
//   softmax = exp(x - m) / sum;  hard: loss = lse - (x[label] - m);
//   soft: loss = lse * sum(label) - sum(label * (x - m)), 0 * -inf counted as 0.
template <typename T>
__global__ void SoftmaxCrossEntropyRows(const T* x, const int64_t* hard, const T* soft, T* sm,
                                        T* loss, int64_t n, int64_t post, int ignore_index,
                                        DeviceReport* report) {
  const int64_t r = blockIdx.x;
  const int64_t base = (r / post) * n * post + r % post;
  T mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = max(mx, x[base + j * post]);
  mx = BlockMax(mx);
  T sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += fn::Exp(x[base + j * post] - mx);
  sum = BlockSum(sum);
  const T inv = T(1) / sum;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    sm[base + j * post] = fn::Exp(x[base + j * post] - mx) * inv;
  const T lse = fn::Log(sum);
  if (soft != nullptr) {
    T lsum = 0, dot = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T l = soft[base + j * post];
      lsum += l;
      dot += fn::WeightTimes(l, x[base + j * post] - mx);
    }
    lsum = BlockSum(lsum);
    dot = BlockSum(dot);
    if (threadIdx.x == 0) loss[r] = lse * lsum - dot;
    return;
  }
  if (threadIdx.x != 0) return;
  const int64_t l = hard[r];
  if (l == ignore_index) {
    loss[r] = T(0);
  } else if (l < 0 || l >= n) {
    Report(report, l, r);
    loss[r] = NaNOf<T>();
  } else {
    loss[r] = lse - (x[base + l * post] - mx);
  }
}

inline int RowThreads(int64_t n) { return n >= 256 ? 256 : n > 64 ? 128 : 32; }

}  // namespace

template <typename T>
struct LossMath<CUDADevice, T> {
  static void CrossEntropy(const ExecutionContext& ctx, const T* x, const Labels<T>& l, int64_t n,
                           int64_t d, T* y, DeviceReport* report) {
    if (n == 0) return;
    CrossEntropyRows<T><<<GridFor(n), 256, 0, Cuda(ctx).stream()>>>(
        x, l.soft ? nullptr : l.index, l.soft ? l.dist : nullptr, y, n, d, l.ignore_index, report);
    KEEL_CUDA_LAUNCH_CHECK();
  }

  static void CrossEntropyGrad(const ExecutionContext& ctx, const T* xp, const Labels<T>& l,
                               const T* dyp, int64_t n, int64_t d, T* dxp, DeviceReport* report) {
    if (l.soft) {
      const T* lp = l.dist;
      ForEach(ctx, n * d, [=] __device__(int64_t k) { dxp[k] = -dyp[k / d] * lp[k] / xp[k]; });
      return;
    }
    const int64_t* lp = l.index;
    const int ignore = l.ignore_index;
    ForEach(ctx, n * d, [=] __device__(int64_t k) {
      const int64_t i = k / d, j = k % d, label = lp[i];
      if (label == ignore) {
        dxp[k] = T(0);
      } else if (label < 0 || label >= d) {
        if (j == 0) Report(report, label, i);
        dxp[k] = NaNOf<T>();
      } else {
        dxp[k] = j == label ? -dyp[i] / xp[k] : T(0);
      }
    });
  }

  static void SoftmaxCrossEntropy(const ExecutionContext& ctx, const AxisSplit& s, const T* x,
                                  const Labels<T>& l, T* sm, T* loss, DeviceReport* report) {
    const int64_t rows = s.pre * s.post;
    if (rows == 0 || s.n == 0) return;
    KEEL_ENFORCE(rows < (int64_t(1) << 31), "softmax_with_cross_entropy: ", rows,
                 " rows exceed the grid");
    SoftmaxCrossEntropyRows<T><<<rows, RowThreads(s.n), 0, Cuda(ctx).stream()>>>(
        x, l.soft ? nullptr : l.index, l.soft ? l.dist : nullptr, sm, loss, s.n, s.post,
        l.ignore_index, report);
    KEEL_CUDA_LAUNCH_CHECK();
  }

  static void SoftmaxCrossEntropyGrad(const ExecutionContext& ctx, const AxisSplit& s, const T* smp,
                                      const Labels<T>& l, const T* dlp, T* dxp,
                                      DeviceReport* report) {
    const int64_t n = s.n, post = s.post, numel = s.pre * s.n * s.post;
    if (l.soft) {
      const T* lp = l.dist;
      ForEach(ctx, numel, [=] __device__(int64_t k) {
        const int64_t row = (k / (n * post)) * post + k % post;
        dxp[k] = (smp[k] - lp[k]) * dlp[row];
      });
      return;
    }
    const int64_t* lp = l.index;
    const int ignore = l.ignore_index;
    ForEach(ctx, numel, [=] __device__(int64_t k) {
      const int64_t row = (k / (n * post)) * post + k % post, j = (k / post) % n;
      const int64_t label = lp[row];
      if (label == ignore) {
        dxp[k] = T(0);
      } else if (label < 0 || label >= n) {
        if (j == 0) Report(report, label, row);
        dxp[k] = NaNOf<T>();
      } else {
        const T dl = dlp[row];
        dxp[k] = j == label ? smp[k] * dl - dl : smp[k] * dl;
      }
    });
  }
};

KEEL_REGISTER_KERNEL(CUDA, cross_entropy, CrossEntropyKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, cross_entropy_grad, CrossEntropyGradKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, softmax_with_cross_entropy, SoftmaxWithCrossEntropyKernel, float,
                     double);
KEEL_REGISTER_KERNEL(CUDA, softmax_with_cross_entropy_grad, SoftmaxWithCrossEntropyGradKernel,
                     float, double);

}  // namespace keel
