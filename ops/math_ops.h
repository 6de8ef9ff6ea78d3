// The kernels of the math ops (math_ops.cc has the ops and their shapes): mul, matmul,
// elementwise_{add, sub, mul, div}, sum, scale, each with its grad, once for every device
// (ops/device.h). The GEMMs are Device<D>::Gemm (oneDNN's sgemm on the CPU, cuBLAS on CUDA); the
// element-wise formulas are ops/functors/. The 16-bit types (mixed precision) compute in Acc<T>:
// float32 GEMM accumulation, element-wise math on widened values, float32 sums.
//
// Legend: M, K, N = rows of the left operand, the contracted dim, columns of the right operand.
// Elementwise broadcast views X as (pre, n, post) and Y as (n): Out[i, j, k] = X[i, j, k] op Y[j].
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/half_convert.h"
#include "ops/axis_layout.h"
#include "ops/device.h"
#include "ops/functors/activation_functors.h"
#include "ops/functors/elementwise_functors.h"
#include "ops/matmul_plan.h"
#include "ops/row_sparse_sum.h"

namespace keel {

// ---------------------------------------------------------------- mul

// The mul GEMMs, also fused_gemm_epilogue's (fused_gemm_ops.h). X is M x K at x_num_col_dims
// `xk`, Y is K x N at y_num_col_dims `yk`.
// out = x * y. out: M x N, x: M x K, y: K x N
template <typename D, typename T>
void MulGemm(const ExecutionContext& ctx, const Tensor& x, const Tensor& y, int xk, int yk,
             Tensor* out) {
  const int64_t M = x.dims().prod(0, xk), K = x.dims().prod(xk, x.dims().size());
  const int64_t N = y.dims().prod(yk, y.dims().size());
  Device<D>::Gemm(ctx, false, false, M, N, K, Acc<T>(1), x.data<T>(), 0, y.data<T>(), 0, Acc<T>(0),
                  out->mutable_data<T>(ctx.place()), 0);
}

// dx = dout * y' and dy = x' * dout, each only where asked for (non-null). dy is output Y@GRAD,
// which mul_grad and fused_gemm_epilogue_grad narrow (GemmInto): a weight's gradient that a pass
// made 16-bit is stored rounded from the float32 GEMM.
template <typename D, typename T>
void MulGradGemms(const ExecutionContext& ctx, const Tensor& x, const Tensor& y, const Tensor& dout,
                  int xk, int yk, Tensor* dx, Tensor* dy) {
  const int64_t M = x.dims().prod(0, xk), K = x.dims().prod(xk, x.dims().size());
  const int64_t N = y.dims().prod(yk, y.dims().size());
  const Acc<T> one(1), zero(0);
  // dx = dout * y'. dx: M x K, dout: M x N, y: K x N
  if (dx)
    Device<D>::Gemm(ctx, false, true, M, K, N, one, dout.data<T>(), 0, y.data<T>(), 0, zero,
                    dx->mutable_data<T>(ctx.place()), 0);
  // dy = x' * dout. dy: K x N, x: M x K, dout: M x N
  if (dy)
    GemmInto<D, T>(ctx, GradVarName("Y"), dy, true, false, K, N, M, one, x.data<T>(),
                   dout.data<T>());
}

template <typename D, typename T>
class MulKernel : public OpKernel {
 public:
  explicit MulKernel(const OpDesc& op)
      : xk_(op.Attr<int>("x_num_col_dims")), yk_(op.Attr<int>("y_num_col_dims")) {}
  void Compute(ExecutionContext& ctx) override {
    MulGemm<D, T>(ctx, ctx.Input("X"), ctx.Input("Y"), xk_, yk_, ctx.Output("Out"));
  }

