#include "framework/dsl/gradient_merge.h"

#include <utility>

#include "framework/error.h"

namespace keel {
namespace gradient_merge {

void ValidateGradientMergeConfig(const GradientMergeConfig& c, const std::string& where) {
  KEEL_ENFORCE(c.k_steps >= 1, where, "gradient_merge_configs.k_steps must be >= 1, got ",
               c.k_steps);
}

transpiler::GradientMergeOptions PassOptions(const GradientMergeConfig& c) {
  transpiler::GradientMergeOptions o;
  o.k_steps = c.k_steps;
  o.avg = c.avg;
  return o;
}

GradientMergeOptimizer::GradientMergeOptimizer(const optimizer::Optimizer& opt,
                                               GradientMergeConfig config)
    : opt_(opt.Clone()), config_(config) {
  ValidateGradientMergeConfig(config_, "gradient_merge::decorate: ");
}

GradientMergeOptimizer::GradientMergeOptimizer(amp::MixedPrecisionOptimizer opt,
                                               GradientMergeConfig config)
    : amp_(std::make_unique<amp::MixedPrecisionOptimizer>(std::move(opt))), config_(config) {
  ValidateGradientMergeConfig(config_, "gradient_merge::decorate: ");
}

std::vector<ParamGrad> GradientMergeOptimizer::minimize(Var loss, Program* startup,
                                                        const std::set<std::string>& no_grad_set) {
  KEEL_ENFORCE(loss.valid(), "gradient_merge::decorate: minimize needs a loss variable");
  if (!startup) startup = &default_startup_program();
  std::vector<ParamGrad> pg = amp_ ? amp_->minimize(loss, startup, no_grad_set)
                                   : opt_->minimize(loss, startup, no_grad_set);
  transpiler::GradientMergePass(PassOptions(config_)).Apply(*loss.block()->program(), *startup);
  return pg;
}

GradientMergeOptimizer decorate(const optimizer::Optimizer& opt, GradientMergeConfig config) {
  return GradientMergeOptimizer(opt, config);
}

GradientMergeOptimizer decorate(amp::MixedPrecisionOptimizer opt, GradientMergeConfig config) {
  return GradientMergeOptimizer(std::move(opt), config);
}

}  // namespace gradient_merge
}  // namespace keel
