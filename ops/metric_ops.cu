// The evaluation ops on CUDA: the kernels are metric_ops.h's; here are top_k's and accuracy's
// launches. One thread per row: k and the class count are small next to the batch.
#include <vector>

#include "ops/cuda_util.cuh"
#include "ops/metric_ops.h"

namespace keel {
namespace {

// Per row of n: the k best elements in rank order, by k selection passes; pass j takes the best
// element ranking after pass j - 1's pick (the order is total, so no element is taken twice).
template <typename T>
__global__ void TopKRows(const T* x, T* values, int64_t* indices, int64_t rows, int64_t n, int k) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows;
       r += int64_t(blockDim.x) * gridDim.x) {
    const T* row = x + r * n;
    T prev = T(0);
    int64_t prev_i = -1;
    for (int j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t i = 0; i < n; ++i) {
        if (prev_i >= 0 && !fn::RanksBefore(prev, prev_i, row[i], i)) continue;
        if (best < 0 || fn::RanksBefore(row[i], i, row[best], best)) best = i;
      }
      values[r * k + j] = row[best];
      indices[r * k + j] = best;
      prev = row[best];
      prev_i = best;
    }
  }
}

// One block: Correct = rows whose Label is among that row's Indices, Total = rows,
// Accuracy = Correct / Total (0 for no rows).
__global__ void AccuracyBlock(const int64_t* idx, const int64_t* label, int64_t rows, int64_t k,
                              float* accuracy, int32_t* correct, int32_t* total) {
  long long c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    bool hit = false;
    for (int64_t j = 0; j < k && !hit; ++j) hit = idx[r * k + j] == label[r];
    c += hit;
  }
  c = BlockSum(c);
  if (threadIdx.x != 0) return;
  *accuracy = rows == 0 ? 0.0f : static_cast<float>(c) / static_cast<float>(rows);
  *correct = static_cast<int32_t>(c);
  *total = static_cast<int32_t>(rows);
}

}  // namespace

template <typename T>
struct TopKMath<CUDADevice, T> {
  static void Run(const ExecutionContext& ctx, const T* x, int64_t rows, int64_t n, int k, T* vp,
                  int64_t* ip, std::vector<int64_t>*) {
    TopKRows<T><<<GridFor(rows, 128), 128, 0, Cuda(ctx).stream()>>>(x, vp, ip, rows, n, k);
    KEEL_CUDA_LAUNCH_CHECK();
  }
};

template <>
struct AccuracyMath<CUDADevice> {
  static void Run(const ExecutionContext& ctx, const int64_t* idx, const int64_t* label,
                  int64_t rows, int64_t k, float* accuracy, int32_t* correct, int32_t* total) {
    AccuracyBlock<<<1, 256, 0, Cuda(ctx).stream()>>>(idx, label, rows, k, accuracy, correct, total);
    KEEL_CUDA_LAUNCH_CHECK();
  }
};

KEEL_REGISTER_KERNEL(CUDA, top_k, TopKKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_KERNEL(CUDA, arg_max, ArgMaxKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_KERNEL(CUDA, accuracy, AccuracyKernel, float, double, int32_t, int64_t);

}  // namespace keel
