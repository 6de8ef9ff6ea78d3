// Math ops (PaddlePaddle Fluid 1.x semantics and slot names): mul, matmul, elementwise_{add, sub,
// mul, div}, sum, scale; each with its grad op and CPU kernels for float and double.
//
// Legend: M, K, N = rows of the left operand, the contracted dim, columns of the right operand.
// Elementwise broadcast views X as (pre, n, post) and Y as (n): Out[i, j, k] = X[i, j, k] op Y[j].
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/op/shape_inference.h"
#include "framework/runtime/blas.h"
#include "framework/runtime/cpu_threads.h"
#include "ops/functors/activation_functors.h"
#include "ops/functors/elementwise_functors.h"
#include "ops/matmul_plan.h"
#include "ops/op_util.h"

namespace keel {
namespace {

// ------------------------------------------------------------------------------------- helpers

// Product of dims [b, e), or -1 when any of them is unknown (build time).
int64_t ProdOrUnknown(const DDim& d, int b, int e) {
  int64_t n = 1;
  for (int i = b; i < e; ++i) {
    if (d[i] < 0) return -1;
    n *= d[i];
  }
  return n;
}

void CheckSameDType(const InferShapeContext& ctx, const std::string& a, const std::string& b) {
  DType ta = ctx.GetInputDType(a), tb = ctx.GetInputDType(b);
  KEEL_SHAPE_CHECK(ta == tb, a, " is ", DTypeName(ta), " but ", b, " is ", DTypeName(tb));
}

AttrCheckFn AtLeastOne() {
  return
      [](const Attribute& a) -> std::string { return std::get<int>(a) >= 1 ? "" : "must be >= 1"; };
}

// C = alpha * op(A) * op(B) + beta * C over contiguous row-major matrices; also right when K == 0
// (C = beta * C), which BLAS would reject for its zero leading dimension.
template <typename T>
void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, const T* B,
          T beta, T* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (beta == T(0)) {
      std::fill(C, C + M * N, T(0));
    } else {
      for (int64_t i = 0; i < M * N; ++i) C[i] *= beta;
    }
    return;
  }
  blas::Gemm<T>(ta, tb, M, N, K, alpha, A, B, beta, C);
}

// dst = src unless they are the same memory.
template <typename T>
void CopyIfDistinct(const T* src, T* dst, int64_t n) {
  if (src != dst && n > 0) std::memmove(dst, src, static_cast<size_t>(n) * sizeof(T));
}

// -------------------------------------------------------------------------------------- mul

// X [2, 3, 4] (x_num_col_dims 2 -> 6 x 4) * Y [4, 5] (y_num_col_dims 1 -> 4 x 5) = Out [2, 3, 5].
void MulShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X"), y = ctx.GetInputDim("Y");
  const int xk = ctx.Attr<int>("x_num_col_dims"), yk = ctx.Attr<int>("y_num_col_dims");
  KEEL_SHAPE_CHECK(x.size() > xk, "X's rank ", x.size(), " must exceed x_num_col_dims ", xk, " (X ",
                   x, ", Y ", y, ")");
  KEEL_SHAPE_CHECK(y.size() > yk, "Y's rank ", y.size(), " must exceed y_num_col_dims ", yk, " (X ",
                   x, ", Y ", y, ")");
  CheckSameDType(ctx, "X", "Y");
  const int64_t x_width = ProdOrUnknown(x, xk, x.size());
  const int64_t y_height = ProdOrUnknown(y, 0, yk);
  KEEL_SHAPE_CHECK(ctx.DimEq(x_width, y_height), "X's width ", x_width, " must equal Y's height ",
                   y_height, " (X ", x, ", Y ", y, ", x_num_col_dims ", xk, ", y_num_col_dims ", yk,
                   ")");
  DDim out;
  for (int i = 0; i < xk; ++i) out.push_back(x[i]);
  for (int i = yk; i < y.size(); ++i) out.push_back(y[i]);
  ctx.SetOutputDim("Out", out);
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

