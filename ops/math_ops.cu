// CUDA twins of math_ops.cc: mul and matmul through cuBLAS (row-major GEMMs mapped onto its
// column-major calls; TF32 only with FLAGS_allow_tf32), elementwise ops with Paddle's axis
// broadcasting through the shared functors, sum and scale.
#include <climits>
#include <type_traits>

#include "ops/cuda_util.cuh"
#include "ops/functors/activation_functors.h"
#include "ops/functors/elementwise_functors.h"
#include "ops/matmul_plan.h"

namespace keel {
namespace {

// C_b = alpha * op(A_b) * op(B_b) + beta * C_b for b < batch, all row-major: C_b M x N,
// op(A_b) M x K, op(B_b) K x N; operand b starts b * stride elements in (stride 0: shared).
// Column-major cuBLAS computes C' = op(B)' op(A)', so the operands swap.
template <typename T>
void Gemm(const ExecutionContext& ctx, bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha,
          const T* A, int64_t sa, const T* B, int64_t sb, T beta, T* C, int64_t sc,
          int64_t batch = 1) {
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) {  // C = beta * C; cuBLAS would refuse the zero leading dimension of A or B
    KEEL_ENFORCE(beta == T(0) || beta == T(1), "Gemm with K == 0 and beta ", beta);
    if (beta == T(0)) {
      const int64_t blocks = sc == 0 ? 1 : batch;
      for (int64_t b = 0; b < blocks; ++b)
        KEEL_CUDA_CHECK(cudaMemsetAsync(C + b * sc, 0, M * N * sizeof(T), Cuda(ctx).stream()));
    }
    return;
  }
  KEEL_ENFORCE(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && batch <= INT_MAX,
               "GEMM of ", M, " x ", N, " x ", K, " (batch ", batch,
               ") exceeds cuBLAS's 32-bit sizes");
  cublasHandle_t h = Cuda(ctx).cublas();
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = static_cast<int>(ta ? M : K), ldb = static_cast<int>(tb ? K : N);
  if (std::is_same_v<T, float>) {
    KEEL_CUBLAS_CHECK(cublasSgemmStridedBatched(
        h, opb, opa, int(N), int(M), int(K), reinterpret_cast<const float*>(&alpha),
        reinterpret_cast<const float*>(B), ldb, sb, reinterpret_cast<const float*>(A), lda, sa,
        reinterpret_cast<const float*>(&beta), reinterpret_cast<float*>(C), int(N), sc,
        int(batch)));
  } else {
    KEEL_CUBLAS_CHECK(cublasDgemmStridedBatched(
        h, opb, opa, int(N), int(M), int(K), reinterpret_cast<const double*>(&alpha),
        reinterpret_cast<const double*>(B), ldb, sb, reinterpret_cast<const double*>(A), lda, sa,
        reinterpret_cast<const double*>(&beta), reinterpret_cast<double*>(C), int(N), sc,
        int(batch)));
  }
}

template <typename T>
void Zero(const ExecutionContext& ctx, T* p, int64_t n) {
  if (n > 0) KEEL_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(T), Cuda(ctx).stream()));
}

// ------------------------------------------------------------------------------------ mul

template <typename T>
class MulKernel : public OpKernel {
 public:
  explicit MulKernel(const OpDesc& op)
      : xk_(op.Attr<int>("x_num_col_dims")), yk_(op.Attr<int>("y_num_col_dims")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    const int64_t M = x.dims().prod(0, xk_), K = x.dims().prod(xk_, x.dims().size());
    const int64_t N = y.dims().prod(yk_, y.dims().size());
    // out = x * y. out: M x N, x: M x K, y: K x N
    Gemm<T>(ctx, false, false, M, N, K, T(1), x.data<T>(), 0, y.data<T>(), 0, T(0),
            ctx.Output("Out")->mutable_data<T>(ctx.place()), 0);
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
    // dx = dout * y'. dx: M x K, dout: M x N, y: K x N
    if (Tensor* dx = ctx.OutputOrNull("X@GRAD"))
      Gemm<T>(ctx, false, true, M, K, N, T(1), dout.data<T>(), 0, y.data<T>(), 0, T(0),
              dx->mutable_data<T>(ctx.place()), 0);
    // dy = x' * dout. dy: K x N, x: M x K, dout: M x N
    if (Tensor* dy = ctx.OutputOrNull("Y@GRAD"))
      Gemm<T>(ctx, true, false, K, N, M, T(1), x.data<T>(), 0, dout.data<T>(), 0, T(0),
              dy->mutable_data<T>(ctx.place()), 0);
  }