 private:
  int xk_, yk_;
};

template <typename D, typename T>
class MulGradKernel : public OpKernel {
 public:
  explicit MulGradKernel(const OpDesc& op)
      : xk_(op.Attr<int>("x_num_col_dims")), yk_(op.Attr<int>("y_num_col_dims")) {}
  void Compute(ExecutionContext& ctx) override {
    MulGradGemms<D, T>(ctx, ctx.Input("X"), ctx.Input("Y"), ctx.Input(GradVarName("Out")), xk_, yk_,
                       GradOutput(ctx, "X"), GradOutput(ctx, "Y"));
  }

 private:
  int xk_, yk_;
};

// ---------------------------------------------------------------- matmul

template <typename D, typename T>
class MatMulKernel : public OpKernel {
 public:
  explicit MatMulKernel(const OpDesc& op)
      : tx_(op.Attr<bool>("transpose_X")),
        ty_(op.Attr<bool>("transpose_Y")),
        alpha_(static_cast<Acc<T>>(op.Attr<float>("alpha"))) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    const MatMulPlan p = PlanMatMul(x.dims(), y.dims(), tx_, ty_);
    // out_b = alpha * op(x_b) * op(y_b). out_b: M x N, op(x_b): M x K, op(y_b): K x N
    Device<D>::Gemm(ctx, tx_, ty_, p.M, p.N, p.K, alpha_, x.data<T>(), p.x_stride, y.data<T>(),
                    p.y_stride, Acc<T>(0), ctx.Output("Out")->mutable_data<T>(ctx.place()),
                    p.M * p.N, p.batch);
  }

 private:
  bool tx_, ty_;
  Acc<T> alpha_;
};

template <typename D, typename T>
class MatMulGradKernel : public OpKernel {
 public:
  explicit MatMulGradKernel(const OpDesc& op)
      : tx_(op.Attr<bool>("transpose_X")),
        ty_(op.Attr<bool>("transpose_Y")),
        alpha_(static_cast<Acc<T>>(op.Attr<float>("alpha"))) {}
  void Compute(ExecutionContext& ctx) override {
    using A = Acc<T>;
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    const MatMulPlan p = PlanMatMul(x.dims(), y.dims(), tx_, ty_);
    const int64_t M = p.M, K = p.K, N = p.N, MN = M * N;
    const T* xd = x.data<T>();
    const T* yd = y.data<T>();
    const T* gd = dout.data<T>();
    const bool tx = tx_, ty = ty_;
    const A alpha = alpha_;
    // dxb / dyb: T*, or float* where a 16-bit gradient sums over the batch (OverBatch).
    if (Tensor* dx = GradOutput(ctx, "X")) {
      T* dxd = dx->mutable_data<T>(ctx.place());
      if (p.batch == 0) Device<D>::Zero(ctx, dxd, dx->numel());  // a broadcast X got no grad
      auto run = [&](const T* yb, int64_t sy, const T* gb, A beta, auto* dxb, int64_t sdx,
                     int64_t batch) {
        if (!tx && !ty)  // dx = dout * y'. dx: M x K, dout: M x N, y: K x N
          Device<D>::Gemm(ctx, false, true, M, K, N, alpha, gb, MN, yb, sy, beta, dxb, sdx, batch);
        else if (!tx && ty)  // dx = dout * y. dx: M x K, dout: M x N, y: N x K
          Device<D>::Gemm(ctx, false, false, M, K, N, alpha, gb, MN, yb, sy, beta, dxb, sdx, batch);
        else if (tx && !ty)  // dx = y * dout'. dx: K x M, y: K x N, dout: M x N
          Device<D>::Gemm(ctx, false, true, K, M, N, alpha, yb, sy, gb, MN, beta, dxb, sdx, batch);
        else  // dx = y' * dout'. dx: K x M, y: N x K, dout: M x N
          Device<D>::Gemm(ctx, true, true, K, M, N, alpha, yb, sy, gb, MN, beta, dxb, sdx, batch);
      };
      OverBatch(ctx, p.batch, p.x_stride, yd, p.y_stride, gd, MN, dxd, dx->numel(), run);
    }
    if (Tensor* dy = GradOutput(ctx, "Y")) {
      T* dyd = dy->mutable_data<T>(ctx.place());
      if (p.batch == 0) Device<D>::Zero(ctx, dyd, dy->numel());  // a broadcast Y got no grad
      auto run = [&](const T* xb, int64_t sx, const T* gb, A beta, auto* dyb, int64_t sdy,
                     int64_t batch) {
        if (!tx && !ty)  // dy = x' * dout. dy: K x N, x: M x K, dout: M x N
          Device<D>::Gemm(ctx, true, false, K, N, M, alpha, xb, sx, gb, MN, beta, dyb, sdy, batch);
        else if (tx && !ty)  // dy = x * dout. dy: K x N, x: K x M, dout: M x N
          Device<D>::Gemm(ctx, false, false, K, N, M, alpha, xb, sx, gb, MN, beta, dyb, sdy, batch);
        else if (!tx && ty)  // dy = dout' * x. dy: N x K, dout: M x N, x: M x K
          Device<D>::Gemm(ctx, true, false, N, K, M, alpha, gb, MN, xb, sx, beta, dyb, sdy, batch);
        else  // dy = dout' * x'. dy: N x K, dout: M x N, x: K x M
          Device<D>::Gemm(ctx, true, true, N, K, M, alpha, gb, MN, xb, sx, beta, dyb, sdy, batch);
      };
      OverBatch(ctx, p.batch, p.y_stride, xd, p.x_stride, gd, MN, dyd, dy->numel(), run);
    }
  }