template <typename T>
class MulKernel : public OpKernel {
 public:
  explicit MulKernel(const OpDesc& op)
      : xk_(op.Attr<int>("x_num_col_dims")), yk_(op.Attr<int>("y_num_col_dims")) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    Tensor* out = ctx.Output("Out");
    const int64_t M = x.dims().prod(0, xk_), K = x.dims().prod(xk_, x.dims().size());
    const int64_t N = y.dims().prod(yk_, y.dims().size());
    // out = x * y. out: M x N, x: M x K, y: K x N
    Gemm<T>(false, false, M, N, K, T(1), x.data<T>(), y.data<T>(), T(0),
            out->mutable_data<T>(ctx.place()));
  }

 private:
  int xk_, yk_;
};

template <typename T>
class MulGradKernel : public OpKernel {
 public:
  explicit MulGradKernel(const OpDesc& op)
      : xk_(op.Attr<int>("x_num_col_dims")), yk_(op.Attr<int>("y_num_col_dims")) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    const Tensor& dout = ctx.Input("Out@GRAD");
    const int64_t M = x.dims().prod(0, xk_), K = x.dims().prod(xk_, x.dims().size());
    const int64_t N = y.dims().prod(yk_, y.dims().size());
    if (Tensor* dx = ctx.OutputOrNull("X@GRAD")) {
      // dx = dout * y'. dx: M x K, dout: M x N, y: K x N
      Gemm<T>(false, true, M, K, N, T(1), dout.data<T>(), y.data<T>(), T(0),
              dx->mutable_data<T>(ctx.place()));
    }
    if (Tensor* dy = ctx.OutputOrNull("Y@GRAD")) {
      // dy = x' * dout. dy: K x N, x: M x K, dout: M x N
      Gemm<T>(true, false, K, N, M, T(1), x.data<T>(), dout.data<T>(), T(0),
              dy->mutable_data<T>(ctx.place()));
    }
  }

 private:
  int xk_, yk_;
};

// ----------------------------------------------------------------------------------- matmul

// X [B, M, K] * Y [B, K, N] = Out [B, M, N]; X [B, M, K] * Y [K, N] = Out [B, M, N];
// X [M, K] * Y [B, K, N] = Out [B, M, N]; transpose_X/Y transpose the last two dims first.
void MatMulShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X"), y = ctx.GetInputDim("Y");
  const bool tx = ctx.Attr<bool>("transpose_X"), ty = ctx.Attr<bool>("transpose_Y");
  KEEL_SHAPE_CHECK(x.size() >= 2 && y.size() >= 2,
                   "X and Y must have rank >= 2 (1-D operands are not supported; reshape them to "
                   "[1, K] or [K, 1]) (X ",
                   x, ", Y ", y, ")");
  CheckSameDType(ctx, "X", "Y");
  const int xr = x.size(), yr = y.size();
  const int64_t M = tx ? x[xr - 1] : x[xr - 2], xK = tx ? x[xr - 2] : x[xr - 1];
  const int64_t yK = ty ? y[yr - 1] : y[yr - 2], N = ty ? y[yr - 2] : y[yr - 1];
  KEEL_SHAPE_CHECK(ctx.DimEq(xK, yK), "X's contracted dim ", xK, " must equal Y's ", yK, " (X ", x,
                   ", Y ", y, ", transpose_X ", tx ? "true" : "false", ", transpose_Y ",
                   ty ? "true" : "false", ")");
  DDim out;
  if (xr > 2 && yr > 2) {
    bool same = xr == yr;
    for (int i = 0; same && i < xr - 2; ++i) same = ctx.DimEq(x[i], y[i]);
    KEEL_SHAPE_CHECK(same, "batch dims of X and Y must match, or one operand must be 2-D (X ", x,
                     ", Y ", y, ")");
  }
  const DDim& batched = xr > 2 ? x : y;
  for (int i = 0; i < batched.size() - 2; ++i) {
    // Prefer a known batch dim when X's is unknown at build time.
    out.push_back(xr > 2 && x[i] < 0 && yr > 2 ? y[i] : batched[i]);
  }
  out.push_back(M);
  out.push_back(N);
  ctx.SetOutputDim("Out", out);
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

