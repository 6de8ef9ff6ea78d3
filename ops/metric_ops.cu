// CUDA twins of metric_ops.cc: top_k, arg_max and accuracy, with the CPU kernels' ranking rule
// (fn::RanksBefore: larger first, NaN largest, ties to the lower index), so both places pick the
// same indices. One thread per row: k and the class count are small next to the batch.
#include "ops/cuda_util.cuh"
#include "ops/functors/metric_functors.h"

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

template <typename T>
class TopKKernel : public OpKernel {
 public:
  explicit TopKKernel(const OpDesc& op) : k_(op.Attr<int>("k")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const int64_t n = x.dims()[x.dims().size() - 1];
    KEEL_ENFORCE(k_ <= n, "k ", k_, " exceeds the last dim of X ", x.dims().str());
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    T* vp = ctx.Output("Out")->mutable_data<T>(ctx.place());
    int64_t* ip = ctx.Output("Indices")->mutable_data<int64_t>(ctx.place());
    if (rows == 0 || k_ <= 0) return;
    TopKRows<T>
        <<<GridFor(rows, 128), 128, 0, Cuda(ctx).stream()>>>(x.data<T>(), vp, ip, rows, n, k_);
    KEEL_CUDA_LAUNCH_CHECK();
  }

 private:
  int k_;
};

// Out = the index of the largest element along axis (the first of equal ones).
template <typename T>
class ArgMaxKernel : public OpKernel {
 public:
  explicit ArgMaxKernel(const OpDesc& op) : axis_(static_cast<int>(op.Attr<int64_t>("axis"))) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const AxisSplit s = SplitAt(x.dims(), axis_);
    const T* xp = x.data<T>();
    int64_t* op = ctx.Output("Out")->mutable_data<int64_t>(ctx.place());
    const int64_t n = s.n, post = s.post;
    ForEach(ctx, s.pre * s.post, [=] __device__(int64_t o) {
      const T* base = xp + (o / post) * n * post + o % post;
      int64_t best = 0;
      for (int64_t k = 1; k < n; ++k)
        if (fn::Greater(base[k * post], base[best * post])) best = k;
      op[o] = best;
    });
  }

 private:
  int axis_;
};

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

// T is Out's dtype, which only picks the kernel.
template <typename T>
class AccuracyKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& idx = ctx.Input("Indices");
    const Tensor& label = ctx.Input("Label");
    const int64_t rows = idx.dims()[0], k = idx.dims()[1];
    KEEL_ENFORCE(label.numel() == rows, "Label ", label.dims().str(),
                 " must have one row per row of Indices ", idx.dims().str());
    AccuracyBlock<<<1, 256, 0, Cuda(ctx).stream()>>>(
        idx.data<int64_t>(), label.data<int64_t>(), rows, k,
        ctx.Output("Accuracy")->mutable_data<float>(ctx.place()),
        ctx.Output("Correct")->mutable_data<int32_t>(ctx.place()),
        ctx.Output("Total")->mutable_data<int32_t>(ctx.place()));
    KEEL_CUDA_LAUNCH_CHECK();
  }
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(top_k, TopKKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(arg_max, ArgMaxKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(accuracy, AccuracyKernel, float, double, int32_t, int64_t);

}  // namespace keel
