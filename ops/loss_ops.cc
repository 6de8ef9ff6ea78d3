// Losses: cross_entropy (on probabilities) and softmax_with_cross_entropy (fused, on logits).
//
// Hard labels are int64 class indices with a trailing dim of 1; soft labels are distributions of
// the input's shape and dtype. A hard label equal to ignore_index contributes zero loss and zero
// gradient; any other label outside [0, D) is a keel::Error naming the value and the row. The
// kernels are in loss_ops.h; here are the shapes, the CPU math and the registrations.
#include "ops/loss_ops.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <string>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/functors/elementwise_functors.h"
#include "ops/op_util.h"

namespace keel {
namespace {

// log(x) is clamped below at -1e20 (Paddle's TolerableValue), so x = 0 gives a large finite loss
// and 0 * log(0) in soft labels stays 0.
constexpr double kApproxInf = 1e20;

// Shared by both losses: Label against the input (X or Logits) along `axis`, returns Loss's shape.
DDim CheckLabel(InferShapeContext& ctx, const std::string& in_slot, int axis) {
  DDim x = ctx.GetInputDim(in_slot);
  DDim label = ctx.GetInputDim("Label");
  const bool soft = ctx.Attr<bool>("soft_label");
  KEEL_SHAPE_CHECK(x.size() >= 1, in_slot, " needs rank >= 1, got ", x.str());
  KEEL_SHAPE_CHECK(label.size() == x.size(), "Label ", label.str(), " must have the rank of ",
                   in_slot, " ", x.str());
  for (int i = 0; i < x.size(); ++i) {
    if (i == axis) continue;
    KEEL_SHAPE_CHECK(ctx.DimEq(x[i], label[i]), in_slot, " ", x.str(), " and Label ", label.str(),
                     " differ in dim ", i);
  }
  if (soft) {
    KEEL_SHAPE_CHECK(ctx.DimEq(x[axis], label[axis]), "soft_label: Label ", label.str(),
                     " must have the shape of ", in_slot, " ", x.str());
    KEEL_SHAPE_CHECK(ctx.GetInputDType("Label") == ctx.GetInputDType(in_slot),
                     "soft_label: Label is ", DTypeName(ctx.GetInputDType("Label")), ", ", in_slot,
                     " is ", DTypeName(ctx.GetInputDType(in_slot)), "; they must match");
  } else {
    KEEL_SHAPE_CHECK(ctx.DimEq(label[axis], 1), "hard labels: Label ", label.str(),
                     " must have size 1 in dim ", axis, " (", in_slot, " ", x.str(), ")");
    KEEL_SHAPE_CHECK(ctx.GetInputDType("Label") == DType::kInt64,
                     "hard labels must be int64 class indices, got Label of dtype ",
                     DTypeName(ctx.GetInputDType("Label")),
                     "; cast it to int64 (or set soft_label for distributions)");
  }
  DDim loss = x;
  loss[axis] = 1;
  return loss;
}

// ---------------------------------------------------------------- cross_entropy

void CrossEntropyShape(InferShapeContext& ctx) {
  DDim x = ctx.GetInputDim("X");
  DDim out = CheckLabel(ctx, "X", x.size() - 1);
  ctx.SetOutputDim("Y", out);
  ctx.SetOutputDType("Y", ctx.GetInputDType("X"));
}

// ---------------------------------------------------------------- softmax_with_cross_entropy

void SoftmaxWithCrossEntropyShape(InferShapeContext& ctx) {
  DDim logits = ctx.GetInputDim("Logits");
  const int rank = logits.size();
  const int axis_attr = ctx.Attr<int>("axis");
  CheckAxisInRange("axis", axis_attr, "Logits", logits);
  DDim loss = CheckLabel(ctx, "Logits", CanonicalAxis(axis_attr, rank));
  ctx.ShareDimAndDType("Logits", "Softmax");
  ctx.SetOutputDim("Loss", loss);
  ctx.SetOutputDType("Loss", ctx.GetInputDType("Logits"));
}

// Calls fn(row, offset, stride) for each softmax row, with stride an Eigen::InnerStride.
template <typename Fn>
void ForEachRow(const AxisSplit& s, Fn&& fn) {
  if (s.post == 1) {
    for (int64_t i = 0; i < s.pre; ++i) fn(i, i * s.n, Eigen::InnerStride<1>());
    return;
  }
  for (int64_t i = 0; i < s.pre; ++i)
    for (int64_t j = 0; j < s.post; ++j)
      fn(i * s.post + j, i * s.n * s.post + j, Eigen::InnerStride<>(s.post));
}

template <typename T, typename S>
using StridedVec = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>, 0, S>;
template <typename T, typename S>
using ConstStridedVec = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>, 0, S>;

}  // namespace

template <typename T>
struct LossMath<CPUDevice, T> {
  // Gathers x[label] (1 for ignored rows), then one vectorized log over the column.
  static void CrossEntropy(const ExecutionContext&, const T* xp, const Labels<T>& l, int64_t n,
                           int64_t d, T* op, DeviceReport*) {
    if (l.soft) {
      ConstMat<T> xm(xp, n, d);
      ConstMat<T> lm(l.dist, n, d);
      Vec<T>(op, n) = -(lm * xm.log().max(T(-kApproxInf))).rowwise().sum();
      return;
    }
    const int64_t* lp = l.index;
    bool any_ignored = false;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t label = lp[i];
      if (label == l.ignore_index) {
        op[i] = T(1);
        any_ignored = true;
        continue;
      }
      if (label < 0 || label >= d) ThrowBadLabel("cross_entropy", label, i, d, l.ignore_index);
      op[i] = xp[i * d + label];
    }
    Vec<T> o(op, n);
    o = -(o.log().max(T(-kApproxInf)));
    if (any_ignored)
      for (int64_t i = 0; i < n; ++i)
        if (lp[i] == l.ignore_index) op[i] = T(0);
  }

