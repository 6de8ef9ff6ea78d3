// Losses: cross_entropy (on probabilities) and softmax_with_cross_entropy (fused, on logits).
//
// Hard labels are int64 class indices with a trailing dim of 1; soft labels are distributions of
// the input's shape and dtype. A hard label equal to ignore_index contributes zero loss and zero
// gradient; any other label outside [0, D) is a keel::Error naming the value and the row.
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

void CheckHardLabelTensor(const Tensor& label) {
  KEEL_ENFORCE(label.dtype() == DType::kInt64, "hard labels must be int64 class indices, got ",
               DTypeName(label.dtype()));
}

[[noreturn]] void ThrowBadLabel(const char* op, int64_t label, int64_t row, int64_t classes,
                                int ignore_index) {
  KEEL_THROW(op, ": Label value ", label, " at row ", row, " is outside [0, ", classes,
             ") (ignore_index is ", ignore_index, ")");
}

// ---------------------------------------------------------------- cross_entropy

void CrossEntropyShape(InferShapeContext& ctx) {
  DDim x = ctx.GetInputDim("X");
  DDim out = CheckLabel(ctx, "X", x.size() - 1);
  ctx.SetOutputDim("Y", out);
  ctx.SetOutputDType("Y", ctx.GetInputDType("X"));
}

// hard: y[i] = -log(x[i, label[i]]);  soft: y[i] = -sum_j label[i, j] * log(x[i, j]).
template <typename T>
class CrossEntropyKernel : public OpKernel {
 public:
  explicit CrossEntropyKernel(const OpDesc& op)
      : soft_(op.Attr<bool>("soft_label")), ignore_index_(op.Attr<int>("ignore_index")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& label = ctx.Input("Label");
    Tensor* out = ctx.Output("Y");
    const int64_t d = x.dims()[x.dims().size() - 1];
    const int64_t n = d == 0 ? 0 : x.numel() / d;
    const T* xp = x.data<T>();
    T* op = out->mutable_data<T>(ctx.place());
    if (soft_) {
      ConstMat<T> xm(xp, n, d);
      ConstMat<T> lm(label.data<T>(), n, d);
      Vec<T>(op, n) = -(lm * xm.log().max(T(-kApproxInf))).rowwise().sum();
      return;
    }
    CheckHardLabelTensor(label);
    const int64_t* lp = label.data<int64_t>();
    // Gather x[label] (1 for ignored rows), then one vectorized log over the column.
    bool any_ignored = false;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t l = lp[i];
      if (l == ignore_index_) {
        op[i] = T(1);
        any_ignored = true;
        continue;
      }
      if (l < 0 || l >= d) ThrowBadLabel("cross_entropy", l, i, d, ignore_index_);
      op[i] = xp[i * d + l];
    }
    Vec<T> o(op, n);
    o = -(o.log().max(T(-kApproxInf)));
    if (any_ignored)
      for (int64_t i = 0; i < n; ++i)
        if (lp[i] == ignore_index_) op[i] = T(0);
  }

 private:
  bool soft_;
  int ignore_index_;
};

// hard: dx[i, label[i]] = -dy[i] / x[i, label[i]], 0 elsewhere;  soft: dx = -dy * label / x.
template <typename T>
class CrossEntropyGradKernel : public OpKernel {
 public:
  explicit CrossEntropyGradKernel(const OpDesc& op)
      : soft_(op.Attr<bool>("soft_label")), ignore_index_(op.Attr<int>("ignore_index")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& x = ctx.Input("X");
    const Tensor& label = ctx.Input("Label");
    const Tensor& dout = ctx.Input(GradVarName("Y"));
    const int64_t d = x.dims()[x.dims().size() - 1];
    const int64_t n = d == 0 ? 0 : x.numel() / d;
    KEEL_ENFORCE(dout.numel() == n, "Y@GRAD ", dout.dims().str(), " does not match X ",
                 x.dims().str());
    const T* xp = x.data<T>();
    const T* dyp = dout.data<T>();
    T* dxp = dx->mutable_data<T>(ctx.place());
    if (soft_) {
      ConstMat<T> xm(xp, n, d);
      ConstMat<T> lm(label.data<T>(), n, d);
      Mat<T>(dxp, n, d) = ((-lm) / xm).colwise() * ConstVec<T>(dyp, n);
      return;
    }
    CheckHardLabelTensor(label);
    const int64_t* lp = label.data<int64_t>();
    Vec<T>(dxp, n * d).setZero();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t l = lp[i];
      if (l == ignore_index_) continue;
      if (l < 0 || l >= d) ThrowBadLabel("cross_entropy_grad", l, i, d, ignore_index_);
      dxp[i * d + l] = -dyp[i] / xp[i * d + l];
    }
  }

 private:
  bool soft_;
  int ignore_index_;
};

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

