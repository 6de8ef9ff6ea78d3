// The kernels of the losses (loss_ops.cc has the ops and their shapes): cross_entropy and
// softmax_with_cross_entropy, forward and grad, with hard (int64 index) or soft labels, once for
// every device (ops/device.h). The math is LossMath<D, T>: Eigen on the CPU, CUDA kernels.
//
// A hard label outside [0, D) that is not ignore_index throws on the CPU, naming the value and the
// row; a device cannot throw, so its kernel gives the row a NaN loss (and a NaN gradient row) and
// reports it, and the op's next run throws (Device<D>::Reports).
#pragma once

#include <cstdint>

#include "ops/axis_layout.h"
#include "ops/device.h"

namespace keel {

// `note` ends the parenthesis: where a device found the label in an earlier run.
[[noreturn]] inline void ThrowBadLabel(const char* op, long long label, long long row,
                                       int64_t classes, int ignore_index, const char* note = "") {
  KEEL_THROW(op, ": Label value ", label, " at row ", row, " is outside [0, ", classes,
             ") (ignore_index is ", ignore_index, note, ")");
}

// Throws a bad label a device reported in an earlier run.
template <typename Reports>
void ThrowIfReported(Reports& reports, const char* op, int64_t classes, int ignore_index) {
  reports.Check([&](long long label, long long row) {
    ThrowBadLabel(op, label, row, classes, ignore_index, "; found on the device in an earlier run");
  });
}

inline void CheckHardLabels(const Tensor& label) {
  KEEL_ENFORCE(label.dtype() == DType::kInt64, "hard labels must be int64 class indices, got ",
               DTypeName(label.dtype()));
}

// The labels of a row-wise loss: soft (distributions of T) or hard (int64 indices, one per row).
template <typename T>
struct Labels {
  bool soft = false;
  const T* dist = nullptr;         // soft
  const int64_t* index = nullptr;  // hard
  int ignore_index = -100;
};
template <typename T>
Labels<T> LabelsOf(const Tensor& label, bool soft, int ignore_index) {
  Labels<T> l;
  l.soft = soft;
  l.ignore_index = ignore_index;
  if (soft) {
    l.dist = label.data<T>();
  } else {
    CheckHardLabels(label);
    l.index = label.data<int64_t>();
  }
  return l;
}

// The device math, x viewed as n rows of d (cross_entropy) or as [pre, n, post] around the class
// axis (softmax_with_cross_entropy, s):
//   CrossEntropy(ctx, x, labels, n, d, y, report)      hard: y = -log(x[label]) (0 if ignored);
//                                                      soft: y = -sum(label * log(x))
//   CrossEntropyGrad(ctx, x, labels, dy, n, d, dx, report)
//                                                      hard: dx[label] = -dy / x[label], else 0;
//                                                      soft: dx = -dy * label / x
//   SoftmaxCrossEntropy(ctx, s, x, labels, softmax, loss, report)
//   SoftmaxCrossEntropyGrad(ctx, s, softmax, labels, dloss, dx, report)
//                                                      (softmax - onehot(label)) * dloss per row
// log(x) is clamped below at -1e20 (Paddle's TolerableValue), so x = 0 gives a large finite loss
// and 0 * log(0) in soft labels stays 0.
template <typename D, typename T>
struct LossMath;

// What every loss kernel keeps: the label attrs, and where a device reports bad labels. The
// class count of a report's message is input `input`'s dim `axis`.
template <typename D>
class LossKernelBase : public OpKernel {
 public:
  LossKernelBase(const OpDesc& op, const char* input, int axis)
      : soft_(op.Attr<bool>("soft_label")),
        ignore_index_(op.Attr<int>("ignore_index")),
        input_(input),
        axis_(axis) {}
  // Throws a bad label that a device found in an earlier run.
  void Replayed(ExecutionContext& ctx) override {
    ThrowIfReported(report_, ctx.op().type().c_str(), SplitAt(ctx.Input(input_).dims(), axis_).n,
                    ignore_index_);
  }

