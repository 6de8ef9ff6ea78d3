// gradient_merge::: gradient merge for a single-device program (Paddle's
// `paddle.incubate.optimizer.GradientMergeOptimizer`); fleet's DistributedStrategy::gradient_merge
// runs the same pass. k runs of the program on batches of b rows train as one step on k * b rows,
// in the memory of b rows:
//
//   gradient_merge::GradientMergeConfig config;
//   config.k_steps = 4;
//   auto opt = gradient_merge::decorate(optimizer::Adam(1e-3f), config);
//   opt.minimize(loss);   // backward, the updates, then transpiler::GradientMergePass
//
// With mixed precision, decorate the amp optimizer: gradient_merge::decorate(amp::decorate(opt,
// amp_config), config); the loss-scale decision is then made once per k runs, on the merged
// gradient. What the rewrite does: transpiler/gradient_merge_pass.h.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "framework/dsl/amp.h"
#include "framework/dsl/optimizer.h"
#include "transpiler/gradient_merge_pass.h"

namespace keel {
namespace gradient_merge {

// Paddle's gradient_merge_configs (DistributedStrategy::gradient_merge_configs holds one).
struct GradientMergeConfig {
  int k_steps = 1;  // runs per optimizer step (>= 1)
  bool avg = true;  // the optimizer sees the mean of the k gradients (false: their sum)
};

// Throws a keel::Error naming the first field out of range (`where` prefixes it).
void ValidateGradientMergeConfig(const GradientMergeConfig& c, const std::string& where);
transpiler::GradientMergeOptions PassOptions(const GradientMergeConfig& c);

class GradientMergeOptimizer {
 public:
  GradientMergeOptimizer(const optimizer::Optimizer& opt, GradientMergeConfig config);
  GradientMergeOptimizer(amp::MixedPrecisionOptimizer opt, GradientMergeConfig config);

  // The wrapped optimizer's minimize (backward and updates), then GradientMergePass on the loss's
  // program and `startup` (default: the ProgramGuard's). Returns the (param, grad) pairs backward
  // made (the per-run gradients; the updates read "<grad>@GRAD_MERGED").
  std::vector<ParamGrad> minimize(Var loss, Program* startup = nullptr,
                                  const std::set<std::string>& no_grad_set = {});

  const GradientMergeConfig& config() const { return config_; }
  // The mixed-precision optimizer it wraps (its loss-scaling vars), or nullptr.
  const amp::MixedPrecisionOptimizer* amp_optimizer() const { return amp_.get(); }

 private:
  std::unique_ptr<optimizer::Optimizer> opt_;
  std::unique_ptr<amp::MixedPrecisionOptimizer> amp_;
  GradientMergeConfig config_;
};

GradientMergeOptimizer decorate(const optimizer::Optimizer& opt, GradientMergeConfig config = {});
GradientMergeOptimizer decorate(amp::MixedPrecisionOptimizer opt, GradientMergeConfig config = {});

}  // namespace gradient_merge
}  // namespace keel
