// optimizer::: appends backward and parameter-update ops. minimize() = backward() + apply_gradients(),
// split so that fleet's distributed optimizer can rewrite the gradients in between.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "framework/autodiff/backward.h"
#include "framework/dsl/program_guard.h"

namespace keel {
namespace optimizer {

class Optimizer {
 public:
  explicit Optimizer(float learning_rate) : learning_rate_(learning_rate) {}
  virtual ~Optimizer() = default;
  virtual std::unique_ptr<Optimizer> Clone() const = 0;
  virtual std::string type() const = 0;

  // Appends the backward ops of `loss`; returns (param, grad) pairs.
  std::vector<ParamGrad> backward(Var loss, const std::set<std::string>& no_grad_set = {});
  // Appends the learning-rate var (initialized in `startup`) and one update op per pair.
  void apply_gradients(const std::vector<ParamGrad>& params_grads, Program* startup = nullptr);
  // backward + apply_gradients. `startup` defaults to the current ProgramGuard's startup program.
  std::vector<ParamGrad> minimize(Var loss, Program* startup = nullptr,
                                  const std::set<std::string>& no_grad_set = {});

  float learning_rate() const { return learning_rate_; }

 protected:
  // Appends the update of one parameter; `lr` names the [1] learning-rate var.
  virtual void AppendUpdateOp(Block& block, const ParamGrad& pg, const std::string& lr) = 0;

 private:
  float learning_rate_;
};

// param -= learning_rate * grad
class SGD : public Optimizer {
 public:
  explicit SGD(float learning_rate) : Optimizer(learning_rate) {}
  std::unique_ptr<Optimizer> Clone() const override { return std::make_unique<SGD>(*this); }
  std::string type() const override { return "sgd"; }

 protected:
  void AppendUpdateOp(Block& block, const ParamGrad& pg, const std::string& lr) override;
};

}  // namespace optimizer
}  // namespace keel