template <typename T>
class MatMulKernel : public OpKernel {
 public:
  explicit MatMulKernel(const OpDesc& op)
      : tx_(op.Attr<bool>("transpose_X")),
        ty_(op.Attr<bool>("transpose_Y")),
        alpha_(static_cast<T>(op.Attr<float>("alpha"))) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    Tensor* out = ctx.Output("Out");
    const MatMulPlan p = PlanMatMul(x.dims(), y.dims(), tx_, ty_);
    const T* xd = x.data<T>();
    const T* yd = y.data<T>();
    T* od = out->mutable_data<T>(ctx.place());
    for (int64_t b = 0; b < p.batch; ++b) {
      // out_b = alpha * op(x_b) * op(y_b). out_b: M x N, op(x_b): M x K, op(y_b): K x N
      Gemm<T>(tx_, ty_, p.M, p.N, p.K, alpha_, xd + b * p.x_stride, yd + b * p.y_stride, T(0),
              od + b * p.M * p.N);
    }
  }

 private:
  bool tx_, ty_;
  T alpha_;
};

template <typename T>
class MatMulGradKernel : public OpKernel {
 public:
  explicit MatMulGradKernel(const OpDesc& op)
      : tx_(op.Attr<bool>("transpose_X")),
        ty_(op.Attr<bool>("transpose_Y")),
        alpha_(static_cast<T>(op.Attr<float>("alpha"))) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    const Tensor& dout = ctx.Input("Out@GRAD");
    const MatMulPlan p = PlanMatMul(x.dims(), y.dims(), tx_, ty_);
    const int64_t M = p.M, K = p.K, N = p.N;
    const T* xd = x.data<T>();
    const T* yd = y.data<T>();
    const T* gd = dout.data<T>();
    // A 2-D operand broadcast over the batch (stride 0) sums its gradient over the batch.
    if (Tensor* dx = ctx.OutputOrNull("X@GRAD")) {
      T* dxd = dx->mutable_data<T>(ctx.place());
      if (p.batch == 0) std::fill(dxd, dxd + dx->numel(), T(0));  // a broadcast X got no grad
      for (int64_t b = 0; b < p.batch; ++b) {
        const T* yb = yd + b * p.y_stride;
        const T* gb = gd + b * M * N;
        T* dxb = dxd + b * p.x_stride;
        const T beta = p.x_stride == 0 && b > 0 ? T(1) : T(0);
        if (!tx_ && !ty_) {
          // dx = dout * y'. dx: M x K, dout: M x N, y: K x N
          Gemm<T>(false, true, M, K, N, alpha_, gb, yb, beta, dxb);
        } else if (!tx_ && ty_) {
          // dx = dout * y. dx: M x K, dout: M x N, y: N x K
          Gemm<T>(false, false, M, K, N, alpha_, gb, yb, beta, dxb);
        } else if (tx_ && !ty_) {
          // dx = y * dout'. dx: K x M, y: K x N, dout: M x N
          Gemm<T>(false, true, K, M, N, alpha_, yb, gb, beta, dxb);
        } else {
          // dx = y' * dout'. dx: K x M, y: N x K, dout: M x N
          Gemm<T>(true, true, K, M, N, alpha_, yb, gb, beta, dxb);
        }
      }
    }
    if (Tensor* dy = ctx.OutputOrNull("Y@GRAD")) {
      T* dyd = dy->mutable_data<T>(ctx.place());
      if (p.batch == 0) std::fill(dyd, dyd + dy->numel(), T(0));  // a broadcast Y got no grad
      for (int64_t b = 0; b < p.batch; ++b) {
        const T* xb = xd + b * p.x_stride;
        const T* gb = gd + b * M * N;
        T* dyb = dyd + b * p.y_stride;
        const T beta = p.y_stride == 0 && b > 0 ? T(1) : T(0);
        if (!tx_ && !ty_) {
          // dy = x' * dout. dy: K x N, x: M x K, dout: M x N
          Gemm<T>(true, false, K, N, M, alpha_, xb, gb, beta, dyb);
        } else if (tx_ && !ty_) {
          // dy = x * dout. dy: K x N, x: K x M, dout: M x N
          Gemm<T>(false, false, K, N, M, alpha_, xb, gb, beta, dyb);
        } else if (!tx_ && ty_) {
          // dy = dout' * x. dy: N x K, dout: M x N, x: M x K
          Gemm<T>(true, false, N, K, M, alpha_, gb, xb, beta, dyb);
        } else {
          // dy = dout' * x'. dy: N x K, dout: M x N, x: K x M
          Gemm<T>(true, true, N, K, M, alpha_, gb, xb, beta, dyb);
        }
      }
    }
  }

 private:
  bool tx_, ty_;
  T alpha_;
};

