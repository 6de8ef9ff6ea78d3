// The kernels of fused_gemm_epilogue and its grad (fused_gemm_ops.cc has the ops and their
// shapes), once for every device (ops/device.h): a fully connected layer's mul and bias add in one
// op (transpiler/fuse_gemm_epilogue_pass.h makes them).
//
// Forward: Out = X * Y (mul's GEMM, MulGemm), then Out[i, j] += Bias[j] in place: no separate
// [M, N] output for the add to read back and write again. Backward: dX = dOut * Y' and
// dY = X' * dOut read dOut itself (elementwise_add_grad's copy of it is gone), dBias = the column
// sums of dOut. Every value is the unfused ops', bit for bit: the same GEMM calls, the add's
// formula on the GEMM's rounded result, the bias gradient summed by the same SumBroadcast.
// dY and dBias may be narrowed (OpTraits::narrows_outputs): stored rounded to 16 bits.
//
// Legend: M, K, N = rows of X (its first x_num_col_dims dims), the contracted dim, columns of Y.
#pragma once

#include <cstdint>

#include "ops/device.h"
#include "ops/math_ops.h"

namespace keel {

// The bias add's broadcast over Out [M, N]: each row gets Bias [N].
inline fn::BroadcastMid BiasBroadcast(const Tensor& out, int xk) {
  return fn::BroadcastMid{out.dims().prod(0, xk), out.dims().prod(xk, out.dims().size()), 1};
}

template <typename D, typename T>
class FusedGemmEpilogueKernel : public OpKernel {
 public:
  explicit FusedGemmEpilogueKernel(const OpDesc& op) : xk_(op.Attr<int>("x_num_col_dims")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Out");
    MulGemm<D, T>(ctx, ctx.Input("X"), ctx.Input("Y"), xk_, 1, out);
    const T* bd = ctx.Input("Bias").data<T>();
    T* od = out->data<T>();
    const fn::Add add;
    Device<D>::ForEachBroadcast(ctx, BiasBroadcast(*out, xk_),
                                [=] KEEL_HD_LAMBDA(int64_t i, int64_t j) {
                                  od[i] = Narrow<T>(add(Widen(od[i]), Widen(bd[j])));
                                });
  }

 private:
  int xk_;
};

template <typename D, typename T>
class FusedGemmEpilogueGradKernel : public OpKernel {
 public:
  explicit FusedGemmEpilogueGradKernel(const OpDesc& op) : xk_(op.Attr<int>("x_num_col_dims")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    MulGradGemms<D, T>(ctx, ctx.Input("X"), ctx.Input("Y"), dout, xk_, 1, GradOutput(ctx, "X"),
                       GradOutput(ctx, "Y"));
    if (Tensor* db = GradOutput(ctx, "Bias")) {
      const T* gd = dout.data<T>();
      SumBroadcastInto<D, T>(ctx, GradVarName("Bias"), db, BiasBroadcast(dout, xk_),
                             [=] KEEL_HD_LAMBDA(int64_t i, int64_t) -> Acc<T> {
                               return fn::AddGrad::DY(Widen(gd[i]), Widen(gd[i]), Widen(gd[i]));
                             });
    }
  }

 private:
  int xk_;
};

}  // namespace keel
