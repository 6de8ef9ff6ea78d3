// CUDA twins of activation_ops.cc: element-wise activations through the shared functors
// (ops/functors/activation_functors.h), softmax and log_softmax along one axis.
#include "ops/cuda_util.cuh"
#include "ops/functors/activation_functors.h"

namespace keel {
namespace {

// Out[i] = f(X[i]).
template <typename T, typename F>
void Unary(ExecutionContext& ctx, F f) {
  const Tensor& x = ctx.Input("X");
  const T* xp = x.data<T>();
  T* op = ctx.Output("Out")->mutable_data<T>(ctx.place());
  ForEach(ctx, x.numel(), [=] __device__(int64_t i) { op[i] = f(xp[i]); });
}

// X@GRAD[i] = f(A[i], Out@GRAD[i]), A being "Out" or "X".
template <typename T, typename F>
void UnaryGrad(ExecutionContext& ctx, const char* a_slot, F f) {
  Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
  if (dx == nullptr) return;
  const Tensor& a = ctx.Input(a_slot);
  const Tensor& dout = ctx.Input(GradVarName("Out"));
  KEEL_ENFORCE(a.numel() == dout.numel(), a_slot, " ", a.dims().str(), " and Out@GRAD ",
               dout.dims().str(), " differ in size");
  const T* ap = a.data<T>();
  const T* gp = dout.data<T>();
  T* dp = dx->mutable_data<T>(ctx.place());
  ForEach(ctx, a.numel(), [=] __device__(int64_t i) { dp[i] = f(ap[i], gp[i]); });
}

template <typename T, typename F>
class CudaActivation : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override { Unary<T>(ctx, F{}); }
};
// Grad of an activation whose derivative is a function of Out.
template <typename T, typename F>
class CudaActivationGradFromOut : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override { UnaryGrad<T>(ctx, "Out", F{}); }
};

template <typename T>
using ReluKernel = CudaActivation<T, fn::Relu>;
template <typename T>
using ReluGradKernel = CudaActivationGradFromOut<T, fn::ReluGrad>;
template <typename T>
using TanhKernel = CudaActivation<T, fn::TanhAct>;
template <typename T>
using TanhGradKernel = CudaActivationGradFromOut<T, fn::TanhGrad>;
template <typename T>
using SigmoidKernel = CudaActivation<T, fn::Sigmoid>;
template <typename T>
using SigmoidGradKernel = CudaActivationGradFromOut<T, fn::SigmoidGrad>;

template <typename T>
class GeluKernel : public OpKernel {
 public:
  explicit GeluKernel(const OpDesc& op) : f_{op.Attr<bool>("approximate")} {}
  void Compute(ExecutionContext& ctx) override { Unary<T>(ctx, f_); }

 private:
  fn::Gelu f_;
};
template <typename T>
class GeluGradKernel : public OpKernel {
 public:
  explicit GeluGradKernel(const OpDesc& op) : f_{op.Attr<bool>("approximate")} {}
  void Compute(ExecutionContext& ctx) override { UnaryGrad<T>(ctx, "X", f_); }

 private:
  fn::GeluGrad f_;
};

template <typename T>
class LeakyReluKernel : public OpKernel {
 public:
  explicit LeakyReluKernel(const OpDesc& op) : f_{static_cast<T>(op.Attr<float>("alpha"))} {}
  void Compute(ExecutionContext& ctx) override { Unary<T>(ctx, f_); }

 private:
  fn::LeakyRelu<T> f_;
};
template <typename T>
class LeakyReluGradKernel : public OpKernel {
 public:
  explicit LeakyReluGradKernel(const OpDesc& op) : f_{static_cast<T>(op.Attr<float>("alpha"))} {}
  void Compute(ExecutionContext& ctx) override { UnaryGrad<T>(ctx, "X", f_); }

 private:
  fn::LeakyReluGrad<T> f_;
};

template <typename T>
class ClipKernel : public OpKernel {
 public:
  explicit ClipKernel(const OpDesc& op)
      : f_{static_cast<T>(op.Attr<float>("min")), static_cast<T>(op.Attr<float>("max"))} {}
  void Compute(ExecutionContext& ctx) override { Unary<T>(ctx, f_); }

 private:
  fn::Clip<T> f_;
};
template <typename T>
class ClipGradKernel : public OpKernel {
 public:
  explicit ClipGradKernel(const OpDesc& op)
      : f_{static_cast<T>(op.Attr<float>("min")), static_cast<T>(op.Attr<float>("max"))} {}
  void Compute(ExecutionContext& ctx) override { UnaryGrad<T>(ctx, "X", f_); }

 private:
  fn::ClipGrad<T> f_;
};

// ---------------------------------------------------------------- softmax, log_softmax