  // grad = sum rounded to T. (Public and not a template of OverBatch's lambda: where nvcc allows
  // a device lambda.)
  void NarrowSum(const ExecutionContext& ctx, const Acc<T>* sum, T* grad, int64_t numel) {
    Device<D>::ForEach(ctx, numel, [=] KEEL_HD_LAMBDA(int64_t i) { grad[i] = Narrow<T>(sum[i]); });
  }

 private:
  // One operand's gradient `grad` (batch stride `stride`, `numel` elements) from the other operand
  // (`other`, its stride `other_stride`) and dout (stride MN), by run(other_b, other_stride,
  // dout_b, beta, grad_b, grad_stride, batch): one strided batch of GEMMs, or, for an operand
  // shared over the batch (stride 0), one GEMM per batch entry summing its gradient (beta 1 after
  // the first); the 16-bit types sum in float32 (sum_) and round once.
  template <typename Run>
  void OverBatch(const ExecutionContext& ctx, int64_t batch, int64_t stride, const T* other,
                 int64_t other_stride, const T* gd, int64_t MN, T* grad, int64_t numel,
                 const Run& run) {
    using A = Acc<T>;
    if (stride != 0 || batch <= 1) {
      run(other, other_stride, gd, A(0), grad, stride, batch);
      return;
    }
    if constexpr (kIsHalf<T>) {
      sum_.Resize(DDim{numel});
      A* sum = sum_.mutable_data<A>(ctx.place());
      for (int64_t b = 0; b < batch; ++b)
        run(other + b * other_stride, 0, gd + b * MN, b > 0 ? A(1) : A(0), sum, 0, 1);
      NarrowSum(ctx, sum, grad, numel);
    } else {
      for (int64_t b = 0; b < batch; ++b)
        run(other + b * other_stride, 0, gd + b * MN, b > 0 ? A(1) : A(0), grad, 0, 1);
    }
  }

  bool tx_, ty_;
  Acc<T> alpha_;
  Tensor sum_;  // the 16-bit types' float32 sum over the batch
};

// ---------------------------------------------------------------- elementwise

// out[i] = F(x[i], y[YIndex(i)]); out may be X itself (in place: same index only). GetMid
// (ops/axis_layout.h) checks the axis.
template <typename D, typename T, typename F>
class ElementwiseKernel : public OpKernel {
 public:
  explicit ElementwiseKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    const fn::BroadcastMid m = GetMid(x.dims(), y.dims(), axis_);
    const T* xd = x.data<T>();
    const T* yd = y.data<T>();
    T* od = ctx.Output("Out")->mutable_data<T>(ctx.place());
    const F f;
    Device<D>::ForEachBroadcast(ctx, m, [=] KEEL_HD_LAMBDA(int64_t i, int64_t j) {
      od[i] = Narrow<T>(f(Widen(xd[i]), Widen(yd[j])));
    });
  }

 private:
  int axis_;
};

