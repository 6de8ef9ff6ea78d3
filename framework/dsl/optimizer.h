// optimizer::: appends backward and parameter-update ops. minimize() = backward() +
// apply_gradients(), split so that fleet's distributed optimizer can rewrite the gradients in
// between.
//
// apply_gradients appends, in order: the learning rate (a constant filled by startup, or a
// schedule's increment + lr_schedule ops, see lr_schedule.h), the gradient clip when set, the L2
// weight decay when set, then one update op per (param, grad). Accumulators are persistable vars of
// main and startup named
// "<param>_<what>_0" (velocity, moment1, moment2, beta1_pow_acc, beta2_pow_acc), so
// save_persistables checkpoints the optimizer's state with the parameters.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "framework/autodiff/backward.h"
#include "framework/dsl/lr_schedule.h"
#include "framework/dsl/program_guard.h"

namespace keel {
namespace optimizer {

// Scales all gradients by clip_norm / max(global_norm, clip_norm), global_norm being the L2 norm
// of all of them together (one clip_by_global_norm op, in place on the gradients).
struct GradientClipByGlobalNorm {
  float clip_norm;
};

class Optimizer {
 public:
  explicit Optimizer(LearningRate learning_rate) : learning_rate_(std::move(learning_rate)) {}
  virtual ~Optimizer() = default;
  virtual std::unique_ptr<Optimizer> Clone() const = 0;
  virtual std::string type() const = 0;

  // Appends the backward ops of `loss`; returns (param, grad) pairs.
  std::vector<ParamGrad> backward(Var loss, const std::set<std::string>& no_grad_set = {});
  // Appends the learning rate (vars initialized in `startup`), the gradient clip and one update
  // op per pair.
  void apply_gradients(const std::vector<ParamGrad>& params_grads, Program* startup = nullptr);
  // backward + apply_gradients. `startup` defaults to the current ProgramGuard's startup program.
  std::vector<ParamGrad> minimize(Var loss, Program* startup = nullptr,
                                  const std::set<std::string>& no_grad_set = {});

  void set_grad_clip(GradientClipByGlobalNorm clip);
  bool has_grad_clip() const { return grad_clip_.has_value(); }
  // L2 regularization (Paddle's regularization=L2Decay(coeff)): each update op reads
  // grad + coeff * param, computed after the clip into "<grad>@L2DECAY". AdamW's decoupled decay
  // is its constructor's weight_decay instead.
  void set_weight_decay(float coeff);
  // A [1] bool var: the update ops apply_gradients appends read it as SkipUpdate and leave the
  // parameters and their accumulators as they are on a step where it holds true (mixed
  // precision's overflow skip, see amp.h). "" (the default): every step updates.
  void set_skip_update(const std::string& var) { skip_update_ = var; }
  // AMP O2 (amp.h): param -> its float32 master var. The update of such a (float16 / bfloat16)
  // parameter reads and writes the master too (MasterParam, MasterParamOut: multi_precision) and
  // its accumulators are float32.
  void set_master_params(std::map<std::string, std::string> masters) {
    master_params_ = std::move(masters);
  }
  // Recompute (Paddle's RecomputeOptimizer): backward keeps only `checkpoints` from forward and
  // runs the forward segments between them again (framework/autodiff/backward.h). An empty list
  // takes the vars the model marked with recompute_checkpoint(); none at all is a keel::Error at
  // backward().
  void set_recompute(std::vector<std::string> checkpoints = {}) {
    recompute_ = true;
    recompute_checkpoints_ = std::move(checkpoints);
  }
  bool recompute() const { return recompute_; }
  float weight_decay() const { return weight_decay_; }
  // The constant learning rate; a keel::Error when it is a schedule (see lr()).
  float learning_rate() const { return learning_rate_.value(); }
  const LearningRate& lr() const { return learning_rate_; }
  // The [1] learning-rate var the last apply_gradients created (fetch it to log the rate). A
  // keel::Error before this optimizer appended its updates (fleet's DistributedOptimizer
  // minimizes a copy: ask it).
  const std::string& learning_rate_var() const;