// ------------------------------------------------------------------------------ elementwise

// TrimmedRank, ResolveAxis and GetMid (X as (pre, n, post) around the dims Y covers) are in
// ops/axis_layout.h, shared with the CUDA kernels.
using fn::BroadcastMid;

// X [N, C, H, W] op Y [C] with axis 1 = Out [N, C, H, W]; X [N, C] op Y [C] (axis -1 or 1) is the
// bias add; Y of X's shape is plain elementwise.
void ElementwiseShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X"), y = ctx.GetInputDim("Y");
  const int axis = ctx.Attr<int>("axis");
  KEEL_SHAPE_CHECK(y.size() <= x.size(), "Y's rank ", y.size(), " must not exceed X's rank ",
                   x.size(), " (X ", x, ", Y ", y, ")");
  CheckSameDType(ctx, "X", "Y");
  const int a = ResolveAxis(axis, x, y), yr = TrimmedRank(y);
  // a <= rank(X) - yr, not a + yr <= rank(X): an axis near INT_MAX must not wrap around.
  KEEL_SHAPE_CHECK(a >= 0 && a <= x.size() - yr, "axis ", axis, " places Y's ", yr,
                   " non-trailing-1 dims outside X's ", x.size(), " dims (X ", x, ", Y ", y, ")");
  for (int i = 0; i < yr; ++i) {
    KEEL_SHAPE_CHECK(ctx.DimEq(x[a + i], y[i]), "Y's dim ", i, " (", y[i], ") must equal X's dim ",
                     a + i, " (", x[a + i], ") (X ", x, ", Y ", y, ", axis ", axis, ")");
  }
  ctx.ShareDimAndDType("X", "Out");
}

// The element-wise math (Add, Sub, Mul, Div and their gradient rules) is shared with the CUDA
// kernels: ops/functors/elementwise_functors.h.
using AddFunctor = fn::Add;
using SubFunctor = fn::Sub;
using MulFunctor = fn::Mul;
using DivFunctor = fn::Div;
using AddGradFunctor = fn::AddGrad;
using SubGradFunctor = fn::SubGrad;
using MulGradFunctor = fn::MulGrad;
using DivGradFunctor = fn::DivGrad;