 private:
  int xk_, yk_;
};

// ---------------------------------------------------------------------------------- matmul

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
    const MatMulPlan p = PlanMatMul(x.dims(), y.dims(), tx_, ty_);
    // out_b = alpha * op(x_b) * op(y_b). out_b: M x N, op(x_b): M x K, op(y_b): K x N
    Gemm<T>(ctx, tx_, ty_, p.M, p.N, p.K, alpha_, x.data<T>(), p.x_stride, y.data<T>(), p.y_stride,
            T(0), ctx.Output("Out")->mutable_data<T>(ctx.place()), p.M * p.N, p.batch);
  }

 private:
  bool tx_, ty_;
  T alpha_;
};

// The same cases as the CPU kernel; an operand shared over the batch (stride 0) sums its
// gradient over the batch, one GEMM per batch accumulating (beta 1 after the first).
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
    const int64_t M = p.M, K = p.K, N = p.N, MN = M * N;
    const T* xd = x.data<T>();
    const T* yd = y.data<T>();
    const T* gd = dout.data<T>();
    if (Tensor* dx = ctx.OutputOrNull("X@GRAD")) {
      T* dxd = dx->mutable_data<T>(ctx.place());
      if (p.batch == 0) Zero(ctx, dxd, dx->numel());
      auto run = [&](const T* yb, int64_t sy, const T* gb, T beta, T* dxb, int64_t sdx,
                     int64_t batch) {
        if (!tx_ && !ty_)  // dx = dout * y'. dx: M x K, dout: M x N, y: K x N
          Gemm<T>(ctx, false, true, M, K, N, alpha_, gb, MN, yb, sy, beta, dxb, sdx, batch);
        else if (!tx_ && ty_)  // dx = dout * y. dx: M x K, dout: M x N, y: N x K
          Gemm<T>(ctx, false, false, M, K, N, alpha_, gb, MN, yb, sy, beta, dxb, sdx, batch);
        else if (tx_ && !ty_)  // dx = y * dout'. dx: K x M, y: K x N, dout: M x N
          Gemm<T>(ctx, false, true, K, M, N, alpha_, yb, sy, gb, MN, beta, dxb, sdx, batch);
        else  // dx = y' * dout'. dx: K x M, y: N x K, dout: M x N
          Gemm<T>(ctx, true, true, K, M, N, alpha_, yb, sy, gb, MN, beta, dxb, sdx, batch);
      };
      if (p.x_stride != 0 || p.batch <= 1) {
        run(yd, p.y_stride, gd, T(0), dxd, p.x_stride, p.batch);
      } else {
        for (int64_t b = 0; b < p.batch; ++b)
          run(yd + b * p.y_stride, 0, gd + b * MN, b > 0 ? T(1) : T(0), dxd, 0, 1);
      }
    }
    if (Tensor* dy = ctx.OutputOrNull("Y@GRAD")) {
      T* dyd = dy->mutable_data<T>(ctx.place());
      if (p.batch == 0) Zero(ctx, dyd, dy->numel());
      auto run = [&](const T* xb, int64_t sx, const T* gb, T beta, T* dyb, int64_t sdy,
                     int64_t batch) {
        if (!tx_ && !ty_)  // dy = x' * dout. dy: K x N, x: M x K, dout: M x N
          Gemm<T>(ctx, true, false, K, N, M, alpha_, xb, sx, gb, MN, beta, dyb, sdy, batch);
        else if (tx_ && !ty_)  // dy = x * dout. dy: K x N, x: K x M, dout: M x N
          Gemm<T>(ctx, false, false, K, N, M, alpha_, xb, sx, gb, MN, beta, dyb, sdy, batch);
        else if (!tx_ && ty_)  // dy = dout' * x. dy: N x K, dout: M x N, x: M x K
          Gemm<T>(ctx, true, false, N, K, M, alpha_, gb, MN, xb, sx, beta, dyb, sdy, batch);
        else  // dy = dout' * x'. dy: N x K, dout: M x N, x: K x M
          Gemm<T>(ctx, true, true, N, K, M, alpha_, gb, MN, xb, sx, beta, dyb, sdy, batch);
      };
      if (p.y_stride != 0 || p.batch <= 1) {
        run(xd, p.x_stride, gd, T(0), dyd, p.y_stride, p.batch);
      } else {
        for (int64_t b = 0; b < p.batch; ++b)
          run(xd + b * p.x_stride, 0, gd + b * MN, b > 0 ? T(1) : T(0), dyd, 0, 1);
      }
    }
  }

 private:
  bool tx_, ty_;
  T alpha_;
};

