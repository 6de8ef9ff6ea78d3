// fused_gemm_epilogue: a fully connected layer's mul and bias add as one op, and its grad; keel's
// form of Paddle's op of that name (which fuses matmul_v2 with the add, and a relu or gelu,
// through cuBLASLt's epilogues), over mul's flattening of X. transpiler/fuse_gemm_epilogue_pass.h
// makes them from the ops the DSL's layers::fc appends; the kernels are in fused_gemm_ops.h.
//
// Shapes: X [2, 3, 4] with x_num_col_dims 2 is 6 x 4; times Y [4, 5] gives Out [2, 3, 5] =
// X.dims[:x_num_col_dims] ++ [N], each row plus Bias [N = 5].
#include "ops/fused_gemm_ops.h"

#include <cstdint>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/op/shape_inference.h"
#include "ops/device_cpu.h"
#include "ops/op_util.h"

namespace keel {
namespace {

void FusedGemmEpilogueShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X"), y = ctx.GetInputDim("Y"), b = ctx.GetInputDim("Bias");
  const int xk = ctx.Attr<int>("x_num_col_dims");
  KEEL_SHAPE_CHECK(x.size() > xk, "X's rank ", x.size(), " must exceed x_num_col_dims ", xk, " (X ",
                   x, ", Y ", y, ")");
  KEEL_SHAPE_CHECK(y.size() == 2, "Y must be 2-D [K, N] (X ", x, ", Y ", y, ")");
  KEEL_SHAPE_CHECK(b.size() == 1, "Bias must be 1-D [N] (Y ", y, ", Bias ", b, ")");
  const DType dt = ctx.GetInputDType("X");
  for (const char* slot : {"Y", "Bias"})
    KEEL_SHAPE_CHECK(ctx.GetInputDType(slot) == dt, slot, " is ",
                     DTypeName(ctx.GetInputDType(slot)), " but X is ", DTypeName(dt));
  const int64_t width = ProdOrUnknown(x, xk, x.size());
  KEEL_SHAPE_CHECK(ctx.DimEq(width, y[0]), "X's width ", width, " must equal Y's height ", y[0],
                   " (X ", x, ", Y ", y, ", x_num_col_dims ", xk, ")");
  KEEL_SHAPE_CHECK(ctx.DimEq(b[0], y[1]), "Bias [", b[0], "] must have Y's ", y[1], " columns (Y ",
                   y, ")");
  DDim out;
  for (int i = 0; i < xk; ++i) out.push_back(x[i]);
  out.push_back(y[1]);
  ctx.SetOutputDim("Out", out);
  ctx.SetOutputDType("Out", dt);
}

}  // namespace

KEEL_REGISTER_OP(fused_gemm_epilogue)
    .Doc(
        "Out = flatten(X) * Y + Bias, each row of the product plus Bias: mul and a bias "
        "elementwise_add in one op. X [2, 3, 4] with x_num_col_dims 2 is 6 x 4; times Y [4, 5] "
        "plus Bias [5] gives Out [2, 3, 5]. Made by the fuse_gemm_epilogue pass")
    .Input("X", "the input, flattened to 2-D at x_num_col_dims")
    .Input("Y", "the weight [K, N]")
    .Input("Bias", "the bias [N]")
    .Output("Out", "the product plus the bias")
    .Attr<int>("x_num_col_dims", 1, "leading dims of X that become rows",
               [](const Attribute& a) -> std::string {
                 return std::get<int>(a) >= 1 ? "" : "must be >= 1";
               })
    .Shape(FusedGemmEpilogueShape)
    .DefaultGrad();
KEEL_REGISTER_GRAD_OP(fused_gemm_epilogue_grad, fused_gemm_epilogue)
    .ComputesOutputsApart()
    .NarrowsOutput("Y@GRAD")
    .NarrowsOutput("Bias@GRAD")
    .AccumulatesOutput("Y@GRAD")
    .AccumulatesOutput("Bias@GRAD");
KEEL_REGISTER_KERNEL(CPU, fused_gemm_epilogue, FusedGemmEpilogueKernel, float, double, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CPU, fused_gemm_epilogue_grad, FusedGemmEpilogueGradKernel, float, double,
                     bfloat16, float16);

}  // namespace keel
