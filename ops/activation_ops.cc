// Activations: tanh, relu, sigmoid (elementwise) and softmax (along one axis).
//
// Every grad op reads Out and Out@GRAD only, never X, so X may be freed after the forward pass:
//   tanh:    dx = dout * (1 - out^2)
//   sigmoid: dx = dout * out * (1 - out)
//   relu:    dx = dout * (out > 0)
//   softmax: dx = out * (dout - sum(dout * out, axis))
#include <Eigen/Core>
#include <algorithm>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/op_util.h"

namespace keel {
namespace {

template <typename T>
ConstVec<T> Flat(const Tensor& t) {
  return ConstVec<T>(t.data<T>(), t.numel());
}
template <typename T>
Vec<T> FlatOut(Tensor* t, const Place& place) {
  return Vec<T>(t->mutable_data<T>(place), t->numel());
}

// ---------------------------------------------------------------- elementwise kernels

struct TanhFn {
  template <typename X, typename O>
  void operator()(const X& x, O out) const {
    out = x.tanh();
  }
};
struct TanhGradFn {
  template <typename O, typename D, typename G>
  void operator()(const O& out, const D& dout, G dx) const {
    using T = typename G::Scalar;
    dx = dout * (T(1) - out.square());
  }
};
struct SigmoidFn {
  template <typename X, typename O>
  void operator()(const X& x, O out) const {
    using T = typename O::Scalar;
    out = (T(1) + (-x).exp()).inverse();
  }
};
struct SigmoidGradFn {
  template <typename O, typename D, typename G>
  void operator()(const O& out, const D& dout, G dx) const {
    using T = typename G::Scalar;
    dx = dout * out * (T(1) - out);
  }
};
struct ReluFn {
  template <typename X, typename O>
  void operator()(const X& x, O out) const {
    using T = typename O::Scalar;
    out = x.max(T(0));
  }
};
struct ReluGradFn {
  template <typename O, typename D, typename G>
  void operator()(const O& out, const D& dout, G dx) const {
    using T = typename G::Scalar;
    dx = (out > T(0)).select(dout, T(0));
  }
};

// Out = F(X), elementwise.
template <typename T, typename F>
class UnaryKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    F()(Flat<T>(x), FlatOut<T>(ctx.Output("Out"), ctx.place()));
  }
};

// X@GRAD = F(Out, Out@GRAD), elementwise.
template <typename T, typename F>
class UnaryGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& out = ctx.Input("Out");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(out.numel() == dout.numel(), "Out ", out.dims().str(), " and Out@GRAD ",
                 dout.dims().str(), " differ in size");
    F()(Flat<T>(out), Flat<T>(dout), FlatOut<T>(dx, ctx.place()));
  }
};

template <typename T>
using TanhKernel = UnaryKernel<T, TanhFn>;
template <typename T>
using TanhGradKernel = UnaryGradKernel<T, TanhGradFn>;
template <typename T>
using SigmoidKernel = UnaryKernel<T, SigmoidFn>;
template <typename T>
using SigmoidGradKernel = UnaryGradKernel<T, SigmoidGradFn>;
template <typename T>
using ReluKernel = UnaryKernel<T, ReluFn>;
template <typename T>
using ReluGradKernel = UnaryGradKernel<T, ReluGradFn>;

// ---------------------------------------------------------------- softmax

void SoftmaxShape(InferShapeContext& ctx) {
  DDim x = ctx.GetInputDim("X");
  int axis = ctx.Attr<int>("axis");
  KEEL_SHAPE_CHECK(x.size() >= 1, "softmax needs rank >= 1, got X ", x.str());
  CheckAxisInRange("axis", axis, "X", x);
  ctx.ShareDimAndDType("X", "Out");
}

// Out = exp(X - max) / sum(exp(X - max)) along `axis`.
template <typename T>
class SoftmaxKernel : public OpKernel {
 public:
  explicit SoftmaxKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    Tensor* out = ctx.Output("Out");
    const AxisSplit s = SplitAt(x.dims(), axis_);
    const T* xp = x.data<T>();
    T* op = out->mutable_data<T>(ctx.place());
    if (s.post == 1 && s.n <= kShortRow) {
      // Shift each row by its max, exp the whole buffer in one vectorized pass, normalize rows.
      for (int64_t i = 0; i < s.pre; ++i) {
        const T* xr = xp + i * s.n;
        T* o = op + i * s.n;
        T mx = xr[0];
        for (int64_t k = 1; k < s.n; ++k) mx = std::max(mx, xr[k]);
        for (int64_t k = 0; k < s.n; ++k) o[k] = xr[k] - mx;
      }
      Vec<T> all(op, s.pre * s.n);
      all = all.exp();
      for (int64_t i = 0; i < s.pre; ++i) {
        T* o = op + i * s.n;
        T sum = 0;
        for (int64_t k = 0; k < s.n; ++k) sum += o[k];
        const T inv = T(1) / sum;
        for (int64_t k = 0; k < s.n; ++k) o[k] *= inv;
      }
      return;
    }
    if (s.post == 1) {
      for (int64_t i = 0; i < s.pre; ++i) {
        ConstVec<T> xr(xp + i * s.n, s.n);
        Vec<T> o(op + i * s.n, s.n);
        const T mx = xr.maxCoeff();
        o = (xr - mx).exp();
        o *= T(1) / o.sum();
      }
      return;
    }
    Eigen::Array<T, 1, Eigen::Dynamic> acc(s.post);
    for (int64_t i = 0; i < s.pre; ++i) {
      ConstMat<T> xm(xp + i * s.n * s.post, s.n, s.post);
      Mat<T> om(op + i * s.n * s.post, s.n, s.post);
      acc = xm.colwise().maxCoeff();
      om = (xm.rowwise() - acc).exp();
      acc = om.colwise().sum().inverse();
      om.rowwise() *= acc;
    }
  }

 private:
  int axis_;
};