 protected:
  bool soft_;
  int ignore_index_;
  const char* input_;
  int axis_;
  typename Device<D>::Reports report_;
};

// ---------------------------------------------------------------- cross_entropy

template <typename D, typename T>
class CrossEntropyKernel : public LossKernelBase<D> {
 public:
  explicit CrossEntropyKernel(const OpDesc& op) : LossKernelBase<D>(op, "X", -1) {}
  void Compute(ExecutionContext& ctx) override {
    this->Replayed(ctx);
    const Tensor& x = ctx.Input("X");
    const int64_t d = x.dims()[x.dims().size() - 1];
    const int64_t n = d == 0 ? 0 : x.numel() / d;
    const Labels<T> l = LabelsOf<T>(ctx.Input("Label"), this->soft_, this->ignore_index_);
    T* y = ctx.Output("Y")->mutable_data<T>(ctx.place());
    LossMath<D, T>::CrossEntropy(ctx, x.data<T>(), l, n, d, y, this->report_.device(ctx));
  }
};

template <typename D, typename T>
class CrossEntropyGradKernel : public LossKernelBase<D> {
 public:
  explicit CrossEntropyGradKernel(const OpDesc& op) : LossKernelBase<D>(op, "X", -1) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "X");
    if (dx == nullptr) return;
    const Tensor& x = ctx.Input("X");
    const Tensor& dout = ctx.Input(GradVarName("Y"));
    const int64_t d = x.dims()[x.dims().size() - 1];
    const int64_t n = d == 0 ? 0 : x.numel() / d;
    KEEL_ENFORCE(dout.numel() == n, "Y@GRAD ", dout.dims().str(), " does not match X ",
                 x.dims().str());
    this->Replayed(ctx);
    const Labels<T> l = LabelsOf<T>(ctx.Input("Label"), this->soft_, this->ignore_index_);
    LossMath<D, T>::CrossEntropyGrad(ctx, x.data<T>(), l, dout.data<T>(), n, d,
                                     dx->mutable_data<T>(ctx.place()), this->report_.device(ctx));
  }
};

// ---------------------------------------------------------------- softmax_with_cross_entropy

// Per row, with m = max(x) and lse = log(sum(exp(x - m))): softmax = exp(x - m - lse);
// hard: loss = lse - (x[label] - m); soft: loss = sum_j label_j * (lse - (x_j - m)), a label of 0
// contributing 0 even where x_j is -inf (fn::WeightTimes).
template <typename D, typename T>
class SoftmaxWithCrossEntropyKernel : public LossKernelBase<D> {
 public:
  explicit SoftmaxWithCrossEntropyKernel(const OpDesc& op)
      : LossKernelBase<D>(op, "Logits", op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    this->Replayed(ctx);
    const Tensor& logits = ctx.Input("Logits");
    const AxisSplit s = SplitAt(logits.dims(), this->axis_);
    const Labels<T> l = LabelsOf<T>(ctx.Input("Label"), this->soft_, this->ignore_index_);
    T* sm = ctx.Output("Softmax")->mutable_data<T>(ctx.place());
    T* loss = ctx.Output("Loss")->mutable_data<T>(ctx.place());
    LossMath<D, T>::SoftmaxCrossEntropy(ctx, s, logits.data<T>(), l, sm, loss,
                                        this->report_.device(ctx));
  }
};

// dlogits = (softmax - onehot(label)) * dloss per row (soft: softmax - label); 0 for ignored rows.
template <typename D, typename T>
class SoftmaxWithCrossEntropyGradKernel : public LossKernelBase<D> {
 public:
  explicit SoftmaxWithCrossEntropyGradKernel(const OpDesc& op)
      : LossKernelBase<D>(op, "Softmax", op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "Logits");
    if (dx == nullptr) return;
    const Tensor& softmax = ctx.Input("Softmax");
    const Tensor& dloss = ctx.Input(GradVarName("Loss"));
    const AxisSplit s = SplitAt(softmax.dims(), this->axis_);
    KEEL_ENFORCE(dloss.numel() == s.pre * s.post, "Loss@GRAD ", dloss.dims().str(),
                 " does not match Softmax ", softmax.dims().str());
    this->Replayed(ctx);
    T* dxp = dx->mutable_data<T>(ctx.place());
    const Labels<T> l = LabelsOf<T>(ctx.Input("Label"), this->soft_, this->ignore_index_);
    LossMath<D, T>::SoftmaxCrossEntropyGrad(ctx, s, softmax.data<T>(), l, dloss.data<T>(), dxp,
                                            this->report_.device(ctx));
  }
};

}  // namespace keel
