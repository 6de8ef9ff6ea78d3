// Control flow and the small ops that compute conditions (PaddlePaddle Fluid 1.x names and slots):
// conditional_block runs a sub-block when its condition holds; less_than, less_equal,
// greater_than, greater_equal, equal and not_equal compare elementwise into bool; logical_and and
// logical_or combine bools; assign copies a tensor. The kernels are in control_ops.h (assign's in
// ops/device.h); here are the shapes and the CPU registrations.
#include "ops/control_ops.h"

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/op_util.h"

namespace keel {

namespace {

// ----------------------------------------------------------------------------- conditional_block

// Cond must hold one bool; the sub-block reads and writes the enclosing block's vars.
void ConditionalBlockShape(InferShapeContext& ctx) {
  if (ctx.IsRuntime()) return;
  const DDim c = ctx.GetInputDim("Cond");
  KEEL_SHAPE_CHECK(ctx.GetInputDType("Cond") == DType::kBool, "Cond must be bool, got ",
                   DTypeName(ctx.GetInputDType("Cond")));
  KEEL_SHAPE_CHECK(!c.known() || c.numel() == 1, "Cond must hold one element, got ", c);
}

// ------------------------------------------------------------------------------------ compare

// X and Y of one shape, or Y of one element; Out: bool, X's shape.
void CompareShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X"), y = ctx.GetInputDim("Y");
  KEEL_SHAPE_CHECK(ctx.GetInputDType("X") == ctx.GetInputDType("Y"), "X is ",
                   DTypeName(ctx.GetInputDType("X")), ", Y is ", DTypeName(ctx.GetInputDType("Y")));
  KEEL_SHAPE_CHECK(ctx.DimsEq(x, y) || (y.known() && y.numel() == 1), "Y ", y,
                   " must have X's shape ", x, " or hold one element");
  ctx.SetOutputDim("Out", x);
  ctx.SetOutputDType("Out", DType::kBool);
}

// ------------------------------------------------------------------------------------ logical

void LogicalShape(InferShapeContext& ctx) {
  KEEL_SHAPE_CHECK(ctx.GetInputDType("X") == DType::kBool && ctx.GetInputDType("Y") == DType::kBool,
                   "X and Y must be bool, got ", DTypeName(ctx.GetInputDType("X")), " and ",
                   DTypeName(ctx.GetInputDType("Y")));
  KEEL_SHAPE_CHECK(ctx.DimsEq(ctx.GetInputDim("X"), ctx.GetInputDim("Y")), "X ",
                   ctx.GetInputDim("X"), " and Y ", ctx.GetInputDim("Y"), " differ");
  ctx.ShareDimAndDType("X", "Out");
}

void AssignShape(InferShapeContext& ctx) { ctx.ShareDimAndDType("X", "Out"); }

}  // namespace

KEEL_REGISTER_OP(conditional_block)
    .Doc("Runs the ops of sub_block, in the enclosing scopes, when Cond (one bool) is true")
    .Input("Cond", "one bool")
    .OptionalInput("Input", "vars the block reads (documentation for readers of the program)")
    .RequiredAttr<BlockRef>("sub_block", "the block to run")
    .KernelDTypeFrom("Cond")
    .Shape(ConditionalBlockShape);
KEEL_REGISTER_KERNEL(CPU, conditional_block, ConditionalBlockKernel, bool);

#define KEEL_REGISTER_COMPARE_OP(name, Cmp, formula)                                    \
  KEEL_REGISTER_OP(name)                                                                \
      .Doc("Out = " formula ", elementwise, as bool; Y of X's shape or of one element") \
      .Input("X", "the left operand")                                                   \
      .Input("Y", "the right operand")                                                  \
      .Output("Out", "bool, X's shape")                                                 \
      .Shape(CompareShape);                                                             \
  KEEL_REGISTER_KERNEL(CPU, name, CompareOp<Cmp>::Kernel, float, double, int32_t, int64_t)

KEEL_REGISTER_COMPARE_OP(less_than, fn::LessThan, "X < Y");
KEEL_REGISTER_COMPARE_OP(less_equal, fn::LessEqual, "X <= Y");
KEEL_REGISTER_COMPARE_OP(greater_than, fn::GreaterThan, "X > Y");
KEEL_REGISTER_COMPARE_OP(greater_equal, fn::GreaterEqual, "X >= Y");
KEEL_REGISTER_COMPARE_OP(equal, fn::Equal, "X == Y");
KEEL_REGISTER_COMPARE_OP(not_equal, fn::NotEqual, "X != Y");
#undef KEEL_REGISTER_COMPARE_OP

KEEL_REGISTER_OP(logical_and)
    .Doc("Out = X && Y, elementwise over bools of one shape")
    .Input("X", "bool")
    .Input("Y", "bool, X's shape")
    .Output("Out", "bool")
    .Shape(LogicalShape);
KEEL_REGISTER_KERNEL(CPU, logical_and, LogicalOp<true>::Kernel, bool);
KEEL_REGISTER_OP(logical_or)
    .Doc("Out = X || Y, elementwise over bools of one shape")
    .Input("X", "bool")
    .Input("Y", "bool, X's shape")
    .Output("Out", "bool")
    .Shape(LogicalShape);
KEEL_REGISTER_KERNEL(CPU, logical_or, LogicalOp<false>::Kernel, bool);

KEEL_REGISTER_OP(assign)
    .Doc("Out = a copy of X (same shape and dtype)")
    .Input("X", "the source")
    .Output("Out", "the copy")
    .Shape(AssignShape)
    .MayShareBuffer("Out", "X");
KEEL_REGISTER_KERNEL(CPU, assign, CopyKernel, float, double, int32_t, int64_t, bool, bfloat16,
                     float16);

}  // namespace keel