// dx[i, j, k] = DX(dout[i, j, k], x[i, j, k], y[j]) (dout itself when G says so);
// dy[j] = sum_{i, k} DY(dout[i, j, k], x[i, j, k], y[j]), summed in Acc<T>.
template <typename D, typename T, typename G>
class ElementwiseGradKernel : public OpKernel {
 public:
  explicit ElementwiseGradKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    const fn::BroadcastMid m = GetMid(x.dims(), y.dims(), axis_);
    const T* xd = x.data<T>();
    const T* yd = y.data<T>();
    const T* gd = dout.data<T>();
    if (Tensor* dx = GradOutput(ctx, "X")) {
      if constexpr (G::kDxIsDout) {
        if (!ShareInput(ctx, GradVarName("X"), dout, dx))
          Device<D>::Copy(ctx, gd, dx->mutable_data<T>(ctx.place()), dout.numel());
      } else {
        T* dxd = dx->mutable_data<T>(ctx.place());
        Device<D>::ForEachBroadcast(ctx, m, [=] KEEL_HD_LAMBDA(int64_t i, int64_t j) {
          dxd[i] = Narrow<T>(G::DX(Widen(gd[i]), Widen(xd[i]), Widen(yd[j])));
        });
      }
    }
    if (Tensor* dy = GradOutput(ctx, "Y")) {
      // Y of dOut's size (ShareInput checks it): each sum would have one term, dOut's own value;
      // not when dY is narrowed (elementwise_add_grad's bias gradient a pass made 16-bit).
      const std::string slot = GradVarName("Y");
      if constexpr (G::kDyIsDout)
        if (StoredDType<T>(ctx, slot) == DTypeOf<T>::value && ShareInput(ctx, slot, dout, dy))
          return;
      SumBroadcastInto<D, T>(ctx, slot, dy, m, [=] KEEL_HD_LAMBDA(int64_t i, int64_t j) -> Acc<T> {
        return G::DY(Widen(gd[i]), Widen(xd[i]), Widen(yd[j]));
      });
    }
  }

 private:
  int axis_;
};

template <typename D, typename T>
using ElementwiseAddKernel = ElementwiseKernel<D, T, fn::Add>;
template <typename D, typename T>
using ElementwiseSubKernel = ElementwiseKernel<D, T, fn::Sub>;
template <typename D, typename T>
using ElementwiseMulKernel = ElementwiseKernel<D, T, fn::Mul>;
template <typename D, typename T>
using ElementwiseDivKernel = ElementwiseKernel<D, T, fn::Div>;
template <typename D, typename T>
using ElementwiseAddGradKernel = ElementwiseGradKernel<D, T, fn::AddGrad>;
template <typename D, typename T>
using ElementwiseSubGradKernel = ElementwiseGradKernel<D, T, fn::SubGrad>;
template <typename D, typename T>
using ElementwiseMulGradKernel = ElementwiseGradKernel<D, T, fn::MulGrad>;
template <typename D, typename T>
using ElementwiseDivGradKernel = ElementwiseGradKernel<D, T, fn::DivGrad>;

// ---------------------------------------------------------------- sum

