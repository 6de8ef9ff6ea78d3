// Evaluation ops (PaddlePaddle Fluid 1.x slots and attrs), without gradients: top_k, arg_max,
// accuracy.
//
// Ties go to the lower index (top_k, arg_max); NaN counts as larger than any number, so a NaN
// logit shows up in the top-k rather than hiding. The kernels are in metric_ops.h; here are the
// shapes, the CPU math and the registrations.
#include "ops/metric_ops.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/cpu_threads.h"
#include "ops/op_util.h"

namespace keel {
namespace {

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

}  // namespace

// std::partial_sort per row by fn::RanksBefore.
template <typename T>
struct TopKMath<CPUDevice, T> {
  static void Run(const ExecutionContext&, const T* xp, int64_t rows, int64_t n, int k, T* vp,
                  int64_t* ip, std::vector<int64_t>* idx) {
    if (k == 1) {
      // The best of each row by one scan (accuracy's case; the same ranking, so the same index
      // as the sort's first), rows in pieces on the thread budget.
      const int64_t grain =
          std::max<int64_t>(1, cpu_threads::kElementwiseGrain / std::max<int64_t>(n, 1));
      cpu_threads::ParallelForRange(rows, grain, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const T* row = xp + r * n;
          int64_t best = 0;
          for (int64_t j = 1; j < n; ++j)
            if (fn::RanksBefore(row[j], j, row[best], best)) best = j;
          vp[r] = row[best];
          ip[r] = best;
        }
      });
      return;
    }
    idx->resize(n);
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = xp + r * n;
      std::iota(idx->begin(), idx->end(), int64_t{0});
      std::partial_sort(idx->begin(), idx->begin() + k, idx->end(), [row](int64_t a, int64_t b) {
        return fn::RanksBefore(row[a], a, row[b], b);
      });
      for (int j = 0; j < k; ++j) {
        vp[r * k + j] = row[(*idx)[j]];
        ip[r * k + j] = (*idx)[j];
      }
    }
  }
};

template <>
struct AccuracyMath<CPUDevice> {
  static void Run(const ExecutionContext&, const int64_t* ip, const int64_t* lp, int64_t rows,
                  int64_t k, float* accuracy, int32_t* correct_out, int32_t* total) {
    int64_t correct = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t* row = ip + r * k;
      correct += std::find(row, row + k, lp[r]) != row + k;
    }
    *accuracy = rows == 0 ? 0.0f : static_cast<float>(correct) / static_cast<float>(rows);
    *correct_out = static_cast<int32_t>(correct);
    *total = static_cast<int32_t>(rows);
  }
};

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
KEEL_REGISTER_KERNEL(CPU, top_k, TopKKernel, float, double, int32_t, int64_t);

KEEL_REGISTER_OP(arg_max)
    .Doc(
        "Out = the index of the largest element along axis (the first of equal ones). "
        "X [N, D], axis -1 -> Out int64 [N]; keepdims -> [N, 1]. A rank-1 X gives [1].")
    .Input("X", "any shape, rank >= 1")
    .Output("Out", "int64, X's shape without axis (or with it as 1 under keepdims)")
    .Attr<int64_t>("axis", 0, "the reduced dimension; negative counts from the end")
    .Attr<bool>("keepdims", false, "keep the reduced dimension as size 1")
    .Shape(ArgMaxShape);
KEEL_REGISTER_KERNEL(CPU, arg_max, ArgMaxKernel, float, double, int32_t, int64_t);

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
KEEL_REGISTER_KERNEL(CPU, accuracy, AccuracyKernel, float, double, int32_t, int64_t);

}  // namespace keel
