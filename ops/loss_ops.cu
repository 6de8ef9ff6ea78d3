// CUDA twins of loss_ops.cc: cross_entropy and softmax_with_cross_entropy, forward and grad, with
// hard (int64 index) or soft labels. A hard label outside [0, D) that is not ignore_index gives
// that row a NaN loss (and a NaN gradient row) and is reported, with its value and row, as a
// keel::Error at the op's next run (DeviceReportSlot): the device cannot throw.
#include "ops/cuda_util.cuh"
#include "ops/functors/elementwise_functors.h"
#include "ops/functors/hd.h"

namespace keel {
namespace {

// log(x) clamped below at -1e20 (Paddle's TolerableValue), as the CPU kernel.
template <typename T>
__device__ T TolerableLog(T x) {
  const T l = fn::Log(x);
  return l > T(-1e20) ? l : T(-1e20);
}

template <typename T>
__device__ T NaNOf() {
  return T(NAN);
}

void ThrowIfReported(DeviceReportSlot& slot, const char* op, int64_t classes, int ignore_index) {
  slot.Check([&](long long label, long long row) {
    KEEL_THROW(op, ": Label value ", label, " at row ", row, " is outside [0, ", classes,
               ") (ignore_index is ", ignore_index, "; found on the device in an earlier run)");
  });
}

void CheckHardLabel(const Tensor& label) {
  KEEL_ENFORCE(label.dtype() == DType::kInt64, "hard labels must be int64 class indices, got ",
               DTypeName(label.dtype()));
}

// ---------------------------------------------------------------- cross_entropy

// hard: y[i] = -log(x[i, label[i]]) (0 for ignored rows);  soft: y[i] = -sum_j l[i, j] log x[i, j].
template <typename T>
__global__ void CrossEntropyRows(const T* x, const int64_t* hard, const T* soft, T* y, int64_t n,
                                 int64_t d, int ignore_index, DeviceReport* report) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(blockDim.x) * gridDim.x) {
    if (soft != nullptr) {
      T s = 0;
      for (int64_t j = 0; j < d; ++j) s += soft[i * d + j] * TolerableLog(x[i * d + j]);
      y[i] = -s;
      continue;
    }
    const int64_t l = hard[i];
    if (l == ignore_index) {
      y[i] = T(0);
    } else if (l < 0 || l >= d) {
      Report(report, l, i);
      y[i] = NaNOf<T>();
    } else {
      y[i] = -TolerableLog(x[i * d + l]);
    }
  }
}

template <typename T>
class CrossEntropyKernel : public OpKernel {
 public:
  explicit CrossEntropyKernel(const OpDesc& op)
      : soft_(op.Attr<bool>("soft_label")), ignore_index_(op.Attr<int>("ignore_index")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& label = ctx.Input("Label");
    const int64_t d = x.dims()[x.dims().size() - 1];
    const int64_t n = d == 0 ? 0 : x.numel() / d;
    ThrowIfReported(report_, "cross_entropy", d, ignore_index_);
    if (!soft_) CheckHardLabel(label);
    T* y = ctx.Output("Y")->mutable_data<T>(ctx.place());
    if (n == 0) return;
    CrossEntropyRows<T><<<GridFor(n), 256, 0, Cuda(ctx).stream()>>>(
        x.data<T>(), soft_ ? nullptr : label.data<int64_t>(), soft_ ? label.data<T>() : nullptr, y,
        n, d, ignore_index_, report_.device(ctx));
    KEEL_CUDA_LAUNCH_CHECK();
  }

  void Replayed(ExecutionContext& ctx) override {
    const DDim& xd = ctx.Input("X").dims();
    ThrowIfReported(report_, "cross_entropy", xd[xd.size() - 1], ignore_index_);
  }

 private:
  bool soft_;
  int ignore_index_;
  DeviceReportSlot report_;
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
    ThrowIfReported(report_, "cross_entropy_grad", d, ignore_index_);
    const T* xp = x.data<T>();
    const T* dyp = dout.data<T>();
    T* dxp = dx->mutable_data<T>(ctx.place());
    if (soft_) {
      const T* lp = label.data<T>();
      ForEach(ctx, n * d, [=] __device__(int64_t k) { dxp[k] = -dyp[k / d] * lp[k] / xp[k]; });
      return;
    }
    CheckHardLabel(label);
    const int64_t* lp = label.data<int64_t>();
    const int ignore = ignore_index_;
    DeviceReport* report = report_.device(ctx);
    ForEach(ctx, n * d, [=] __device__(int64_t k) {
      const int64_t i = k / d, j = k % d, l = lp[i];
      if (l == ignore) {
        dxp[k] = T(0);
      } else if (l < 0 || l >= d) {
        if (j == 0) Report(report, l, i);
        dxp[k] = NaNOf<T>();
      } else {
        dxp[k] = j == l ? -dyp[i] / xp[k] : T(0);
      }
    });
  }

  void Replayed(ExecutionContext& ctx) override {
    const DDim& xd = ctx.Input("X").dims();
    ThrowIfReported(report_, "cross_entropy_grad", xd[xd.size() - 1], ignore_index_);
  }

 private:
  bool soft_;
  int ignore_index_;
  DeviceReportSlot report_;
};

