// Learning-rate schedules as ops over a persistable step counter, so a saved program resumes its
// schedule: `increment` advances the counter, `lr_schedule` maps it to the learning rate.
//
// Step convention: the DSL initializes the counter to -1 and increments it first thing in each
// run, so the first training step sees s = 0 and the k-th (0-based) sees s = k. lr_schedule
// clamps s below at 0. With s and warm-up W = warmup_steps:
//
//   constant:   lr(s) = base_lr
//   piecewise:  lr(s) = values[k], k = #{i : s >= boundaries[i]}   (|values| = |boundaries| + 1)
//   cosine:     lr(s) = min_lr + (base_lr - min_lr) * (1 + cos(pi * min(s, total_steps) /
//                                                               total_steps)) / 2
//   warm-up (Paddle's linear_lr_warmup), when W > 0 and s < W:
//               lr(s) = start + (end - start) * s / W,  start = warmup_start_lr,
//               end = warmup_end_lr, or the schedule's lr(W) when warmup_end_lr < 0
//   and from s = W on the schedule itself, on the same (unshifted) s.
//
// The counter is float32 in the DSL: exact up to 2^24 (16.7M) steps. The kernels are in
// lr_schedule_ops.h; here are the ops, their shapes and the CPU registrations.
#include "ops/lr_schedule_ops.h"

#include <string>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/op_util.h"

namespace keel {
namespace {

// ------------------------------------------------------------------------------------ increment

void IncrementShape(InferShapeContext& ctx) {
  DDim d = ctx.GetInputDim("X");
  KEEL_SHAPE_CHECK(d.numel() == 1 || (!ctx.IsRuntime() && d.numel() < 0),
                   "X must hold one element, got ", d.str());
  ctx.ShareDimAndDType("X", "Out");
}

// ---------------------------------------------------------------------------------- lr_schedule

std::string CheckScheduleType(const Attribute& a) {
  const std::string& t = std::get<std::string>(a);
  return t == "constant" || t == "piecewise" || t == "cosine"
             ? ""
             : "unknown schedule (known: constant, piecewise, cosine)";
}

std::string CheckNonNegative(const Attribute& a) {
  return std::get<int>(a) >= 0 ? "" : "must be >= 0";
}

// The attrs that depend on each other, checked at build time; Step holds one element.
void LrScheduleShape(InferShapeContext& ctx) {
  DDim d = ctx.GetInputDim("Step");
  KEEL_SHAPE_CHECK(d.numel() == 1 || (!ctx.IsRuntime() && d.numel() < 0),
                   "Step must hold one element, got ", d.str());
  const std::string& type = ctx.Attr<std::string>("type");
  if (type == "piecewise") {
    const auto& b = ctx.Attr<std::vector<int>>("boundaries");
    const auto& v = ctx.Attr<std::vector<float>>("values");
    KEEL_SHAPE_CHECK(v.size() == b.size() + 1,
                     "piecewise needs one more value than boundaries, got ", b.size(),
                     " boundaries and ", v.size(), " values");
    for (size_t i = 1; i < b.size(); ++i)
      KEEL_SHAPE_CHECK(b[i - 1] < b[i], "piecewise boundaries must increase, got ", b[i - 1],
                       " then ", b[i]);
  } else if (type == "cosine") {
    KEEL_SHAPE_CHECK(ctx.Attr<int>("total_steps") > 0, "cosine needs total_steps > 0, got ",
                     ctx.Attr<int>("total_steps"));
  }
  ctx.SetOutputDim("LearningRate", DDim{1});
  ctx.SetOutputDType("LearningRate", DType::kFloat32);
}

}  // namespace

KEEL_REGISTER_OP(increment)
    .Doc("Out = X + step; X holds one element. In place on the step counter.")
    .Input("X", "[1]: the counter")
    .Output("Out", "[1], usually X itself")
    .Attr<float>("step", 1.0f, "the amount added")
    .Shape(IncrementShape);
KEEL_REGISTER_KERNEL(CPU, increment, IncrementKernel, float, double, int32_t, int64_t);

KEEL_REGISTER_OP(lr_schedule)
    .Doc(
        "LearningRate = lr(Step) for a constant, piecewise or cosine schedule with an optional "
        "linear warm-up; the formulas are in ops/lr_schedule_ops.cc.")
    .Input("Step", "[1]: the step counter; the first training step is 0")
    .Output("LearningRate", "[1] float32")
    .Attr<std::string>("type", "constant", "constant | piecewise | cosine", CheckScheduleType)
    .Attr<float>("base_lr", 0.0f, "constant: the rate; cosine: the rate at step 0")
    .Attr<std::vector<int>>("boundaries", {}, "piecewise: steps where the next value starts")
    .Attr<std::vector<float>>("values", {}, "piecewise: |boundaries| + 1 rates")
    .Attr<int>("total_steps", 0, "cosine: the step where min_lr is reached", CheckNonNegative)
    .Attr<float>("min_lr", 0.0f, "cosine: the final rate")
    .Attr<int>("warmup_steps", 0, "linear warm-up over steps [0, warmup_steps)", CheckNonNegative)
    .Attr<float>("warmup_start_lr", 0.0f, "warm-up: the rate at step 0")
    .Attr<float>("warmup_end_lr", -1.0f,
                 "warm-up: the rate it heads to; < 0: the schedule's rate at warmup_steps")
    .Shape(LrScheduleShape)
    .KernelDTypeFrom("Step");
KEEL_REGISTER_KERNEL(CPU, lr_schedule, LrScheduleKernel, float, double, int64_t);

}  // namespace keel