// ------------------------------------------------------------------------------ elementwise

// GetMid (ops/axis_layout.h): X as (pre, n, post) around the dims Y covers, axis checked.

// out[i] = f(x[i], y[YIndex(i)]); out may be x itself.
template <typename T, typename F>
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
    ForEach(ctx, x.numel(), [=] __device__(int64_t i) { od[i] = f(xd[i], yd[m.YIndex(i)]); });
  }

 private:
  int axis_;
};

// dy[j] = sum_{i, k} DY(dout[i, j, k], x[i, j, k], y[j]): one block per j.
template <typename T, typename G>
__global__ void ElementwiseDyKernel(const T* g, const T* x, const T* y, T* dy, fn::BroadcastMid m) {
  const int64_t j = blockIdx.x;
  const T yv = y[j];
  T acc = 0;
  for (int64_t t = threadIdx.x; t < m.pre * m.post; t += blockDim.x) {
    const int64_t i = t / m.post, k = t % m.post;
    const int64_t idx = (i * m.n + j) * m.post + k;
    acc += G::DY(g[idx], x[idx], yv);
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) dy[j] = acc;
}

template <typename T, typename G>
class ElementwiseGradKernel : public OpKernel {
 public:
  explicit ElementwiseGradKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const Tensor& y = ctx.Input("Y");
    const Tensor& dout = ctx.Input("Out@GRAD");
    const fn::BroadcastMid m = GetMid(x.dims(), y.dims(), axis_);
    const T* xd = x.data<T>();
    const T* yd = y.data<T>();
    const T* gd = dout.data<T>();
    if (Tensor* dx = ctx.OutputOrNull("X@GRAD")) {
      T* dxd = dx->mutable_data<T>(ctx.place());
      if constexpr (G::kDxIsDout) {
        CopyOnStream(ctx, gd, dxd, dout.numel());
      } else {
        ForEach(ctx, x.numel(),
                [=] __device__(int64_t i) { dxd[i] = G::DX(gd[i], xd[i], yd[m.YIndex(i)]); });
      }
    }
    if (Tensor* dy = ctx.OutputOrNull("Y@GRAD")) {
      T* dyd = dy->mutable_data<T>(ctx.place());
      if (m.n == 0) return;
      KEEL_ENFORCE(m.n < (int64_t(1) << 31), ctx.op().type(), ": Y of ", m.n,
                   " elements exceeds one launch (one block per element of Y)");
      ElementwiseDyKernel<T, G><<<m.n, 256, 0, Cuda(ctx).stream()>>>(gd, xd, yd, dyd, m);
      KEEL_CUDA_LAUNCH_CHECK();
    }
  }

 private:
  int axis_;
};

