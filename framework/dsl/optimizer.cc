#include "framework/dsl/optimizer.h"

#include "framework/op/op_registry.h"

namespace keel {
namespace optimizer {

namespace {
constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);

// The attrs every update op carries: its role and the (param, grad) it updates.
std::map<std::string, Attribute> UpdateRole(const ParamGrad& pg) {
  return {{kOpRoleAttr, kOptimize},
          {kOpRoleVarAttr, std::vector<std::string>{pg.first, pg.second}}};
}
}  // namespace

std::vector<ParamGrad> Optimizer::backward(Var loss, const std::set<std::string>& no_grad_set) {
  KEEL_ENFORCE(loss.valid(), type(), ": minimize needs a loss variable");
  Program& program = *loss.block()->program();
  if (!recompute_) return append_backward(program, loss.name(), no_grad_set);
  std::vector<std::string> checkpoints = recompute_checkpoints_;
  if (checkpoints.empty()) checkpoints = RecomputeCheckpoints(program);
  KEEL_ENFORCE(!checkpoints.empty(), type(),
               ": recompute is on but no checkpoint is named (set_recompute({...}), "
               "recompute_configs.checkpoints, or recompute_checkpoint(var) in the model)");
  return append_backward(program, loss.name(), no_grad_set, checkpoints);
}

const std::string& Optimizer::learning_rate_var() const {
  KEEL_ENFORCE(!lr_var_.empty(), "optimizer ", type(),
               ": learning_rate_var() before minimize/apply_gradients appended its updates (under "
               "fleet, the DistributedOptimizer minimizes a copy of this optimizer: ask it for "
               "learning_rate_var())");
  return lr_var_;
}

void Optimizer::set_grad_clip(GradientClipByGlobalNorm clip) {
  KEEL_ENFORCE(clip.clip_norm > 0, type(), ": GradientClipByGlobalNorm needs clip_norm > 0, got ",
               clip.clip_norm);
  grad_clip_ = clip;
}

void Optimizer::set_weight_decay(float coeff) {
  KEEL_ENFORCE(coeff >= 0, type(), ": weight decay needs coeff >= 0, got ", coeff);
  weight_decay_ = coeff;
}

void Optimizer::apply_gradients(const std::vector<ParamGrad>& params_grads, Program* startup) {
  if (!startup) startup = &default_startup_program();
  Program& main = default_main_program();
  KEEL_ENFORCE(!params_grads.empty(), type(), ": no parameter receives a gradient from the loss");
  lr_var_ = lr_schedule::AppendLearningRate(learning_rate_, main, *startup);
  Block& block = main.global_block();
  if (grad_clip_) {
    std::vector<std::string> grads, role_var;
    for (auto& pg : params_grads) {
      grads.push_back(pg.second);
      role_var.insert(role_var.end(), {pg.first, pg.second});
    }
    std::string norm = main.UniqueName("global_grad_norm");
    block.Var(norm)->set_stop_gradient(true);
    AppendOp(block, "clip_by_global_norm", {{"X", grads}}, {{"Out", grads}, {"GlobalNorm", {norm}}},
             {{"clip_norm", grad_clip_->clip_norm},
              {kOpRoleAttr, kOptimize},
              {kOpRoleVarAttr, role_var}});
  }
  for (const ParamGrad& pg : params_grads) {
    ParamGrad update = pg;
    if (weight_decay_ > 0) {
      // grad + coeff * param, into a var of its own: the raw gradient stays what backward (and
      // the all-reduce) wrote.
      const VarDesc* g = block.MustFindVar(pg.second);
      std::string decay = main.UniqueName(pg.first + "@L2DECAY_SCALED");
      update.second = main.UniqueName(pg.second + "@L2DECAY");
      for (const std::string& name : {decay, update.second}) {
        VarDesc* v = block.Var(name);
        v->set_shape(g->shape());
        v->set_dtype(g->dtype());
        v->set_stop_gradient(true);
      }
      std::map<std::string, Attribute> role = {
          {kOpRoleAttr, kOptimize},
          {kOpRoleVarAttr, std::vector<std::string>{pg.first, pg.second}}};
      auto scale_attrs = role;
      scale_attrs["scale"] = weight_decay_;
      scale_attrs["bias"] = 0.0f;
      scale_attrs["bias_after_scale"] = true;
      AppendOp(block, "scale", {{"X", {pg.first}}}, {{"Out", {decay}}}, scale_attrs);
      AppendOp(block, "sum", {{"X", {pg.second, decay}}}, {{"Out", {update.second}}}, role);
    }
    const size_t before = block.num_ops();
    AppendUpdateOp(block, startup->global_block(), update, lr_var_);
    if (!skip_update_.empty())
      for (size_t i = before; i < block.num_ops(); ++i)
        if (OpRegistry::Get(block.op(i)->type()).FindInput("SkipUpdate"))
          block.op(i)->SetInput("SkipUpdate", {skip_update_});
  }
}

std::vector<ParamGrad> Optimizer::minimize(Var loss, Program* startup,
                                           const std::set<std::string>& no_grad_set) {
  auto pg = backward(loss, no_grad_set);
  apply_gradients(pg, startup);
  return pg;
}

std::string Optimizer::AddAccumulator(Block& main, Block& startup, const std::string& param,
                                      const std::string& what, float value, bool scalar) {
  const VarDesc* p = main.MustFindVar(param);
  const std::vector<int64_t> shape = scalar ? std::vector<int64_t>{1} : p->shape();
  const bool low = p->dtype() == DType::kFloat16 || p->dtype() == DType::kBFloat16;
  const DType dtype = scalar || low ? DType::kFloat32 : p->dtype();
  const std::string name = main.program()->UniqueName(param + "_" + what);
  for (Block* b : {&main, &startup}) {
    VarDesc* v = b->Var(name);
    v->set_shape(shape);
    v->set_dtype(dtype);
    v->set_persistable(true);
    v->set_stop_gradient(true);
  }
  AppendOp(startup, "fill_constant", {}, {{"Out", {name}}},
           {{"shape", shape}, {"dtype", static_cast<int>(dtype)}, {"value", value}});
  return name;
}

void Optimizer::AddMaster(const std::string& param, OpDesc::VarMap* ins, OpDesc::VarMap* outs,
                          std::map<std::string, Attribute>* attrs) const {
  auto it = master_params_.find(param);
  if (it == master_params_.end()) return;
  ins->push_back({"MasterParam", {it->second}});
  outs->push_back({"MasterParamOut", {it->second}});
}

// ------------------------------------------------------------------------------------------ SGD

void SGD::AppendUpdateOp(Block& main, Block& startup, const ParamGrad& pg, const std::string& lr) {
  OpDesc::VarMap ins = {{"Param", {pg.first}}, {"Grad", {pg.second}}, {"LearningRate", {lr}}};
  OpDesc::VarMap outs = {{"ParamOut", {pg.first}}};
  auto attrs = UpdateRole(pg);
  AddMaster(pg.first, &ins, &outs, &attrs);
  AppendOp(main, "sgd", ins, outs, attrs);
}

// ------------------------------------------------------------------------------------- Momentum

Momentum::Momentum(LearningRate learning_rate, float momentum, bool use_nesterov)
    : Optimizer(std::move(learning_rate)), momentum_(momentum), use_nesterov_(use_nesterov) {}

void Momentum::AppendUpdateOp(Block& main, Block& startup, const ParamGrad& pg,
                              const std::string& lr) {
  std::string v = AddAccumulator(main, startup, pg.first, "velocity", 0.0f);
  auto attrs = UpdateRole(pg);
  attrs["mu"] = momentum_;
  attrs["use_nesterov"] = use_nesterov_;
  OpDesc::VarMap ins = {
      {"Param", {pg.first}}, {"Grad", {pg.second}}, {"Velocity", {v}}, {"LearningRate", {lr}}};
  OpDesc::VarMap outs = {{"ParamOut", {pg.first}}, {"VelocityOut", {v}}};
  AddMaster(pg.first, &ins, &outs, &attrs);
  AppendOp(main, "momentum", ins, outs, attrs);
}

// ----------------------------------------------------------------------------------- Adam, AdamW

Adam::Adam(LearningRate learning_rate, float beta1, float beta2, float epsilon, bool lazy_mode)
    : Optimizer(std::move(learning_rate)),
      beta1_(beta1),
      beta2_(beta2),
      epsilon_(epsilon),
      lazy_mode_(lazy_mode) {}

void Adam::AppendUpdateOp(Block& main, Block& startup, const ParamGrad& pg, const std::string& lr) {
  AppendAdamOp(main, startup, pg, lr, "adam", {});
}

void Adam::AppendAdamOp(Block& main, Block& startup, const ParamGrad& pg, const std::string& lr,
                        const std::string& op_type, std::map<std::string, Attribute> extra_attrs) {
  std::string m1 = AddAccumulator(main, startup, pg.first, "moment1", 0.0f);
  std::string m2 = AddAccumulator(main, startup, pg.first, "moment2", 0.0f);
  std::string b1 = AddAccumulator(main, startup, pg.first, "beta1_pow_acc", beta1_, true);
  std::string b2 = AddAccumulator(main, startup, pg.first, "beta2_pow_acc", beta2_, true);
  auto attrs = UpdateRole(pg);
  attrs["beta1"] = beta1_;
  attrs["beta2"] = beta2_;
  attrs["epsilon"] = epsilon_;
  if (lazy_mode_) attrs["lazy_mode"] = true;
  for (auto& kv : extra_attrs) attrs[kv.first] = kv.second;
  OpDesc::VarMap ins = {{"Param", {pg.first}}, {"Grad", {pg.second}}, {"LearningRate", {lr}},
                        {"Moment1", {m1}},     {"Moment2", {m2}},     {"Beta1Pow", {b1}},
                        {"Beta2Pow", {b2}}};
  OpDesc::VarMap outs = {{"ParamOut", {pg.first}},
                         {"Moment1Out", {m1}},
                         {"Moment2Out", {m2}},
                         {"Beta1PowOut", {b1}},
                         {"Beta2PowOut", {b2}}};
  AddMaster(pg.first, &ins, &outs, &attrs);
  AppendOp(main, op_type, ins, outs, attrs);
}

AdamW::AdamW(LearningRate learning_rate, float weight_decay, float beta1, float beta2,
             float epsilon)
    : Adam(std::move(learning_rate), beta1, beta2, epsilon), weight_decay_(weight_decay) {}

void AdamW::AppendUpdateOp(Block& main, Block& startup, const ParamGrad& pg,
                           const std::string& lr) {
  AppendAdamOp(main, startup, pg, lr, "adamw", {{"coeff", weight_decay_}});
}

}  // namespace optimizer
}  // namespace keel