// Calls fn(idx, len, j, j_step) for runs of X's flat indices [idx, idx + len) that pair with Y's
// entries j + j_step * k (j_step 0: one Y entry for the run; 1: consecutive ones), in pieces of
// the flat index on the CPU thread budget. Element-wise: the cut changes no result.
template <typename Fn>
void ForEachRun(const BroadcastMid& m, const Fn& fn) {
  cpu_threads::ParallelForRange(
      m.pre * m.n * m.post, cpu_threads::kElementwiseGrain, [&](int64_t b, int64_t e) {
        for (int64_t idx = b; idx < e;) {
          if (m.post == 1) {
            const int64_t j = idx % m.n, len = std::min(e - idx, m.n - j);
            fn(idx, len, j, 1);
            idx += len;
          } else {
            const int64_t k = idx % m.post, len = std::min(e - idx, m.post - k);
            fn(idx, len, (idx / m.post) % m.n, 0);
            idx += len;
          }
        }
      });
}

template <typename T, typename F>
class ElementwiseKernel : public OpKernel {
 public:
  explicit ElementwiseKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    Tensor* out = ctx.Output("Out");
    const BroadcastMid m = GetMid(x.dims(), y.dims(), axis_);
    const T* xd = x.data<T>();
    const T* yd = y.data<T>();
    T* od = out->mutable_data<T>(ctx.place());  // may be X itself (in place): same index only
    F f;
    // out[idx] = x[idx] op y[(idx / post) % n], in pieces of the flat index.
    ForEachRun(m, [&](int64_t idx, int64_t len, int64_t j, int64_t j_step) {
      if (j_step == 0) {
        const T yv = yd[j];
        for (int64_t k = 0; k < len; ++k) od[idx + k] = f(xd[idx + k], yv);
      } else {
        for (int64_t k = 0; k < len; ++k) od[idx + k] = f(xd[idx + k], yd[j + k]);
      }
    });
  }

 private:
  int axis_;
};

template <typename T, typename G>
class ElementwiseGradKernel : public OpKernel {
 public:
  explicit ElementwiseGradKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    const Tensor& dout = ctx.Input("Out@GRAD");
    const BroadcastMid m = GetMid(x.dims(), y.dims(), axis_);
    const T* xd = x.data<T>();
    const T* yd = y.data<T>();
    const T* gd = dout.data<T>();
    if (Tensor* dx = ctx.OutputOrNull("X@GRAD")) {
      T* dxd = dx->mutable_data<T>(ctx.place());
      if constexpr (G::kDxIsDout) {
        // dx = dout
        CopyIfDistinct(gd, dxd, dout.numel());
      } else {
        // dx[i, j, k] = DX(dout[i, j, k], x[i, j, k], y[j])
        ForEachRun(m, [&](int64_t idx, int64_t len, int64_t j, int64_t j_step) {
          if (j_step == 0) {
            const T yv = yd[j];
            for (int64_t k = 0; k < len; ++k)
              dxd[idx + k] = G::DX(gd[idx + k], xd[idx + k], yv);
          } else {
            for (int64_t k = 0; k < len; ++k)
              dxd[idx + k] = G::DX(gd[idx + k], xd[idx + k], yd[j + k]);
          }
        });
      }
    }
    if (Tensor* dy = ctx.OutputOrNull("Y@GRAD")) {
      // dy[j] = sum_{i, k} DY(dout[i, j, k], x[i, j, k], y[j])
      T* dyd = dy->mutable_data<T>(ctx.place());
      // Pieces of Y's n entries; each entry sums over i in order, as on one thread.
      const int64_t grain = std::max<int64_t>(
          1, cpu_threads::kElementwiseGrain / std::max<int64_t>(1, m.pre * m.post));
      cpu_threads::ParallelForRange(m.n, grain, [&](int64_t j0, int64_t j1) {
        std::fill(dyd + j0, dyd + j1, T(0));
        if (m.post == 1) {
          // Column sums over contiguous rows (the bias-add gradient).
          for (int64_t i = 0; i < m.pre; ++i) {
            const T* gr = gd + i * m.n;
            const T* xr = xd + i * m.n;
            for (int64_t j = j0; j < j1; ++j) dyd[j] += G::DY(gr[j], xr[j], yd[j]);
          }
        } else {
          for (int64_t i = 0; i < m.pre; ++i) {
            for (int64_t j = j0; j < j1; ++j) {
              const T yv = yd[j];
              const int64_t base = (i * m.n + j) * m.post;
              T acc = T(0);
              for (int64_t k = 0; k < m.post; ++k) acc += G::DY(gd[base + k], xd[base + k], yv);
              dyd[j] += acc;
            }
          }
        }
      });
    }
  }

 private:
  int axis_;
};