// Per row, with m = max(x) and lse = log(sum(exp(x - m))):
//   softmax = exp(x - m - lse);  hard: loss = lse - (x[label] - m);
//   soft: loss = sum_j label_j * (lse - (x_j - m)), a label of 0 contributing 0 even where x_j is
//   -inf (fn::WeightTimes).
template <typename T>
class SoftmaxWithCrossEntropyKernel : public OpKernel {
 public:
  explicit SoftmaxWithCrossEntropyKernel(const OpDesc& op)
      : soft_(op.Attr<bool>("soft_label")),
        ignore_index_(op.Attr<int>("ignore_index")),
        axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& logits = ctx.Input("Logits");
    const Tensor& label = ctx.Input("Label");
    const AxisSplit s = SplitAt(logits.dims(), axis_);
    const T* xp = logits.data<T>();
    T* smp = ctx.Output("Softmax")->mutable_data<T>(ctx.place());
    T* lossp = ctx.Output("Loss")->mutable_data<T>(ctx.place());
    const T* soft_lp = nullptr;
    const int64_t* hard_lp = nullptr;
    if (soft_) {
      soft_lp = label.data<T>();
    } else {
      CheckHardLabelTensor(label);
      hard_lp = label.data<int64_t>();
    }
    if (s.post == 1 && s.n <= kShortRow) {
      ShortRows(s, xp, soft_lp, hard_lp, smp, lossp);
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
      if (soft_) {
        ConstStridedVec<T, S> l(soft_lp + off, s.n, stride);
        lossp[row] = lse * l.sum() -
                     l.binaryExpr(x - mx, [](T w, T v) { return fn::WeightTimes(w, v); }).sum();
        return;
      }
      const int64_t l = hard_lp[row];
      if (l == ignore_index_) {
        lossp[row] = T(0);
        return;
      }
      if (l < 0 || l >= s.n)
        ThrowBadLabel("softmax_with_cross_entropy", l, row, s.n, ignore_index_);
      lossp[row] = lse - (x[l] - mx);
    });
  }

 private:
  // The same for rows along the last axis shorter than a SIMD register (a 2-class head): the
  // exp runs once over the whole buffer instead of per row.
  void ShortRows(const AxisSplit& s, const T* xp, const T* soft_lp, const int64_t* hard_lp, T* smp,
                 T* lossp) const {
    const int64_t n = s.n;
    // Pass 1: softmax = x - max; loss = -(x[label] - max) (soft: -sum(label * (x - max))).
    for (int64_t i = 0; i < s.pre; ++i) {
      const T* x = xp + i * n;
      T* sm = smp + i * n;
      T mx = x[0];
      for (int64_t k = 1; k < n; ++k) mx = std::max(mx, x[k]);
      for (int64_t k = 0; k < n; ++k) sm[k] = x[k] - mx;
      if (soft_) {
        T dot = 0;
        for (int64_t k = 0; k < n; ++k) dot += fn::WeightTimes(soft_lp[i * n + k], sm[k]);
        lossp[i] = -dot;
        continue;
      }
      const int64_t l = hard_lp[i];
      if (l == ignore_index_) {
        lossp[i] = T(0);
        continue;
      }
      if (l < 0 || l >= n) ThrowBadLabel("softmax_with_cross_entropy", l, i, n, ignore_index_);
      lossp[i] = -sm[l];
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
      if (soft_) {
        T label_sum = 0;
        for (int64_t k = 0; k < n; ++k) label_sum += soft_lp[i * n + k];
        lossp[i] += std::log(sum) * label_sum;
      } else if (hard_lp[i] != ignore_index_) {
        lossp[i] += std::log(sum);
      }
    }
  }

  bool soft_;
  int ignore_index_;
  int axis_;
};

// dlogits = (softmax - onehot(label)) * dloss per row (soft: softmax - label); 0 for ignored rows.
template <typename T>
class SoftmaxWithCrossEntropyGradKernel : public OpKernel {
 public:
  explicit SoftmaxWithCrossEntropyGradKernel(const OpDesc& op)
      : soft_(op.Attr<bool>("soft_label")),
        ignore_index_(op.Attr<int>("ignore_index")),
        axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("Logits"));
    if (dx == nullptr) return;
    const Tensor& softmax = ctx.Input("Softmax");
    const Tensor& label = ctx.Input("Label");
    const Tensor& dloss = ctx.Input(GradVarName("Loss"));
    const AxisSplit s = SplitAt(softmax.dims(), axis_);
    KEEL_ENFORCE(dloss.numel() == s.pre * s.post, "Loss@GRAD ", dloss.dims().str(),
                 " does not match Softmax ", softmax.dims().str());
    const T* smp = softmax.data<T>();
    const T* dlp = dloss.data<T>();
    T* dxp = dx->mutable_data<T>(ctx.place());
    const T* soft_lp = nullptr;
    const int64_t* hard_lp = nullptr;
    if (soft_) {
      soft_lp = label.data<T>();
    } else {
      CheckHardLabelTensor(label);
      hard_lp = label.data<int64_t>();
    }
    ForEachRow(s, [&](int64_t row, int64_t off, auto stride) {
      using S = decltype(stride);
      ConstStridedVec<T, S> sm(smp + off, s.n, stride);
      StridedVec<T, S> g(dxp + off, s.n, stride);
      const T dl = dlp[row];
      if (soft_) {
        g = (sm - ConstStridedVec<T, S>(soft_lp + off, s.n, stride)) * dl;
        return;
      }
      const int64_t l = hard_lp[row];
      if (l == ignore_index_) {
        g.setZero();
        return;
      }
      if (l < 0 || l >= s.n)
        ThrowBadLabel("softmax_with_cross_entropy_grad", l, row, s.n, ignore_index_);
      g = sm * dl;
      g[l] -= dl;
    });
  }

 private:
  bool soft_;
  int ignore_index_;
  int axis_;
};

}  // namespace

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
KEEL_REGISTER_CPU_KERNEL(cross_entropy, CrossEntropyKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(cross_entropy_grad, CrossEntropyGradKernel, float, double);

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
KEEL_REGISTER_CPU_KERNEL(softmax_with_cross_entropy, SoftmaxWithCrossEntropyKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(softmax_with_cross_entropy_grad, SoftmaxWithCrossEntropyGradKernel, float,
                         double);

}  // namespace keel
