// What the CPU op files share: the CPU device vocabulary (ops/device_cpu.h), Eigen views of tensor
// buffers, the (pre, n, post) split of a shape
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
#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/ddim.h"
#include "framework/runtime/half_convert.h"
#include "ops/axis_layout.h"
#include "ops/device_cpu.h"

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

// ---------------------------------------------------------------- the 16-bit types on the CPU

// Whole tensors widened or narrowed, in pieces on the thread budget.
template <typename T>
void WidenInPieces(const T* src, float* dst, int64_t n) {
  cpu_threads::ParallelForRange(n, cpu_threads::kElementwiseGrain,
                                [&](int64_t b, int64_t e) { WidenN(src + b, dst + b, e - b); });
}
template <typename T>
void NarrowInPieces(const float* src, T* dst, int64_t n) {
  cpu_threads::ParallelForRange(n, cpu_threads::kElementwiseGrain,
                                [&](int64_t b, int64_t e) { NarrowN(src + b, dst + b, e - b); });
}

// CPU math of the 16-bit types that runs Eigen's float32 code: elements [b, e) widened to float32
// in chunks of kHalfChunk (on the stack), fn(ConstVec<float> x..., Vec<float> out) per chunk, the
// result narrowed into out (half_convert.h's vectorized conversions).
constexpr int64_t kHalfChunk = 1024;
template <typename T, typename Fn>
void InFloatChunks(int64_t b, int64_t e, const T* x, T* out, const Fn& fn) {
  alignas(64) float xb[kHalfChunk], ob[kHalfChunk];
  for (int64_t i = b; i < e; i += kHalfChunk) {
    const int64_t len = std::min(kHalfChunk, e - i);
    WidenN(x + i, xb, len);
    fn(ConstVec<float>(xb, len), Vec<float>(ob, len));
    NarrowN(ob, out + i, len);
  }
}
template <typename T, typename Fn>
void InFloatChunks(int64_t b, int64_t e, const T* x, const T* y, T* out, const Fn& fn) {
  alignas(64) float xb[kHalfChunk], yb[kHalfChunk], ob[kHalfChunk];
  for (int64_t i = b; i < e; i += kHalfChunk) {
    const int64_t len = std::min(kHalfChunk, e - i);
    WidenN(x + i, xb, len);
    WidenN(y + i, yb, len);
    fn(ConstVec<float>(xb, len), ConstVec<float>(yb, len), Vec<float>(ob, len));
    NarrowN(ob, out + i, len);
  }
}

// ---------------------------------------------------------------- shape checks and functions

// Product of dims [b, e), or -1 when any of them is unknown (build time).
inline int64_t ProdOrUnknown(const DDim& d, int b, int e) {
  int64_t n = 1;
  for (int i = b; i < e; ++i) {
    if (d[i] < 0) return -1;
    n *= d[i];
  }
  return n;
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

// Checks a (height, width) pair attr whose values must be >= lo (strides, paddings, ...).
inline AttrCheckFn PairAtLeast(int lo) {
  return [lo](const Attribute& a) -> std::string {
    const auto& v = std::get<std::vector<int>>(a);
    if (v.size() != 2) return "must hold 2 values (height, width), got " + IntsStr(v);
    if (v[0] < lo || v[1] < lo) return "values must be >= " + std::to_string(lo);
    return "";
  };
}

// Checks a string attr against the allowed values.
inline AttrCheckFn OneOf(std::vector<std::string> allowed) {
  return [allowed](const Attribute& a) -> std::string {
    const auto& s = std::get<std::string>(a);
    std::string list;
    for (auto& x : allowed) {
      if (s == x) return "";
      list += (list.empty() ? "" : ", ") + x;
    }
    return "must be one of " + list + ", got '" + s + "'";
  };
}

// Checks a float attr is > 0.
inline AttrCheckFn Positive() {
  return [](const Attribute& a) -> std::string {
    return std::get<float>(a) > 0.0f ? "" : "must be > 0";
  };
}

}  // namespace keel