template <typename T>
using AddKernel = ElementwiseKernel<T, fn::Add>;
template <typename T>
using SubKernel = ElementwiseKernel<T, fn::Sub>;
template <typename T>
using MulEwKernel = ElementwiseKernel<T, fn::Mul>;
template <typename T>
using DivKernel = ElementwiseKernel<T, fn::Div>;
template <typename T>
using AddGradKernel = ElementwiseGradKernel<T, fn::AddGrad>;
template <typename T>
using SubGradKernel = ElementwiseGradKernel<T, fn::SubGrad>;
template <typename T>
using MulEwGradKernel = ElementwiseGradKernel<T, fn::MulGrad>;
template <typename T>
using DivGradKernel = ElementwiseGradKernel<T, fn::DivGrad>;

// ----------------------------------------------------------------------------------- sum

// out = sum_i x_i. An input that is out itself (in-place accumulation) counts as out's old value.
template <typename T>
class SumKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const int n = ctx.NumInputs("X");
    Tensor* out = ctx.Output("Out");
    const int64_t numel = ctx.Input("X", 0).numel();
    T* od = out->mutable_data<T>(ctx.place());
    int aliased = 0;
    for (int i = 0; i < n; ++i) aliased += ctx.Input("X", i).data<T>() == od;
    bool first = aliased == 0;
    if (aliased > 1) {  // out = c * out: c copies of out's old value
      const T c = static_cast<T>(aliased);
      ForEach(ctx, numel, [=] __device__(int64_t k) { od[k] *= c; });
    }
    for (int i = 0; i < n; ++i) {
      const T* xi = ctx.Input("X", i).data<T>();
      if (xi == od) continue;
      if (first) {  // out = x_i
        CopyOnStream(ctx, xi, od, numel);
        first = false;
      } else {  // out += x_i
        ForEach(ctx, numel, [=] __device__(int64_t k) { od[k] += xi[k]; });
      }
    }
  }
};

template <typename T>
class SumGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& dout = ctx.Input("Out@GRAD");
    const int n = static_cast<int>(ctx.op().Output("X@GRAD").size());
    for (int i = 0; i < n; ++i)  // dx_i = dout
      if (Tensor* dx = ctx.OutputOrNull("X@GRAD", i))
        CopyOnStream(ctx, dout.data<T>(), dx->mutable_data<T>(ctx.place()), dout.numel());
  }
};

// --------------------------------------------------------------------------------- scale

template <typename T>
class ScaleKernel : public OpKernel {
 public:
  explicit ScaleKernel(const OpDesc& op) {
    const T scale = static_cast<T>(op.Attr<float>("scale"));
    const T bias = static_cast<T>(op.Attr<float>("bias"));
    f_ = fn::ScaleShift<T>{scale, op.Attr<bool>("bias_after_scale") ? bias : scale * bias};
  }
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const T* xd = x.data<T>();
    T* od = ctx.Output("Out")->mutable_data<T>(ctx.place());
    const fn::ScaleShift<T> f = f_;
    ForEach(ctx, x.numel(), [=] __device__(int64_t i) { od[i] = f(xd[i]); });
  }

 private:
  fn::ScaleShift<T> f_;
};

template <typename T>
class ScaleGradKernel : public OpKernel {
 public:
  explicit ScaleGradKernel(const OpDesc& op) : scale_(static_cast<T>(op.Attr<float>("scale"))) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull("X@GRAD");
    if (dx == nullptr) return;
    const Tensor& dout = ctx.Input("Out@GRAD");
    const T* gd = dout.data<T>();
    T* dxd = dx->mutable_data<T>(ctx.place());
    const T s = scale_;
    ForEach(ctx, dout.numel(), [=] __device__(int64_t i) { dxd[i] = s * gd[i]; });  // dx = s dout
  }

 private:
  T scale_;
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(mul, MulKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(mul_grad, MulGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(matmul, MatMulKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(matmul_grad, MatMulGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(elementwise_add, AddKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(elementwise_sub, SubKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(elementwise_mul, MulEwKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(elementwise_div, DivKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(elementwise_add_grad, AddGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(elementwise_sub_grad, SubGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(elementwise_mul_grad, MulEwGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(elementwise_div_grad, DivGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(sum, SumKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(sum_grad, SumGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(scale, ScaleKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(scale_grad, ScaleGradKernel, float, double);

}  // namespace keel