// out = sum_i x_i. Out may be one of the inputs (in-place accumulation, possibly listed more than
// once): those count as Out's old value, so Out is scaled by their count first and the others
// are added; no input is read after being written. Without one, out = x0 + x1 in one pass.
// The 16-bit types sum every input in float32 in one pass and round once (SumHalf).
// With row_sparse (gradients of is_sparse embeddings sharing a table): Out's rows are the union
// of the inputs' rows, each summed over the inputs holding it, in input order (the CPU only).
template <typename D, typename T>
class SumKernel : public OpKernel {
 public:
  explicit SumKernel(const OpDesc& op) : row_sparse_(op.Attr<bool>("row_sparse")) {}
  void Compute(ExecutionContext& ctx) override {
    if (row_sparse_) return SumRows(ctx);
    const int n = ctx.NumInputs("X");
    Tensor* out = ctx.Output("Out");
    const int64_t numel = out->numel();
    T* od = out->mutable_data<T>(ctx.place());
    int aliased = 0;
    for (int i = 0; i < n; ++i) aliased += ctx.Input("X", i).data<T>() == od;
    if constexpr (kIsHalf<T>) {
      SumHalf(ctx, n, aliased, numel, od);
    } else {
      Sum(ctx, n, aliased, numel, od);
    }
  }

  // (Public, as SumHalf: nvcc refuses device lambdas in private member functions.)
  void Sum(const ExecutionContext& ctx, int n, int aliased, int64_t numel, T* od) {
    const int64_t grain = cpu_threads::kElementwiseGrain;
    int first = 0;
    if (aliased == 0) {
      const T* a = ctx.Input("X", 0).data<T>();
      if (n >= 2) {
        const T* b = ctx.Input("X", 1).data<T>();
        Device<D>::ForEachInPieces(ctx, numel, grain,
                                   [=] KEEL_HD_LAMBDA(int64_t k) { od[k] = a[k] + b[k]; });
        first = 2;
      } else {
        Device<D>::Copy(ctx, a, od, numel);
        first = 1;
      }
    } else if (aliased > 1) {
      const T c = static_cast<T>(aliased);
      Device<D>::ForEach(ctx, numel, [=] KEEL_HD_LAMBDA(int64_t k) { od[k] *= c; });
    }
    for (int i = first; i < n; ++i) {
      const T* xi = ctx.Input("X", i).data<T>();
      if (xi == od) continue;
      Device<D>::ForEachInPieces(ctx, numel, grain,
                                 [=] KEEL_HD_LAMBDA(int64_t k) { od[k] += xi[k]; });
    }
  }

  // out[k] = aliased * out[k] + the sum of the other inputs' x[k], in float32 in input order
  // starting from the first term (as float32's x0 + x1 + ...: signed zeros kept), rounded once. The
  // inputs' addresses are a table device code reads (Device<D>::Upload).
  void SumHalf(const ExecutionContext& ctx, int n, int aliased, int64_t numel, T* od) {
    ptrs_.clear();
    for (int i = 0; i < n; ++i) {
      const T* xi = ctx.Input("X", i).data<T>();
      if (xi != od) ptrs_.push_back(xi);
    }
    const int m = static_cast<int>(ptrs_.size());
    const T* const* table = static_cast<const T* const*>(
        Device<D>::Upload(ctx, ptrs_.data(), ptrs_.size() * sizeof(const T*), &table_));
    const float self = static_cast<float>(aliased);
    if constexpr (std::is_same_v<D, CPUDevice>) {
      // Two terms (x0 + x1, or Out += x): one pass of AddN, each sum rounded once as below, in
      // vector registers throughout: in
      // ResNet-20's residual gradients the chunked loop below took longer than float32's sum.
      const T* add_a = m == 2 && self == 0.0f ? ptrs_[0] : m == 1 && self == 1.0f ? od : nullptr;
      if (add_a != nullptr) {
        const T* add_b = m == 2 ? ptrs_[1] : ptrs_[0];
        cpu_threads::ParallelForRange(
            numel, cpu_threads::kElementwiseGrain,
            [&](int64_t b, int64_t e) { AddN(add_a + b, add_b + b, od + b, e - b); });
        return;
      }
      // The same float32 additions in the same order, a chunk of each input at a time (vector
      // loops instead of a table walk per element).
      cpu_threads::ParallelForRange(numel, cpu_threads::kElementwiseGrain,
                                    [&](int64_t b, int64_t e) {
                                      constexpr int64_t kChunk = 1024;
                                      alignas(64) float acc[kChunk], xb[kChunk];
                                      for (int64_t i = b; i < e; i += kChunk) {
                                        const int64_t len = std::min(kChunk, e - i);
                                        if (self != 0.0f) {
                                          WidenN(od + i, acc, len);
                                          for (int64_t j = 0; j < len; ++j) acc[j] *= self;
                                        } else {
                                          WidenN(ptrs_[0] + i, acc, len);
                                        }
                                        for (int t = self != 0.0f ? 0 : 1; t < m; ++t) {
                                          WidenN(ptrs_[t] + i, xb, len);
                                          for (int64_t j = 0; j < len; ++j) acc[j] += xb[j];
                                        }
                                        NarrowN(acc, od + i, len);
                                      }
                                    });
      return;
    }
    Device<D>::ForEachInPieces(
        ctx, numel, cpu_threads::kElementwiseGrain, [=] KEEL_HD_LAMBDA(int64_t k) {
          float acc = self != 0.0f ? self * Widen(od[k]) : Widen(table[0][k]);
          for (int t = self != 0.0f ? 0 : 1; t < m; ++t) acc += Widen(table[t][k]);
          od[k] = Narrow<T>(acc);
        });
  }

