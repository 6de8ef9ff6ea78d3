// Math ops (PaddlePaddle Fluid 1.x semantics and slot names): mul, matmul, elementwise_{add, sub,
// mul, div}, sum, scale; each with its grad op, for float and double. The kernels are in
// math_ops.h; here are the shapes and the CPU registrations.
//
// Legend: M, K, N = rows of the left operand, the contracted dim, columns of the right operand.
// Elementwise broadcast views X as (pre, n, post) and Y as (n): Out[i, j, k] = X[i, j, k] op Y[j].
#include "ops/math_ops.h"

#include <cstdint>
#include <string>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/op/shape_inference.h"
#include "ops/op_util.h"

namespace keel {
namespace {

// ------------------------------------------------------------------------------------- helpers

void CheckSameDType(const InferShapeContext& ctx, const std::string& a, const std::string& b) {
  DType ta = ctx.GetInputDType(a), tb = ctx.GetInputDType(b);
  KEEL_SHAPE_CHECK(ta == tb, a, " is ", DTypeName(ta), " but ", b, " is ", DTypeName(tb));
}

AttrCheckFn AtLeastOne() {
  return
      [](const Attribute& a) -> std::string { return std::get<int>(a) >= 1 ? "" : "must be >= 1"; };
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

// ------------------------------------------------------------------------------ elementwise

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
KEEL_REGISTER_GRAD_OP(mul_grad, mul)
    .ComputesOutputsApart()
    .NarrowsOutput("Y@GRAD")
    .AccumulatesOutput("Y@GRAD");
KEEL_REGISTER_KERNEL(CPU, mul, MulKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, mul_grad, MulGradKernel, float, double, bfloat16, float16);

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
KEEL_REGISTER_GRAD_OP(matmul_grad, matmul).ComputesOutputsApart();
KEEL_REGISTER_KERNEL(CPU, matmul, MatMulKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, matmul_grad, MatMulGradKernel, float, double, bfloat16, float16);

// Trailing arguments: traits of the grad op.
#define KEEL_REGISTER_ELEMENTWISE_OP(name, Kernel, GradKernel, formula, ...)                  \
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
  KEEL_REGISTER_GRAD_OP(name##_grad, name) __VA_ARGS__;                                       \
  KEEL_REGISTER_KERNEL(CPU, name, Kernel, float, double, bfloat16, float16);                  \
  KEEL_REGISTER_KERNEL(CPU, name##_grad, GradKernel, float, double, bfloat16, float16)

// Their gradients pass dOut through: the executor may let them be dOut itself. The add's Y@GRAD,
// an unfused fc's bias gradient, may be narrowed (transpiler/narrow_grads_pass.h).
KEEL_REGISTER_ELEMENTWISE_OP(elementwise_add, ElementwiseAddKernel, ElementwiseAddGradKernel,
                             "X + Y",
                             .MayShareBuffer(GradVarName("X"), GradVarName("Out"))
                                 .MayShareBuffer(GradVarName("Y"), GradVarName("Out"))
                                 .NarrowsOutput(GradVarName("Y")));
KEEL_REGISTER_ELEMENTWISE_OP(elementwise_sub, ElementwiseSubKernel, ElementwiseSubGradKernel,
                             "X - Y", .MayShareBuffer(GradVarName("X"), GradVarName("Out")));
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
    .Attr<bool>("row_sparse", false,
                "X are row-sparse (gradients of is_sparse embeddings sharing one table; set by "
                "autodiff): Out holds the union of their rows, each summed in X's order")
    .Shape(SumShape)
    .DefaultGrad()
    .AcceptsRowSparse("X", "row_sparse")
    .WritesRowSparseWhen("Out", "row_sparse");
KEEL_REGISTER_GRAD_OP(sum_grad, sum);
KEEL_REGISTER_KERNEL(CPU, sum, SumKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, sum_grad, SumGradKernel, float, double, bfloat16, float16);

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
KEEL_REGISTER_KERNEL(CPU, scale, ScaleKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, scale_grad, ScaleGradKernel, float, double, bfloat16, float16);

}  // namespace keel
