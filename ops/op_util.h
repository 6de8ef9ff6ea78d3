// What the CPU op files share: Eigen views of tensor buffers, the (pre, n, post) split of a shape
// around an axis, and shape functions more than one op uses.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "framework/ir/program.h"
#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/op/shape_inference.h"
#include "framework/runtime/ddim.h"
#include "ops/axis_layout.h"

namespace keel {

// A flat buffer of n elements as an Eigen array (elementwise math, reductions).
template <typename T>
using Vec = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstVec = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
// A [rows, cols] row-major block, e.g. rows along a softmax axis and cols the trailing dims.
template <typename T>
using Mat = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <typename T>
using ConstMat = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

// Scratch kept across runs, aligned as tensors are (64 bytes). Eigen peels unaligned heads off
// its vectorized reductions, so a sum over a malloc'd buffer would add in an order (and give
// bits) that depend on where the buffer landed; aligned, every run adds the same way.
template <typename T>
using ScratchVector = std::vector<T, Eigen::aligned_allocator<T>>;

// Rows up to this long (e.g. a 2-class head) are too short for per-row vector ops to pay off.
constexpr int64_t kShortRow = 16;

// ---------------------------------------------------------------- shape checks and functions

// `axis` (negative counts from the end) must index a dim of input `slot`, of shape d; `what`
// names the attr ("axis", "dim") in the error.
inline void CheckAxisInRange(const char* what, int axis, const char* slot, const DDim& d) {
  KEEL_SHAPE_CHECK(axis >= -d.size() && axis < d.size(), what, " ", axis, " is outside [",
                   -d.size(), ", ", d.size(), ") for ", slot, " ", d.str());
}

// Out has the shape and dtype of X.
inline void SameShapeAsX(InferShapeContext& ctx) { ctx.ShareDimAndDType("X", "Out"); }

// For a grad op that does not read forward input `x`: x@GRAD takes the shape and dtype of input
// `like` (e.g. Out, which has x's shape).
inline InferShapeFn GradShapeLike(const std::string& x, const std::string& like) {
  return
      [grad = GradVarName(x), like](InferShapeContext& ctx) { ctx.ShareDimAndDType(like, grad); };
}

// ---------------------------------------------------------------- attrs and kernels shared by ops

// "[1, 2]"
inline std::string IntsStr(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Checks a (height, width) pair attr whose values must be >= lo (strides, paddings, ...).
inline AttrCheckFn PairAtLeast(int lo) {
  return [lo](const Attribute& a) -> std::string {
    const auto& v = std::get<std::vector<int>>(a);
    if (v.size() != 2) return "must hold 2 values (height, width), got " + IntsStr(v);
    if (v[0] < lo || v[1] < lo) return "values must be >= " + std::to_string(lo);
    return "";
  };
}

// Copies `from` into `to` (already shaped by the shape function), unless they share memory.
// Copying, not sharing, keeps `to`'s allocation (maybe a view into a fused buffer) in place.
template <typename T>
void CopyElements(const Tensor& from, Tensor* to, const Place& place) {
  KEEL_ENFORCE(from.numel() == to->numel(), "cannot copy ", from.dims().str(), " into ",
               to->dims().str());
  const T* src = from.data<T>();
  T* dst = to->mutable_data<T>(place);
  if (dst != src) std::copy_n(src, from.numel(), dst);
}

// Out = X's elements in Out's shape (reshape, flatten, squeeze, unsqueeze).
template <typename T>
class CopyKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    CopyElements<T>(ctx.Input("X"), ctx.Output("Out"), ctx.place());
  }
};

// X@GRAD = Out@GRAD's elements in X's shape.
template <typename T>
class CopyGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    CopyElements<T>(ctx.Input(GradVarName("Out")), dx, ctx.place());
  }
};

}  // namespace keel