  static void CrossEntropyGrad(const ExecutionContext&, const T* xp, const Labels<T>& l,
                               const T* dyp, int64_t n, int64_t d, T* dxp, DeviceReport*) {
    if (l.soft) {
      ConstMat<T> xm(xp, n, d);
      ConstMat<T> lm(l.dist, n, d);
      Mat<T>(dxp, n, d) = ((-lm) / xm).colwise() * ConstVec<T>(dyp, n);
      return;
    }
    Vec<T>(dxp, n * d).setZero();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t label = l.index[i];
      if (label == l.ignore_index) continue;
      if (label < 0 || label >= d) ThrowBadLabel("cross_entropy_grad", label, i, d, l.ignore_index);
      dxp[i * d + label] = -dyp[i] / xp[i * d + label];
    }
  }

  static void SoftmaxCrossEntropy(const ExecutionContext&, const AxisSplit& s, const T* xp,
                                  const Labels<T>& l, T* smp, T* lossp, DeviceReport*) {
    if (s.post == 1 && s.n <= kShortRow) {
      ShortRows(s, xp, l, smp, lossp);
      return;
    }
    ForEachRow(s, [&](int64_t row, int64_t off, auto stride) {
      using S = decltype(stride);
      ConstStridedVec<T, S> x(xp + off, s.n, stride);
      StridedVec<T, S> sm(smp + off, s.n, stride);
      const T mx = x.maxCoeff();
      sm = (x - mx).exp();
      const T sum = sm.sum();
      const T lse = std::log(sum);
      sm *= T(1) / sum;
      if (l.soft) {
        ConstStridedVec<T, S> w(l.dist + off, s.n, stride);
        lossp[row] = lse * w.sum() -
                     w.binaryExpr(x - mx, [](T a, T v) { return fn::WeightTimes(a, v); }).sum();
        return;
      }
      const int64_t label = l.index[row];
      if (label == l.ignore_index) {
        lossp[row] = T(0);
        return;
      }
      if (label < 0 || label >= s.n)
        ThrowBadLabel("softmax_with_cross_entropy", label, row, s.n, l.ignore_index);
      lossp[row] = lse - (x[label] - mx);
    });
  }

  static void SoftmaxCrossEntropyGrad(const ExecutionContext&, const AxisSplit& s, const T* smp,
                                      const Labels<T>& l, const T* dlp, T* dxp, DeviceReport*) {
    ForEachRow(s, [&](int64_t row, int64_t off, auto stride) {
      using S = decltype(stride);
      ConstStridedVec<T, S> sm(smp + off, s.n, stride);
      StridedVec<T, S> g(dxp + off, s.n, stride);
      const T dl = dlp[row];
      if (l.soft) {
        g = (sm - ConstStridedVec<T, S>(l.dist + off, s.n, stride)) * dl;
        return;
      }
      const int64_t label = l.index[row];
      if (label == l.ignore_index) {
        g.setZero();
        return;
      }
      if (label < 0 || label >= s.n)
        ThrowBadLabel("softmax_with_cross_entropy_grad", label, row, s.n, l.ignore_index);
      g = sm * dl;
      g[label] -= dl;
    });
  }

 private:
  // softmax_with_cross_entropy for rows along the last axis shorter than a SIMD register (a
  // 2-class head): the exp runs once over the whole buffer instead of per row.
  static void ShortRows(const AxisSplit& s, const T* xp, const Labels<T>& l, T* smp, T* lossp) {
    const int64_t n = s.n;
    const T* soft_lp = l.dist;
    const int64_t* hard_lp = l.index;
    // Pass 1: softmax = x - max; loss = -(x[label] - max) (soft: -sum(label * (x - max))).
    for (int64_t i = 0; i < s.pre; ++i) {
      const T* x = xp + i * n;
      T* sm = smp + i * n;
      T mx = x[0];
      for (int64_t k = 1; k < n; ++k) mx = std::max(mx, x[k]);
      for (int64_t k = 0; k < n; ++k) sm[k] = x[k] - mx;
      if (l.soft) {
        T dot = 0;
        for (int64_t k = 0; k < n; ++k) dot += fn::WeightTimes(soft_lp[i * n + k], sm[k]);
        lossp[i] = -dot;
        continue;
      }
      const int64_t label = hard_lp[i];
      if (label == l.ignore_index) {
        lossp[i] = T(0);
        continue;
      }
      if (label < 0 || label >= n)
        ThrowBadLabel("softmax_with_cross_entropy", label, i, n, l.ignore_index);
      lossp[i] = -sm[label];
    }
    Vec<T> all(smp, s.pre * n);
    all = all.exp();
    // Pass 2: normalize; loss += lse (soft: lse * sum(label)).
    for (int64_t i = 0; i < s.pre; ++i) {
      T* sm = smp + i * n;
      T sum = 0;
      for (int64_t k = 0; k < n; ++k) sum += sm[k];
      const T inv = T(1) / sum;
      for (int64_t k = 0; k < n; ++k) sm[k] *= inv;
      if (l.soft) {
        T label_sum = 0;
        for (int64_t k = 0; k < n; ++k) label_sum += soft_lp[i * n + k];
        lossp[i] += std::log(sum) * label_sum;
      } else if (hard_lp[i] != l.ignore_index) {
        lossp[i] += std::log(sum);
      }
    }
  }
};
// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(cross_entropy)
    .Doc(
        "Y = -log(X[label]) per row, on probabilities X (e.g. softmax output). "
        "X [N, D], Label int64 [N, 1] -> Y [N, 1]; soft_label: Label [N, D] floats, "
        "Y = -sum(Label * log(X)).")
    .Input("X", "probabilities [..., D]")
    .Input("Label", "int64 [..., 1] class indices, or [..., D] distributions with soft_label")
    .Output("Y", "loss [..., 1]")
    .Attr<bool>("soft_label", false, "Label holds distributions, not class indices")
    .Attr<int>("ignore_index", -100, "hard label value that yields zero loss and gradient")
    .Shape(CrossEntropyShape)
    .Grad(GradMaker("cross_entropy_grad", {"X", "Label"}, {"Y"}, {"X"}));
