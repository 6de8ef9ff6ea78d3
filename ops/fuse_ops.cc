// coalesce_tensor (Paddle's op of that name): lays several tensors out as slices of one contiguous
// buffer, so that one collective covers them all. The transpiler's gradient fusion runs it at the
// start of backward on each group of parameter gradients (Input = Output = the gradients,
// copy_data false): every gradient becomes a view into FusedOutput, the kernels that write the
// gradients write into those views (a kernel keeps an output's allocation when it has room), and
// one c_allreduce_sum of FusedOutput reduces the whole group. The kernel is in fuse_ops.h; here
// are the shape, the CPU's placement and copy, and the registration.
#include "ops/fuse_ops.h"

#include <cstring>

#include "framework/comm/communicator.h"
#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/device_cpu.h"

namespace keel {

namespace {

// Output[i] = Input[i] (the same vars); FusedOutput = [sum of numels], numels[i] being Input[i]'s
// element count, which must be known at build time.
void CoalesceShape(InferShapeContext& ctx) {
  const auto& numels = ctx.Attr<std::vector<int64_t>>("numels");
  const int n = ctx.NumInputs("Input");
  KEEL_SHAPE_CHECK(ctx.NumOutputs("Output") == n, "Output must list the ", n, " Input vars, got ",
                   ctx.NumOutputs("Output"));
  KEEL_SHAPE_CHECK(static_cast<int>(numels.size()) == n, "numels has ", numels.size(),
                   " entries for ", n, " inputs");
  const DType dtype = static_cast<DType>(ctx.Attr<int>("dtype"));
  for (int i = 0; i < n; ++i) {
    KEEL_SHAPE_CHECK(ctx.op().Output("Output")[i] == ctx.op().Input("Input")[i], "Output[", i,
                     "] '", ctx.op().Output("Output")[i], "' must be Input[", i, "] '",
                     ctx.op().Input("Input")[i], "' (the slices replace the vars in place)");
    KEEL_SHAPE_CHECK(numels[i] > 0, "numels[", i, "] must be positive, got ", numels[i]);
    if (ctx.IsRuntime()) continue;  // a gradient has no tensor before its first backward
    const DDim d = ctx.GetInputDim("Input", i);
    KEEL_SHAPE_CHECK(d.known() && d.numel() == numels[i], "Input[", i, "] '",
                     ctx.InputName("Input", i), "' has shape ", d, ", numels[", i, "] says ",
                     numels[i], " elements");
    KEEL_SHAPE_CHECK(ctx.GetInputDType("Input", i) == dtype, "Input[", i, "] '",
                     ctx.InputName("Input", i), "' is ", DTypeName(ctx.GetInputDType("Input", i)),
                     ", the fused buffer ", DTypeName(dtype));
  }
  KEEL_SHAPE_CHECK(ctx.Attr<int>("pad_to_multiple") >= 1, "pad_to_multiple must be >= 1, got ",
                   ctx.Attr<int>("pad_to_multiple"));
  ctx.SetOutputDim("FusedOutput", DDim{CoalescedLength(numels, ctx.Attr<int>("pad_to_multiple"))});
  ctx.SetOutputDType("FusedOutput", dtype);
}

}  // namespace

template <>
struct CoalesceMath<CPUDevice> {
  static void CopyIn(const ExecutionContext&, size_t, const Tensor& in, char* slot, size_t bytes) {
    if (in.raw_data() != slot) std::memmove(slot, in.raw_data(), bytes);
  }
};

KEEL_REGISTER_OP(coalesce_tensor)
    .Doc(
        "Makes Input[i] (= Output[i]) views into one contiguous FusedOutput, in order; "
        "copy_data copies their values in first, set_constant fills the buffer")
    .InputList("Input", "the tensors to lay out contiguously")
    .OutputList("Output", "the same vars, now slices of FusedOutput")
    .Output("FusedOutput", "the contiguous buffer, 1-D")
    .FusesOutputs("Output", "FusedOutput")
    .RequiredAttr<std::vector<int64_t>>("numels", "elements of each input, in order")
    .RequiredAttr<int>("dtype", "the common dtype (DType code)")
    .Attr<bool>("copy_data", false, "copy the inputs' values into the buffer")
    .Attr<bool>("set_constant", false, "fill the buffer with `constant`")
    .Attr<float>("constant", 0.0f, "the fill value for set_constant")
    .Attr<int>("pad_to_multiple", 1, "FusedOutput's length is rounded up to a multiple of this")
    .Shape(CoalesceShape);
KEEL_REGISTER_KERNEL(CPU, coalesce_tensor, CoalesceKernelT, float, double, int32_t, int64_t,
                     float16, bfloat16);

}  // namespace keel
