// The kernels of the evaluation ops (metric_ops.cc has the ops and their shapes): top_k, arg_max
// and accuracy, once for every device (ops/device.h), with one ranking rule (fn::RanksBefore:
// larger first, NaN largest, ties to the lower index), so every place picks the same indices.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/axis_layout.h"
#include "ops/device.h"
#include "ops/functors/metric_functors.h"

namespace keel {

// The device math:
//   TopKMath<D, T>::Run(ctx, x, rows, n, k, values, indices, scratch)   per row of n: the k best,
//       in rank order (scratch: the CPU's index buffer, kept across runs)
//   AccuracyMath<D>::Run(ctx, idx, label, rows, k, accuracy, correct, total)
template <typename D, typename T>
struct TopKMath;
template <typename D>
struct AccuracyMath;

// Per row of the last axis: the k largest values, largest first, and their indices.
template <typename D, typename T>
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
    TopKMath<D, T>::Run(ctx, x.data<T>(), rows, n, k_, vp, ip, &idx_);
  }

 private:
  int k_;
  std::vector<int64_t> idx_;
};

// Out = the index of the largest element along axis (the first of equal ones).
template <typename D, typename T>
class ArgMaxKernel : public OpKernel {
 public:
  explicit ArgMaxKernel(const OpDesc& op) : axis_(static_cast<int>(op.Attr<int64_t>("axis"))) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const AxisSplit s = SplitAt(x.dims(), axis_);
    const T* xp = x.data<T>();
    int64_t* op = ctx.Output("Out")->mutable_data<int64_t>(ctx.place());
    const int64_t n = s.n, post = s.post;
    Device<D>::ForEach(ctx, s.pre * s.post, [=] KEEL_HD_LAMBDA(int64_t o) {
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

// Correct = rows whose Label is among that row's Indices; Total = N; Accuracy = Correct / Total
// (0 for N = 0). T is Out's dtype, which only picks the kernel.
template <typename D, typename T>
class AccuracyKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& idx = ctx.Input("Indices");
    const Tensor& label = ctx.Input("Label");
    const int64_t rows = idx.dims()[0], k = idx.dims()[1];
    KEEL_ENFORCE(label.numel() == rows, "Label ", label.dims().str(),
                 " must have one row per row of Indices ", idx.dims().str());
    AccuracyMath<D>::Run(ctx, idx.data<int64_t>(), label.data<int64_t>(), rows, k,
                         ctx.Output("Accuracy")->mutable_data<float>(ctx.place()),
                         ctx.Output("Correct")->mutable_data<int32_t>(ctx.place()),
                         ctx.Output("Total")->mutable_data<int32_t>(ctx.place()));
  }
};

}  // namespace keel