 protected:
  // Appends the update of one parameter to `main`; `lr` names the [1] learning-rate var;
  // accumulators are declared with AddAccumulator.
  virtual void AppendUpdateOp(Block& main, Block& startup, const ParamGrad& pg,
                              const std::string& lr) = 0;
  // Declares "<param>_<what>_N", persistable in main and startup, and fills it with `value` in
  // startup: Param's shape and dtype (float32 for a float16 / bfloat16 Param: multi_precision),
  // or float32 [1] when `scalar`. Returns its name.
  static std::string AddAccumulator(Block& main, Block& startup, const std::string& param,
                                    const std::string& what, float value, bool scalar = false);
  // Adds MasterParam / MasterParamOut (multi_precision) to an update op's slots when `param` has
  // a master (set_master_params).
  void AddMaster(const std::string& param, OpDesc::VarMap* ins, OpDesc::VarMap* outs,
                 std::map<std::string, Attribute>* attrs) const;

 private:
  LearningRate learning_rate_;
  std::optional<GradientClipByGlobalNorm> grad_clip_;
  float weight_decay_ = 0;
  std::string lr_var_;
  std::string skip_update_;
  std::map<std::string, std::string> master_params_;
  bool recompute_ = false;
  std::vector<std::string> recompute_checkpoints_;
};

// param -= learning_rate * grad
class SGD : public Optimizer {
 public:
  explicit SGD(LearningRate learning_rate) : Optimizer(std::move(learning_rate)) {}
  std::unique_ptr<Optimizer> Clone() const override { return std::make_unique<SGD>(*this); }
  std::string type() const override { return "sgd"; }

 protected:
  void AppendUpdateOp(Block& main, Block& startup, const ParamGrad& pg,
                      const std::string& lr) override;
};

// v = momentum * v + grad; param -= lr * v, or lr * (grad + momentum * v) with Nesterov.
// Accumulator: <param>_velocity_0 (zeros).
class Momentum : public Optimizer {
 public:
  Momentum(LearningRate learning_rate, float momentum, bool use_nesterov = false);
  std::unique_ptr<Optimizer> Clone() const override { return std::make_unique<Momentum>(*this); }
  std::string type() const override { return "momentum"; }

 protected:
  void AppendUpdateOp(Block& main, Block& startup, const ParamGrad& pg,
                      const std::string& lr) override;

 private:
  float momentum_;
  bool use_nesterov_;
};

// Paddle's Adam (bias-corrected; the adam op's formula is in ops/optimizer_ops.cc).
// Accumulators: <param>_moment1_0, <param>_moment2_0 (zeros), <param>_beta1_pow_acc_0 (beta1),
// <param>_beta2_pow_acc_0 (beta2), the last two float32 [1].
class Adam : public Optimizer {
 public:
  // lazy_mode: a row-sparse gradient (an is_sparse embedding) updates only its rows, whose
  // moments alone move (Paddle's lazy_mode); dense gradients are unaffected.
  explicit Adam(LearningRate learning_rate = 0.001f, float beta1 = 0.9f, float beta2 = 0.999f,
                float epsilon = 1e-8f, bool lazy_mode = false);
  std::unique_ptr<Optimizer> Clone() const override { return std::make_unique<Adam>(*this); }
  std::string type() const override { return "adam"; }
  void set_lazy_mode(bool lazy) { lazy_mode_ = lazy; }

 protected:
  void AppendUpdateOp(Block& main, Block& startup, const ParamGrad& pg,
                      const std::string& lr) override;
  // The op of `op_type` (adam or adamw) with Adam's slots and attrs plus `extra_attrs`.
  void AppendAdamOp(Block& main, Block& startup, const ParamGrad& pg, const std::string& lr,
                    const std::string& op_type, std::map<std::string, Attribute> extra_attrs);

 private:
  float beta1_, beta2_, epsilon_;
  bool lazy_mode_;
};

// Adam with decoupled weight decay (Paddle 2's AdamW): param -= lr * weight_decay * param before
// each Adam step, for every parameter.
class AdamW : public Adam {
 public:
  explicit AdamW(LearningRate learning_rate = 0.001f, float weight_decay = 0.01f,
                 float beta1 = 0.9f, float beta2 = 0.999f, float epsilon = 1e-8f);
  std::unique_ptr<Optimizer> Clone() const override { return std::make_unique<AdamW>(*this); }
  std::string type() const override { return "adamw"; }

 protected:
  void AppendUpdateOp(Block& main, Block& startup, const ParamGrad& pg,
                      const std::string& lr) override;

 private:
  float weight_decay_;
};

}  // namespace optimizer
}  // namespace keel