// dx = out * (dout - sum(dout * out, axis)).
template <typename T>
class SoftmaxGradKernel : public OpKernel {
 public:
  explicit SoftmaxGradKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& out = ctx.Input("Out");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(out.dims() == dout.dims(), "Out ", out.dims().str(), " and Out@GRAD ",
                 dout.dims().str(), " differ");
    const AxisSplit s = SplitAt(out.dims(), axis_);
    const T* yp = out.data<T>();
    const T* dyp = dout.data<T>();
    T* dxp = dx->mutable_data<T>(ctx.place());
    if (s.post == 1 && s.n <= kShortRow) {
      for (int64_t i = 0; i < s.pre * s.n; i += s.n) {
        T dot = 0;
        for (int64_t k = 0; k < s.n; ++k) dot += dyp[i + k] * yp[i + k];
        for (int64_t k = 0; k < s.n; ++k) dxp[i + k] = yp[i + k] * (dyp[i + k] - dot);
      }
      return;
    }
    if (s.post == 1) {
      for (int64_t i = 0; i < s.pre; ++i) {
        ConstVec<T> y(yp + i * s.n, s.n);
        ConstVec<T> dy(dyp + i * s.n, s.n);
        Vec<T> g(dxp + i * s.n, s.n);
        const T dot = (dy * y).sum();
        g = y * (dy - dot);
      }
      return;
    }
    Eigen::Array<T, 1, Eigen::Dynamic> dot(s.post);
    for (int64_t i = 0; i < s.pre; ++i) {
      const int64_t off = i * s.n * s.post;
      ConstMat<T> y(yp + off, s.n, s.post);
      ConstMat<T> dy(dyp + off, s.n, s.post);
      Mat<T> g(dxp + off, s.n, s.post);
      dot = (dy * y).colwise().sum();
      g = y * (dy.rowwise() - dot);
    }
  }

 private:
  int axis_;
};

}  // namespace

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(tanh)
    .Doc("Out = tanh(X), elementwise.")
    .Input("X", "any shape")
    .Output("Out", "shape of X")
    .Shape(SameShapeAsX)
    .Grad(GradMaker("tanh_grad", {"Out"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(tanh_grad, tanh).Shape(GradShapeLike("X", "Out")).KernelDTypeFrom("Out");
KEEL_REGISTER_CPU_KERNEL(tanh, TanhKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(tanh_grad, TanhGradKernel, float, double);

KEEL_REGISTER_OP(sigmoid)
    .Doc("Out = 1 / (1 + exp(-X)), elementwise.")
    .Input("X", "any shape")
    .Output("Out", "shape of X")
    .Shape(SameShapeAsX)
    .Grad(GradMaker("sigmoid_grad", {"Out"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(sigmoid_grad, sigmoid)
    .Shape(GradShapeLike("X", "Out"))
    .KernelDTypeFrom("Out");
KEEL_REGISTER_CPU_KERNEL(sigmoid, SigmoidKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(sigmoid_grad, SigmoidGradKernel, float, double);

KEEL_REGISTER_OP(relu)
    .Doc("Out = max(X, 0), elementwise.")
    .Input("X", "any shape")
    .Output("Out", "shape of X")
    .Shape(SameShapeAsX)
    .Grad(GradMaker("relu_grad", {"Out"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(relu_grad, relu).Shape(GradShapeLike("X", "Out")).KernelDTypeFrom("Out");
KEEL_REGISTER_CPU_KERNEL(relu, ReluKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(relu_grad, ReluGradKernel, float, double);

KEEL_REGISTER_OP(softmax)
    .Doc(
        "Out = exp(X) / sum(exp(X), axis), computed as exp(X - max) for stability. "
        "X [N, D] with axis -1 gives Out [N, D], each row summing to 1.")
    .Input("X", "any shape, rank >= 1")
    .Output("Out", "shape of X")
    .Attr<int>("axis", -1, "the dimension normalized over; negative counts from the end")
    .Shape(SoftmaxShape)
    .Grad(GradMaker("softmax_grad", {"Out"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(softmax_grad, softmax)
    .Shape(GradShapeLike("X", "Out"))
    .KernelDTypeFrom("Out");
KEEL_REGISTER_CPU_KERNEL(softmax, SoftmaxKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(softmax_grad, SoftmaxGradKernel, float, double);

}  // namespace keel
