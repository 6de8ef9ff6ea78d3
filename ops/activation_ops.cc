// Activations: tanh, relu, sigmoid (elementwise) and softmax (along one axis).
//
// Every grad op reads Out and Out@GRAD only, never X, so X may be freed after the forward pass:
//   tanh:    dx = dout * (1 - out^2)
//   sigmoid: dx = dout * out * (1 - out)
//   relu:    dx = dout * (out > 0)
//   softmax: dx = out * (dout - sum(dout * out, axis))

// GCC 12's AVX-512 intrinsics trip a false -Wmaybe-uninitialized inside Eigen's reductions
// (GCC PR 105593); it fires at inlined sites, so it is silenced before Eigen is included.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <Eigen/Core>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"

namespace keel {
namespace {

template <typename T>
using Vec = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstVec = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
// A [rows, cols] row-major block: rows run along the softmax axis, cols are the trailing dims.
template <typename T>
using Mat = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <typename T>
using ConstMat = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

template <typename T>
ConstVec<T> Flat(const Tensor& t) {
  return ConstVec<T>(t.data<T>(), t.numel());
}
template <typename T>
Vec<T> FlatOut(Tensor* t, const Place& place) {
  return Vec<T>(t->mutable_data<T>(place), t->numel());
}

// ---------------------------------------------------------------- shapes and grad makers

void SameShapeAsX(InferShapeContext& ctx) { ctx.ShareDimAndDType("X", "Out"); }

// X@GRAD has the shape and dtype of Out (the grad op does not see X).
void GradShapeFromOut(InferShapeContext& ctx) {
  ctx.SetOutputDim(GradVarName("X"), ctx.GetInputDim("Out"));
  ctx.SetOutputDType(GradVarName("X"), ctx.GetInputDType("Out"));
}

// "<type>_grad" with inputs Out, Out@GRAD and output X@GRAD.
std::vector<std::unique_ptr<OpDesc>> GradFromOut(const OpDesc& fwd) {
  auto g = std::make_unique<OpDesc>(fwd.type() + "_grad");
  const std::string& out = fwd.Output("Out").at(0);
  g->SetInput("Out", {out});
  g->SetInput(GradVarName("Out"), {GradVarName(out)});
  g->SetOutput(GradVarName("X"), {GradVarName(fwd.Input("X").at(0))});
  for (auto& kv : fwd.attrs()) g->SetAttr(kv.first, kv.second);
  std::vector<std::unique_ptr<OpDesc>> r;
  r.push_back(std::move(g));
  return r;
}

// Normalizes a possibly negative axis against `rank`.
int CanonicalAxis(int axis, int rank) { return axis < 0 ? axis + rank : axis; }

void SoftmaxShape(InferShapeContext& ctx) {
  DDim x = ctx.GetInputDim("X");
  int axis = ctx.Attr<int>("axis");
  KEEL_SHAPE_CHECK(x.size() >= 1, "softmax needs rank >= 1, got X ", x.str());
  KEEL_SHAPE_CHECK(axis >= -x.size() && axis < x.size(), "axis ", axis, " is outside [", -x.size(),
                   ", ", x.size(), ") for X ", x.str());
  ctx.ShareDimAndDType("X", "Out");
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

// Rows up to this long (e.g. a 2-class head) are too short for per-row vector ops to pay off.
constexpr int64_t kShortRow = 16;

// dims = [pre, n, post] around the axis: n is the softmax length, post the stride between its
// elements (1 for the last axis, the common case).
struct AxisSplit {
  int64_t pre, n, post;
};
AxisSplit SplitAt(const DDim& d, int axis) {
  int a = CanonicalAxis(axis, d.size());
  return AxisSplit{d.prod(0, a), d[a], d.prod(a + 1, d.size())};
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
    .Grad(GradFromOut);
KEEL_REGISTER_GRAD_OP(tanh_grad, tanh).Shape(GradShapeFromOut).KernelDTypeFrom("Out");
KEEL_REGISTER_CPU_KERNEL(tanh, TanhKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(tanh_grad, TanhGradKernel, float, double);

KEEL_REGISTER_OP(sigmoid)
    .Doc("Out = 1 / (1 + exp(-X)), elementwise.")
    .Input("X", "any shape")
    .Output("Out", "shape of X")
    .Shape(SameShapeAsX)
    .Grad(GradFromOut);
KEEL_REGISTER_GRAD_OP(sigmoid_grad, sigmoid).Shape(GradShapeFromOut).KernelDTypeFrom("Out");
KEEL_REGISTER_CPU_KERNEL(sigmoid, SigmoidKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(sigmoid_grad, SigmoidGradKernel, float, double);

KEEL_REGISTER_OP(relu)
    .Doc("Out = max(X, 0), elementwise.")
    .Input("X", "any shape")
    .Output("Out", "shape of X")
    .Shape(SameShapeAsX)
    .Grad(GradFromOut);
KEEL_REGISTER_GRAD_OP(relu_grad, relu).Shape(GradShapeFromOut).KernelDTypeFrom("Out");
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
    .Grad(GradFromOut);
KEEL_REGISTER_GRAD_OP(softmax_grad, softmax).Shape(GradShapeFromOut).KernelDTypeFrom("Out");
KEEL_REGISTER_CPU_KERNEL(softmax, SoftmaxKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(softmax_grad, SoftmaxGradKernel, float, double);

}  // namespace keel