template <typename T>
using ElementwiseAddKernel = ElementwiseKernel<T, AddFunctor>;
template <typename T>
using ElementwiseSubKernel = ElementwiseKernel<T, SubFunctor>;
template <typename T>
using ElementwiseMulKernel = ElementwiseKernel<T, MulFunctor>;
template <typename T>
using ElementwiseDivKernel = ElementwiseKernel<T, DivFunctor>;
template <typename T>
using ElementwiseAddGradKernel = ElementwiseGradKernel<T, AddGradFunctor>;
template <typename T>
using ElementwiseSubGradKernel = ElementwiseGradKernel<T, SubGradFunctor>;
template <typename T>
using ElementwiseMulGradKernel = ElementwiseGradKernel<T, MulGradFunctor>;
template <typename T>
using ElementwiseDivGradKernel = ElementwiseGradKernel<T, DivGradFunctor>;

// -------------------------------------------------------------------------------------- sum

// X = [A [N, D], B [N, D], C [N, D]] -> Out [N, D] = A + B + C.
void SumShape(InferShapeContext& ctx) {
  const int n = ctx.NumInputs("X");
  KEEL_SHAPE_CHECK(n >= 1, "X must list at least one variable");
  const DDim first = ctx.GetInputDim("X", 0);
  const DType dtype = ctx.GetInputDType("X", 0);
  DDim out = first;
  for (int i = 1; i < n; ++i) {
    const DDim d = ctx.GetInputDim("X", i);
    KEEL_SHAPE_CHECK(ctx.DimsEq(first, d), "X[", i, "] (", ctx.InputName("X", i), ") has shape ", d,
                     " but X[0] (", ctx.InputName("X", 0), ") has ", first);
    KEEL_SHAPE_CHECK(ctx.GetInputDType("X", i) == dtype, "X[", i, "] is ",
                     DTypeName(ctx.GetInputDType("X", i)), " but X[0] is ", DTypeName(dtype));
    for (int k = 0; k < out.size(); ++k)
      if (out[k] < 0) out[k] = d[k];  // a known dim wins over an unknown one
  }
  ctx.SetOutputDim("Out", out);
  ctx.SetOutputDType("Out", dtype);
}

template <typename T>
class SumKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const int n = ctx.NumInputs("X");
    Tensor* out = ctx.Output("Out");
    const int64_t numel = out->numel();
    T* od = out->mutable_data<T>(ctx.place());
    // Out may be one of the inputs (in-place accumulation, possibly listed more than once): count
    // those, scale Out by the count, then add the others, so no input is read after being written.
    int aliased = 0;
    for (int i = 0; i < n; ++i) aliased += ctx.Input("X", i).data<T>() == od;
    int first = 0;
    if (aliased == 0) {
      // out = x0 + x1 (or x0 alone), then the rest are added.
      const T* a = ctx.Input("X", 0).data<T>();
      if (n >= 2) {
        const T* b = ctx.Input("X", 1).data<T>();
        cpu_threads::ParallelForRange(numel, cpu_threads::kElementwiseGrain,
                                      [&](int64_t lo, int64_t hi) {
                                        for (int64_t k = lo; k < hi; ++k) od[k] = a[k] + b[k];
                                      });
        first = 2;
      } else {
        CopyIfDistinct(a, od, numel);
        first = 1;
      }
    } else if (aliased > 1) {
      const T c = static_cast<T>(aliased);
      for (int64_t k = 0; k < numel; ++k) od[k] *= c;
    }
    for (int i = first; i < n; ++i) {
      const T* xi = ctx.Input("X", i).data<T>();
      if (xi == od) continue;
      // out += x_i
      cpu_threads::ParallelForRange(numel, cpu_threads::kElementwiseGrain,
                                    [&](int64_t lo, int64_t hi) {
                                      for (int64_t k = lo; k < hi; ++k) od[k] += xi[k];
                                    });
    }
  }
};