// ---------------------------------------------------------------- softmax_with_cross_entropy

// One block per softmax row r = (i, k) of Logits viewed as [pre, n, post]; the row's elements sit
// at base + j * post. With m = max(x), lse = log(sum(exp(x - m))):
//   softmax = exp(x - m) / sum;  hard: loss = lse - (x[label] - m);
//   soft: loss = lse * sum(label) - sum(label * (x - m)), 0 * -inf counted as 0.
template <typename T>
__global__ void SoftmaxCrossEntropyRows(const T* x, const int64_t* hard, const T* soft, T* sm,
                                        T* loss, int64_t n, int64_t post, int ignore_index,
                                        DeviceReport* report) {
  const int64_t r = blockIdx.x;
  const int64_t base = (r / post) * n * post + r % post;
  T mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = max(mx, x[base + j * post]);
  mx = BlockMax(mx);
  T sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += fn::Exp(x[base + j * post] - mx);
  sum = BlockSum(sum);
  const T inv = T(1) / sum;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    sm[base + j * post] = fn::Exp(x[base + j * post] - mx) * inv;
  const T lse = fn::Log(sum);
  if (soft != nullptr) {
    T lsum = 0, dot = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T l = soft[base + j * post];
      lsum += l;
      dot += fn::WeightTimes(l, x[base + j * post] - mx);
    }
    lsum = BlockSum(lsum);
    dot = BlockSum(dot);
    if (threadIdx.x == 0) loss[r] = lse * lsum - dot;
    return;
  }
  if (threadIdx.x != 0) return;
  const int64_t l = hard[r];
  if (l == ignore_index) {
    loss[r] = T(0);
  } else if (l < 0 || l >= n) {
    Report(report, l, r);
    loss[r] = NaNOf<T>();
  } else {
    loss[r] = lse - (x[base + l * post] - mx);
  }
}

inline int RowThreads(int64_t n) { return n >= 256 ? 256 : n > 64 ? 128 : 32; }

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
    ThrowIfReported(report_, "softmax_with_cross_entropy", s.n, ignore_index_);
    if (!soft_) CheckHardLabel(label);
    T* sm = ctx.Output("Softmax")->mutable_data<T>(ctx.place());
    T* loss = ctx.Output("Loss")->mutable_data<T>(ctx.place());
    const int64_t rows = s.pre * s.post;
    if (rows == 0 || s.n == 0) return;
    KEEL_ENFORCE(rows < (int64_t(1) << 31), "softmax_with_cross_entropy: ", rows,
                 " rows exceed the grid");
    SoftmaxCrossEntropyRows<T><<<rows, RowThreads(s.n), 0, Cuda(ctx).stream()>>>(
        logits.data<T>(), soft_ ? nullptr : label.data<int64_t>(),
        soft_ ? label.data<T>() : nullptr, sm, loss, s.n, s.post, ignore_index_,
        report_.device(ctx));
    KEEL_CUDA_LAUNCH_CHECK();
  }

  void Replayed(ExecutionContext& ctx) override {
    ThrowIfReported(report_, "softmax_with_cross_entropy",
                    SplitAt(ctx.Input("Logits").dims(), axis_).n, ignore_index_);
  }

 private:
  bool soft_;
  int ignore_index_;
  int axis_;
  DeviceReportSlot report_;
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
    ThrowIfReported(report_, "softmax_with_cross_entropy_grad", s.n, ignore_index_);
    const T* smp = softmax.data<T>();
    const T* dlp = dloss.data<T>();
    T* dxp = dx->mutable_data<T>(ctx.place());
    const int64_t n = s.n, post = s.post;
    if (soft_) {
      const T* lp = label.data<T>();
      ForEach(ctx, softmax.numel(), [=] __device__(int64_t k) {
        const int64_t row = (k / (n * post)) * post + k % post;
        dxp[k] = (smp[k] - lp[k]) * dlp[row];
      });
      return;
    }
    CheckHardLabel(label);
    const int64_t* lp = label.data<int64_t>();
    const int ignore = ignore_index_;
    DeviceReport* report = report_.device(ctx);
    ForEach(ctx, softmax.numel(), [=] __device__(int64_t k) {
      const int64_t row = (k / (n * post)) * post + k % post, j = (k / post) % n;
      const int64_t l = lp[row];
      if (l == ignore) {
        dxp[k] = T(0);
      } else if (l < 0 || l >= n) {
        if (j == 0) Report(report, l, row);
        dxp[k] = NaNOf<T>();
      } else {
        const T dl = dlp[row];
        dxp[k] = j == l ? smp[k] * dl - dl : smp[k] * dl;
      }
    });
  }

  void Replayed(ExecutionContext& ctx) override {
    ThrowIfReported(report_, "softmax_with_cross_entropy_grad",
                    SplitAt(ctx.Input("Softmax").dims(), axis_).n, ignore_index_);
  }

 private:
  bool soft_;
  int ignore_index_;
  int axis_;
  DeviceReportSlot report_;
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(cross_entropy, CrossEntropyKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(cross_entropy_grad, CrossEntropyGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(softmax_with_cross_entropy, SoftmaxWithCrossEntropyKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(softmax_with_cross_entropy_grad, SoftmaxWithCrossEntropyGradKernel, float,
                          double);

}  // namespace keel
