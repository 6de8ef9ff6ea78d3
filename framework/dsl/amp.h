// amp::: automatic mixed precision for a single-device program (Paddle's
// `paddle.static.amp.decorate`); fleet's DistributedStrategy::amp uses the same.
//
//   auto opt = amp::decorate(optimizer::Adam(1e-3), {.dtype = DType::kBFloat16});
//   opt.minimize(loss);   // forward rewritten by transpiler::AmpPass, then backward and updates
//
// minimize() = backward() + apply_gradients(), in order:
//   1. AmpPass rewrites the forward program (white ops in `dtype`, casts, see amp_pass.h);
//   2. with loss scaling: scaled = loss * loss_scaling (a persistable float32 [1] var
//      "loss_scaling_N", filled with init_loss_scaling by startup), backward from `scaled`;
//   3. with loss scaling: check_finite_and_unscale divides every gradient by the scale and sets
//      "find_infinite_N"; with dynamic scaling update_loss_scaling then moves the scale and the
//      int32 counters "num_good_steps_N" / "num_bad_steps_N" (persistable: checkpoints save them
//      and a resume goes on exactly), and the float32 counter "num_skipped_steps_N" adds the flag
//      (the steps skipped so far, TensorBoard's amp/skipped_steps);
//   4. the optimizer's updates read the flag as SkipUpdate: a step whose gradients overflowed
//      changes no parameter and no accumulator (PyTorch's GradScaler skips optimizer.step()
//      the same way; Paddle zeroes the gradients and still runs the update, so Adam's moments
//      decay on a step that did not happen). Learning-rate schedules count every step.
// Defaults follow PyTorch's GradScaler: scale 2^16, x2 after 2000 finite steps, x0.5 after each
// overflow. bfloat16 has float32's exponent range, so it has no loss scaling unless asked for.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "framework/dsl/optimizer.h"
#include "framework/runtime/dtype.h"
#include "framework/runtime/place.h"

namespace keel {
namespace amp {

// Paddle's amp_configs (DistributedStrategy::amp_configs holds one).
struct AmpConfig {
  DType dtype = DType::kBFloat16;  // kBFloat16 or kFloat16
  // "O1": casts around white ops, parameters stay float32. "O2": parameters that forward reads in
  // low precision become `dtype` parameters with float32 masters "<param>.master"; the updates
  // run in float32 on the masters (multi_precision) and write both (docs/mixed-precision.md).
  std::string level = "O1";
  // Loss scaling; unset: on for float16, off for bfloat16.
  std::optional<bool> use_dynamic_loss_scaling;
  // The first scale; unset: 2^16 with loss scaling, 1 without. A set value with
  // use_dynamic_loss_scaling=false gives a static scale (still checked for overflow).
  std::optional<float> init_loss_scaling;
  int incr_every_n_steps = 2000;
  int decr_every_n_nan_or_inf = 1;
  float incr_ratio = 2.0f;
  float decr_ratio = 0.5f;
  std::set<std::string> custom_white_list, custom_black_list;
  // Whose kernels decide what runs in low precision (an op without one stays float32).
  Place::Kind place = Place::Kind::kCPU;
  // false: the rewrite follows the lists whatever kernels `place` has (to inspect a program for
  // another machine); an op without its low-precision kernel then fails when it runs.
  bool check_kernels = true;
};

// Throws a keel::Error naming the first field out of range (`where` prefixes it).
void ValidateAmpConfig(const AmpConfig& c, const std::string& where);
// Whether the config scales the loss (and so checks gradients for overflow).
bool ScalesLoss(const AmpConfig& c);

class MixedPrecisionOptimizer {
 public:
  MixedPrecisionOptimizer(const optimizer::Optimizer& opt, AmpConfig config);

  // Steps 1-3 above; returns the (param, unscaled grad) pairs.
  std::vector<ParamGrad> backward(Var loss, Program* startup = nullptr,
                                  const std::set<std::string>& no_grad_set = {});
  // Step 4: the wrapped optimizer's updates, skipping overflowed steps.
  void apply_gradients(const std::vector<ParamGrad>& params_grads, Program* startup = nullptr);
  std::vector<ParamGrad> minimize(Var loss, Program* startup = nullptr,
                                  const std::set<std::string>& no_grad_set = {});

  const AmpConfig& config() const { return config_; }
  optimizer::Optimizer& inner() { return *opt_; }
  // The vars of loss scaling ("" without it): the [1] float32 scale, the [1] bool overflow flag,
  // the int32 counters.
  const std::string& loss_scaling_var() const { return loss_scaling_; }
  const std::string& found_inf_var() const { return found_inf_; }
  const std::string& good_steps_var() const { return good_steps_; }
  const std::string& bad_steps_var() const { return bad_steps_; }
  const std::string& skipped_steps_var() const { return skipped_steps_; }
  // O2: each low-precision parameter -> its float32 master (empty under O1).
  const std::map<std::string, std::string>& master_params() const { return masters_; }

 private:
  std::unique_ptr<optimizer::Optimizer> opt_;
  AmpConfig config_;
  std::string loss_scaling_, found_inf_, good_steps_, bad_steps_, skipped_steps_;
  std::map<std::string, std::string> masters_;
};

// The loss-scaling vars of a program minimized by MixedPrecisionOptimizer (directly or through
// fleet), found from its ops: the Scale of check_finite_and_unscale, its FoundInfinite, and the
// skipped-steps counter that adds it. All "" when the program does not scale its loss. The
// Trainer fetches loss_scaling and skipped_steps with the loss to log them.
struct LossScalingVars {
  std::string loss_scaling, found_inf, skipped_steps;
};
LossScalingVars FindLossScalingVars(const Program& program);

MixedPrecisionOptimizer decorate(const optimizer::Optimizer& opt, AmpConfig config = {});

// AMP O2 and a test program cloned from main before minimize (clone_for_test): its parameters
// are still declared float32, while the scope holds the low-precision ones main now declares.
// Declares each such parameter in `test` as main does and casts it to "<param>.cast_fp32" at the
// start of `test`, which its readers then read: evaluation runs in float32 on the low-precision
// weights. Returns how many parameters it changed (0 under O1 or without AMP).
int UseLowPrecisionParamsIn(const Program& main, Program& test);

}  // namespace amp
}  // namespace keel
