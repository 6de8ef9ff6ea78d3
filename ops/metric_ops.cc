// Evaluation ops (PaddlePaddle Fluid 1.x slots and attrs), without gradients: top_k, arg_max,
// accuracy.
//
// Ties go to the lower index (top_k, arg_max); NaN counts as larger than any number, so a NaN
// logit shows up in the top-k rather than hiding.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/functors/metric_functors.h"
#include "ops/op_util.h"

namespace keel {
namespace {

using fn::Greater;  // ops/functors/metric_functors.h, shared with the CUDA kernels

// ---------------------------------------------------------------- top_k

void TopKShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X");
  const int k = ctx.Attr<int>("k");
  KEEL_SHAPE_CHECK(x.size() >= 1, "needs rank >= 1, got X ", x.str());
  const int64_t n = x[x.size() - 1];
  KEEL_SHAPE_CHECK(k >= 1 && (n < 0 || k <= n), "k ", k, " is outside [1, ", n, "] for X ", x.str(),
                   " (k counts along the last axis)");
  DDim out = x;
  out[x.size() - 1] = k;
  ctx.SetOutputDim("Out", out);
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
  ctx.SetOutputDim("Indices", out);
  ctx.SetOutputDType("Indices", DType::kInt64);
}

// Per row of the last axis: the k largest values, largest first, and their indices.
template <typename T>
class TopKKernel : public OpKernel {
 public:
  explicit TopKKernel(const OpDesc& op) : k_(op.Attr<int>("k")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const int64_t n = x.dims()[x.dims().size() - 1];
    KEEL_ENFORCE(k_ <= n, "k ", k_, " exceeds the last dim of X ", x.dims().str());
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    const T* xp = x.data<T>();
    T* vp = ctx.Output("Out")->mutable_data<T>(ctx.place());
    int64_t* ip = ctx.Output("Indices")->mutable_data<int64_t>(ctx.place());
    idx_.resize(n);
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = xp + r * n;
      std::iota(idx_.begin(), idx_.end(), int64_t{0});
      std::partial_sort(idx_.begin(), idx_.begin() + k_, idx_.end(), [row](int64_t a, int64_t b) {
        return fn::RanksBefore(row[a], a, row[b], b);
      });
      for (int j = 0; j < k_; ++j) {
        vp[r * k_ + j] = row[idx_[j]];
        ip[r * k_ + j] = idx_[j];
      }
    }
  }

 private:
  int k_;
  std::vector<int64_t> idx_;  // reused across runs
};

// ---------------------------------------------------------------- arg_max

void ArgMaxShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X");
  const int64_t axis = ctx.Attr<int64_t>("axis");
  KEEL_SHAPE_CHECK(x.size() >= 1, "needs rank >= 1, got X ", x.str());
  CheckAxisInRange("axis", static_cast<int>(axis), "X", x);
  const int a = CanonicalAxis(static_cast<int>(axis), x.size());
  KEEL_SHAPE_CHECK(x[a] != 0, "X ", x.str(), " is empty along axis ", axis);
  DDim out;
  for (int d = 0; d < x.size(); ++d) {
    if (d != a) {
      out.push_back(x[d]);
    } else if (ctx.Attr<bool>("keepdims")) {
      out.push_back(1);
    }
  }
  if (out.empty()) out.push_back(1);
  ctx.SetOutputDim("Out", out);
  ctx.SetOutputDType("Out", DType::kInt64);
}

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
    for (int64_t i = 0; i < s.pre; ++i)
      for (int64_t j = 0; j < s.post; ++j) {
        const T* base = xp + i * s.n * s.post + j;
        int64_t best = 0;
        for (int64_t k = 1; k < s.n; ++k)
          if (Greater(base[k * s.post], base[best * s.post])) best = k;
        op[i * s.post + j] = best;
      }
  }

 private:
  int axis_;
};

// ---------------------------------------------------------------- accuracy