template <typename T>
class SumGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& dout = ctx.Input("Out@GRAD");
    const T* gd = dout.data<T>();
    const int n = static_cast<int>(ctx.op().Output("X@GRAD").size());
    for (int i = 0; i < n; ++i) {
      // dx_i = dout
      if (Tensor* dx = ctx.OutputOrNull("X@GRAD", i))
        CopyIfDistinct(gd, dx->mutable_data<T>(ctx.place()), dout.numel());
    }
  }
};

// ------------------------------------------------------------------------------------ scale

template <typename T>
class ScaleKernel : public OpKernel {
 public:
  explicit ScaleKernel(const OpDesc& op)
      : scale_(static_cast<T>(op.Attr<float>("scale"))),
        bias_(static_cast<T>(op.Attr<float>("bias"))),
        bias_after_scale_(op.Attr<bool>("bias_after_scale")) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    Tensor* out = ctx.Output("Out");
    const int64_t n = x.numel();
    const T* xd = x.data<T>();
    T* od = out->mutable_data<T>(ctx.place());  // may be X itself
    // out = scale * x + bias, or scale * (x + bias) when !bias_after_scale
    const fn::ScaleShift<T> f{scale_, bias_after_scale_ ? bias_ : scale_ * bias_};
    for (int64_t i = 0; i < n; ++i) od[i] = f(xd[i]);
  }

 private:
  T scale_, bias_;
  bool bias_after_scale_;
};

template <typename T>
class ScaleGradKernel : public OpKernel {
 public:
  explicit ScaleGradKernel(const OpDesc& op) : scale_(static_cast<T>(op.Attr<float>("scale"))) {}

  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull("X@GRAD");
    if (dx == nullptr) return;
    const Tensor& dout = ctx.Input("Out@GRAD");
    const int64_t n = dout.numel();
    const T* gd = dout.data<T>();
    T* dxd = dx->mutable_data<T>(ctx.place());
    // dx = scale * dout
    for (int64_t i = 0; i < n; ++i) dxd[i] = scale_ * gd[i];
  }

 private:
  T scale_;
};

}  // namespace

// ----------------------------------------------------------------------------- registration

KEEL_REGISTER_OP(mul)
    .Doc(
        "Out = flatten(X) * flatten(Y). X [2, 3, 4] with x_num_col_dims 2 is 6 x 4; times "
        "Y [4, 5] gives Out [2, 3, 5] = X.dims[:x_num_col_dims] ++ Y.dims[y_num_col_dims:]")
    .Input("X", "left operand, flattened to 2-D at x_num_col_dims")
    .Input("Y", "right operand, flattened to 2-D at y_num_col_dims")
    .Output("Out", "the product")
    .Attr<int>("x_num_col_dims", 1, "leading dims of X that become rows", AtLeastOne())
    .Attr<int>("y_num_col_dims", 1, "leading dims of Y that become rows", AtLeastOne())
    .Shape(MulShape)
    .DefaultGrad();