KEEL_REGISTER_GRAD_OP(cross_entropy_grad, cross_entropy);
KEEL_REGISTER_KERNEL(CPU, cross_entropy, CrossEntropyKernel, float, double);
KEEL_REGISTER_KERNEL(CPU, cross_entropy_grad, CrossEntropyGradKernel, float, double);

KEEL_REGISTER_OP(softmax_with_cross_entropy)
    .Doc(
        "Softmax = softmax(Logits, axis); Loss = cross_entropy(Softmax, Label), fused through "
        "log-sum-exp so large logits do not overflow. Logits [N, D], Label int64 [N, 1] -> "
        "Softmax [N, D], Loss [N, 1].")
    .Input("Logits", "unnormalized scores [..., D, ...]")
    .Input("Label", "int64 class indices (size 1 along axis), or distributions with soft_label")
    .Output("Softmax", "softmax of Logits along axis")
    .Output("Loss", "Logits' shape with size 1 along axis")
    .Attr<bool>("soft_label", false, "Label holds distributions, not class indices")
    .Attr<int>("ignore_index", -100, "hard label value that yields zero loss and gradient")
    .Attr<bool>("numeric_stable_mode", true, "kept for Paddle compatibility; always stable")
    .Attr<int>("axis", -1, "the class dimension; negative counts from the end")
    .Shape(SoftmaxWithCrossEntropyShape)
    .Grad(GradMaker("softmax_with_cross_entropy_grad", {"Label", "Softmax"}, {"Loss"}, {"Logits"}));
KEEL_REGISTER_GRAD_OP(softmax_with_cross_entropy_grad, softmax_with_cross_entropy)
    .Shape(GradShapeLike("Logits", "Softmax"))
    .KernelDTypeFrom("Softmax");
KEEL_REGISTER_KERNEL(CPU, softmax_with_cross_entropy, SoftmaxWithCrossEntropyKernel, float, double);
KEEL_REGISTER_KERNEL(CPU, softmax_with_cross_entropy_grad, SoftmaxWithCrossEntropyGradKernel, float,
                     double);

}  // namespace keel