void AccuracyShape(InferShapeContext& ctx) {
  const DDim out = ctx.GetInputDim("Out");
  const DDim idx = ctx.GetInputDim("Indices");
  const DDim label = ctx.GetInputDim("Label");
  KEEL_SHAPE_CHECK(ctx.GetInputDType("Indices") == DType::kInt64, "Indices must be int64, got ",
                   DTypeName(ctx.GetInputDType("Indices")));
  KEEL_SHAPE_CHECK(ctx.GetInputDType("Label") == DType::kInt64, "Label must be int64, got ",
                   DTypeName(ctx.GetInputDType("Label")));
  KEEL_SHAPE_CHECK(idx.size() == 2, "Indices must be [N, k], got Indices ", idx.str());
  KEEL_SHAPE_CHECK(ctx.DimsEq(out, idx), "Out ", out.str(), " and Indices ", idx.str(),
                   " must have one shape");
  KEEL_SHAPE_CHECK(label.size() == 2 && ctx.DimEq(label[1], 1) && ctx.DimEq(label[0], idx[0]),
                   "Label must be [N, 1] with N the rows of Indices ", idx.str(), ", got Label ",
                   label.str());
  ctx.SetOutputDim("Accuracy", DDim{1});
  ctx.SetOutputDType("Accuracy", DType::kFloat32);
  ctx.SetOutputDim("Correct", DDim{1});
  ctx.SetOutputDType("Correct", DType::kInt32);
  ctx.SetOutputDim("Total", DDim{1});
  ctx.SetOutputDType("Total", DType::kInt32);
}

// Correct = rows whose Label is among that row's Indices; Total = N; Accuracy = Correct / Total
// (0 for N = 0). T is Out's dtype, which only picks the kernel.
template <typename T>
class AccuracyKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& idx = ctx.Input("Indices");
    const Tensor& label = ctx.Input("Label");
    const int64_t rows = idx.dims()[0], k = idx.dims()[1];
    const int64_t* ip = idx.data<int64_t>();
    const int64_t* lp = label.data<int64_t>();
    int64_t correct = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t* row = ip + r * k;
      correct += std::find(row, row + k, lp[r]) != row + k;
    }
    *ctx.Output("Accuracy")->mutable_data<float>(ctx.place()) =
        rows == 0 ? 0.0f : static_cast<float>(correct) / static_cast<float>(rows);
    *ctx.Output("Correct")->mutable_data<int32_t>(ctx.place()) = static_cast<int32_t>(correct);
    *ctx.Output("Total")->mutable_data<int32_t>(ctx.place()) = static_cast<int32_t>(rows);
  }
};

}  // namespace

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(top_k)
    .Doc(
        "The k largest values along the last axis, largest first, and their indices (ties: lower "
        "index first). X [N, D], k 3 -> Out [N, 3], Indices int64 [N, 3].")
    .Input("X", "any shape, rank >= 1")
    .Output("Out", "X's shape with the last dim k, X's dtype")
    .Output("Indices", "int64, the shape of Out: where each value sits in its row")
    .Attr<int>("k", 1, "how many to keep, in [1, last dim of X]")
    .Shape(TopKShape);
KEEL_REGISTER_CPU_KERNEL(top_k, TopKKernel, float, double, int32_t, int64_t);

KEEL_REGISTER_OP(arg_max)
    .Doc(
        "Out = the index of the largest element along axis (the first of equal ones). "
        "X [N, D], axis -1 -> Out int64 [N]; keepdims -> [N, 1]. A rank-1 X gives [1].")
    .Input("X", "any shape, rank >= 1")
    .Output("Out", "int64, X's shape without axis (or with it as 1 under keepdims)")
    .Attr<int64_t>("axis", 0, "the reduced dimension; negative counts from the end")
    .Attr<bool>("keepdims", false, "keep the reduced dimension as size 1")
    .Shape(ArgMaxShape);
KEEL_REGISTER_CPU_KERNEL(arg_max, ArgMaxKernel, float, double, int32_t, int64_t);

KEEL_REGISTER_OP(accuracy)
    .Doc(
        "Accuracy = the fraction of rows whose Label is among the row's top-k Indices. "
        "Out [N, k], Indices int64 [N, k], Label int64 [N, 1] -> Accuracy float32 [1], "
        "Correct int32 [1], Total int32 [1].")
    .Input("Out", "top-k values [N, k] (from top_k; only its dtype is used)")
    .Input("Indices", "int64 top-k class indices [N, k]")
    .Input("Label", "int64 class labels [N, 1]")
    .Output("Accuracy", "float32 [1]: Correct / Total")
    .Output("Correct", "int32 [1]: rows whose label is among the indices")
    .Output("Total", "int32 [1]: N")
    .Shape(AccuracyShape);
KEEL_REGISTER_CPU_KERNEL(accuracy, AccuracyKernel, float, double, int32_t, int64_t);

}  // namespace keel