// Rows of n elements with stride `post` (X viewed as [pre, n, post]); row r = (i, k) starts at
// i * n * post + k. One block per row; threads stride over the row.
//   softmax:      out = exp(x - max) / sum(exp(x - max))
//   log_softmax:  out = x - max - log(sum(exp(x - max)))
template <typename T, bool kLog>
__global__ void SoftmaxRows(const T* x, T* out, int64_t n, int64_t post) {
  const int64_t r = blockIdx.x;
  const int64_t base = (r / post) * n * post + r % post;
  T mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = max(mx, x[base + j * post]);
  mx = BlockMax(mx);
  T sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += fn::Exp(x[base + j * post] - mx);
  sum = BlockSum(sum);
  if (kLog) {
    const T lse = fn::Log(sum);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      out[base + j * post] = x[base + j * post] - mx - lse;
  } else {
    const T inv = T(1) / sum;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      out[base + j * post] = fn::Exp(x[base + j * post] - mx) * inv;
  }
}

//   softmax:      dx = out * (dout - sum(dout * out))
//   log_softmax:  dx = dout - exp(out) * sum(dout)
template <typename T, bool kLog>
__global__ void SoftmaxGradRows(const T* out, const T* dout, T* dx, int64_t n, int64_t post) {
  const int64_t r = blockIdx.x;
  const int64_t base = (r / post) * n * post + r % post;
  T s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t k = base + j * post;
    s += kLog ? dout[k] : dout[k] * out[k];
  }
  s = BlockSum(s);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t k = base + j * post;
    dx[k] = kLog ? dout[k] - fn::Exp(out[k]) * s : out[k] * (dout[k] - s);
  }
}

inline int RowThreads(int64_t n) { return n >= 256 ? 256 : n > 64 ? 128 : 32; }

template <typename T, bool kLog>
class SoftmaxKernel : public OpKernel {
 public:
  explicit SoftmaxKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const AxisSplit s = SplitAt(x.dims(), axis_);
    T* op = ctx.Output("Out")->mutable_data<T>(ctx.place());
    const int64_t rows = s.pre * s.post;
    if (rows == 0 || s.n == 0) return;
    KEEL_ENFORCE(rows < (int64_t(1) << 31), "softmax: ", rows, " rows exceed the grid");
    SoftmaxRows<T, kLog>
        <<<rows, RowThreads(s.n), 0, Cuda(ctx).stream()>>>(x.data<T>(), op, s.n, s.post);
    KEEL_CUDA_LAUNCH_CHECK();
  }

 private:
  int axis_;
};

template <typename T, bool kLog>
class SoftmaxGradKernel : public OpKernel {
 public:
  explicit SoftmaxGradKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& out = ctx.Input("Out");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(out.numel() == dout.numel(), "Out ", out.dims().str(), " and Out@GRAD ",
                 dout.dims().str(), " differ in size");
    const AxisSplit s = SplitAt(out.dims(), axis_);
    T* dp = dx->mutable_data<T>(ctx.place());
    const int64_t rows = s.pre * s.post;
    if (rows == 0 || s.n == 0) return;
    KEEL_ENFORCE(rows < (int64_t(1) << 31), ctx.op().type(), ": ", rows,
                 " rows exceed one launch");
    SoftmaxGradRows<T, kLog><<<rows, RowThreads(s.n), 0, Cuda(ctx).stream()>>>(
        out.data<T>(), dout.data<T>(), dp, s.n, s.post);
    KEEL_CUDA_LAUNCH_CHECK();
  }

 private:
  int axis_;
};

template <typename T>
using SoftmaxFwd = SoftmaxKernel<T, false>;
template <typename T>
using SoftmaxBwd = SoftmaxGradKernel<T, false>;
template <typename T>
using LogSoftmaxFwd = SoftmaxKernel<T, true>;
template <typename T>
using LogSoftmaxBwd = SoftmaxGradKernel<T, true>;

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(relu, ReluKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(relu_grad, ReluGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(tanh, TanhKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(tanh_grad, TanhGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(sigmoid, SigmoidKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(sigmoid_grad, SigmoidGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(gelu, GeluKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(gelu_grad, GeluGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(leaky_relu, LeakyReluKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(leaky_relu_grad, LeakyReluGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(clip, ClipKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(clip_grad, ClipGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(softmax, SoftmaxFwd, float, double);
KEEL_REGISTER_CUDA_KERNEL(softmax_grad, SoftmaxBwd, float, double);
KEEL_REGISTER_CUDA_KERNEL(log_softmax, LogSoftmaxFwd, float, double);
KEEL_REGISTER_CUDA_KERNEL(log_softmax_grad, LogSoftmaxBwd, float, double);

}  // namespace keel