 private:
  std::vector<const T*> ptrs_;  // SumHalf's inputs
  Tensor table_;                // their device copy (CUDA)

 private:
  void SumRows(ExecutionContext& ctx) {
    KEEL_ENFORCE(ctx.place().is_cpu(), "sum: row-sparse addends on ", ctx.place().str(),
                 " (is_sparse embeddings train on the CPU only)");
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      SumRowSparseInputs<T>(ctx, T(1));
    } else {
      KEEL_THROW("sum: row-sparse addends of ", DTypeName(ctx.Input("X", 0).dtype()),
                 " (float32 and float64 only)");
    }
  }

  bool row_sparse_;
};

// dx_i = dout.
template <typename D, typename T>
class SumGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    const int n = static_cast<int>(ctx.op().Output(GradVarName("X")).size());
    for (int i = 0; i < n; ++i)
      if (Tensor* dx = GradOutput(ctx, "X", i))
        Device<D>::Copy(ctx, dout.data<T>(), dx->mutable_data<T>(ctx.place()), dout.numel());
  }
};

// ---------------------------------------------------------------- scale

// out = scale * x + bias, or scale * (x + bias) when !bias_after_scale; out may be X itself.
template <typename D, typename T>
class ScaleKernel : public OpKernel {
 public:
  explicit ScaleKernel(const OpDesc& op) {
    const Acc<T> scale = static_cast<Acc<T>>(op.Attr<float>("scale"));
    const Acc<T> bias = static_cast<Acc<T>>(op.Attr<float>("bias"));
    f_ = fn::ScaleShift<Acc<T>>{scale, op.Attr<bool>("bias_after_scale") ? bias : scale * bias};
  }
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const T* xd = x.data<T>();
    T* od = ctx.Output("Out")->mutable_data<T>(ctx.place());
    const fn::ScaleShift<Acc<T>> f = f_;
    Device<D>::ForEach(ctx, x.numel(),
                       [=] KEEL_HD_LAMBDA(int64_t i) { od[i] = Narrow<T>(f(Widen(xd[i]))); });
  }

 private:
  fn::ScaleShift<Acc<T>> f_;
};

// dx = scale * dout.
template <typename D, typename T>
class ScaleGradKernel : public OpKernel {
 public:
  explicit ScaleGradKernel(const OpDesc& op)
      : scale_(static_cast<Acc<T>>(op.Attr<float>("scale"))) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "X");
    if (dx == nullptr) return;
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    const T* gd = dout.data<T>();
    T* dxd = dx->mutable_data<T>(ctx.place());
    const Acc<T> s = scale_;
    Device<D>::ForEach(ctx, dout.numel(),
                       [=] KEEL_HD_LAMBDA(int64_t i) { dxd[i] = Narrow<T>(s * Widen(gd[i])); });
  }

 private:
  Acc<T> scale_;
};

}  // namespace keel