KEEL_REGISTER_GRAD_OP(mul_grad, mul);
KEEL_REGISTER_CPU_KERNEL(mul, MulKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(mul_grad, MulGradKernel, float, double);

KEEL_REGISTER_OP(matmul)
    .Doc(
        "Out = alpha * op(X) * op(Y) over the last two dims. X [B, M, K] * Y [B, K, N] = "
        "Out [B, M, N]; a 2-D operand is broadcast over the other's batch")
    .Input("X", "left operand, rank >= 2")
    .Input("Y", "right operand, rank >= 2")
    .Output("Out", "the product")
    .Attr<bool>("transpose_X", false, "transpose X's last two dims first")
    .Attr<bool>("transpose_Y", false, "transpose Y's last two dims first")
    .Attr<float>("alpha", 1.0f, "scale of the product")
    .Shape(MatMulShape)
    .DefaultGrad();
KEEL_REGISTER_GRAD_OP(matmul_grad, matmul);
KEEL_REGISTER_CPU_KERNEL(matmul, MatMulKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(matmul_grad, MatMulGradKernel, float, double);

#define KEEL_REGISTER_ELEMENTWISE_OP(name, Kernel, GradKernel, formula)                       \
  KEEL_REGISTER_OP(name)                                                                      \
      .Doc("Out = " formula                                                                   \
           ", Y broadcast into X at axis: X [N, C, H, W], Y [C], axis 1 -> "                  \
           "Out [N, C, H, W]")                                                                \
      .Input("X", "the left operand; Out has its shape")                                      \
      .Input("Y", "the right operand; its dims (trailing 1s dropped) equal X's from axis on") \
      .Output("Out", "the result, shaped like X")                                             \
      .Attr<int>("axis", -1, "X's dim where Y's first dim lands; -1: rank(X) - rank(Y)")      \
      .Shape(ElementwiseShape)                                                                \
      .DefaultGrad();                                                                         \
  KEEL_REGISTER_GRAD_OP(name##_grad, name);                                                   \
  KEEL_REGISTER_CPU_KERNEL(name, Kernel, float, double);                                      \
  KEEL_REGISTER_CPU_KERNEL(name##_grad, GradKernel, float, double)

KEEL_REGISTER_ELEMENTWISE_OP(elementwise_add, ElementwiseAddKernel, ElementwiseAddGradKernel,
                             "X + Y");
KEEL_REGISTER_ELEMENTWISE_OP(elementwise_sub, ElementwiseSubKernel, ElementwiseSubGradKernel,
                             "X - Y");
KEEL_REGISTER_ELEMENTWISE_OP(elementwise_mul, ElementwiseMulKernel, ElementwiseMulGradKernel,
                             "X * Y");
KEEL_REGISTER_ELEMENTWISE_OP(elementwise_div, ElementwiseDivKernel, ElementwiseDivGradKernel,
                             "X / Y");
#undef KEEL_REGISTER_ELEMENTWISE_OP

KEEL_REGISTER_OP(sum)
    .Doc(
        "Out = X[0] + X[1] + ...; all of one shape and dtype. Out may be X[0] (accumulation in "
        "place)")
    .InputList("X", "the addends")
    .Output("Out", "their sum")
    .Shape(SumShape)
    .DefaultGrad();
KEEL_REGISTER_GRAD_OP(sum_grad, sum);
KEEL_REGISTER_CPU_KERNEL(sum, SumKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(sum_grad, SumGradKernel, float, double);

KEEL_REGISTER_OP(scale)
    .Doc(
        "Out = scale * X + bias, or scale * (X + bias) when bias_after_scale is false; Out has "
        "X's shape")
    .Input("X", "the input")
    .Output("Out", "the scaled input")
    .Attr<float>("scale", 1.0f, "the factor")
    .Attr<float>("bias", 0.0f, "the offset")
    .Attr<bool>("bias_after_scale", true, "add bias after scaling (else before)")
    .Shape(SameShapeAsX)
    .DefaultGrad();
KEEL_REGISTER_GRAD_OP(scale_grad, scale);
KEEL_REGISTER_CPU_KERNEL(scale, ScaleKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(scale_grad, ScaleGradKernel, float, double);

}  // namespace keel
