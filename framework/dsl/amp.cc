#include "framework/dsl/amp.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "framework/error.h"
#include "framework/ir/op_device.h"
#include "framework/op/op_registry.h"
#include "transpiler/amp_pass.h"

namespace keel {
namespace amp {

namespace {
constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);

// A persistable [1] var in main and startup, filled with `value` by startup.
std::string AddState(Program& main, Program& startup, const std::string& prefix, DType dtype,
                     float value) {
  const std::string name = main.UniqueName(prefix);
  for (Program* p : {&main, &startup}) {
    VarDesc* v = p->global_block().Var(name);
    v->set_shape({1});
    v->set_dtype(dtype);
    v->set_persistable(true);
    v->set_stop_gradient(true);
  }
  AppendOp(
      startup.global_block(), "fill_constant", {}, {{"Out", {name}}},
      {{"shape", std::vector<int64_t>{1}}, {"dtype", static_cast<int>(dtype)}, {"value", value}});
  return name;
}
}  // namespace

bool ScalesLoss(const AmpConfig& c) {
  if (c.use_dynamic_loss_scaling) return *c.use_dynamic_loss_scaling || c.init_loss_scaling;
  return c.dtype == DType::kFloat16 || c.init_loss_scaling.has_value();
}

void ValidateAmpConfig(const AmpConfig& c, const std::string& where) {
  KEEL_ENFORCE(c.dtype == DType::kBFloat16 || c.dtype == DType::kFloat16, where,
               "amp_configs.dtype must be float16 or bfloat16, got ", DTypeName(c.dtype));
  KEEL_ENFORCE(c.level == "O1" || c.level == "O2", where, "amp_configs.level=", c.level,
               " must be O1 (casts around the white-list ops; parameters stay float32) or O2 "
               "(low-precision parameters with float32 master weights)");
  if (c.init_loss_scaling)
    KEEL_ENFORCE(std::isfinite(*c.init_loss_scaling) && *c.init_loss_scaling >= 1.0f, where,
                 "amp_configs.init_loss_scaling must be finite and >= 1, got ",
                 *c.init_loss_scaling);
  KEEL_ENFORCE(c.incr_every_n_steps >= 1, where,
               "amp_configs.incr_every_n_steps must be >= 1, got ", c.incr_every_n_steps);
  KEEL_ENFORCE(c.decr_every_n_nan_or_inf >= 1, where,
               "amp_configs.decr_every_n_nan_or_inf must be >= 1, got ", c.decr_every_n_nan_or_inf);
  KEEL_ENFORCE(c.incr_ratio > 1.0f && std::isfinite(c.incr_ratio), where,
               "amp_configs.incr_ratio must be > 1, got ", c.incr_ratio);
  KEEL_ENFORCE(c.decr_ratio > 0.0f && c.decr_ratio < 1.0f, where,
               "amp_configs.decr_ratio must be in (0, 1), got ", c.decr_ratio);
  for (const std::string& t : c.custom_white_list) {
    KEEL_ENFORCE(!c.custom_black_list.count(t), where, "op type '", t,
                 "' is in both amp_configs.custom_white_list and custom_black_list");
    KEEL_ENFORCE(OpRegistry::Find(t) != nullptr, where, "amp_configs.custom_white_list names '", t,
                 "', which is not an op type keel has");
  }
  for (const std::string& t : c.custom_black_list)
    KEEL_ENFORCE(OpRegistry::Find(t) != nullptr, where, "amp_configs.custom_black_list names '", t,
                 "', which is not an op type keel has");
}

MixedPrecisionOptimizer::MixedPrecisionOptimizer(const optimizer::Optimizer& opt, AmpConfig config)
    : opt_(opt.Clone()), config_(std::move(config)) {
  ValidateAmpConfig(config_, "amp::decorate: ");
}

std::vector<ParamGrad> MixedPrecisionOptimizer::backward(Var loss, Program* startup,
                                                         const std::set<std::string>& no_grad_set) {
  KEEL_ENFORCE(loss.valid(), "amp::decorate(", opt_->type(), "): minimize needs a loss variable");
  KEEL_ENFORCE(loss_scaling_.empty() && found_inf_.empty(),
               "amp::decorate: backward was already called on this optimizer");
  if (!startup) startup = &default_startup_program();
  Program& main = *loss.block()->program();
  Block& block = main.global_block();

  transpiler::AmpOptions options;
  options.dtype = config_.dtype;
  options.place = config_.place;
  options.check_kernels = config_.check_kernels;
  options.white_list = config_.custom_white_list;
  options.black_list = config_.custom_black_list;
  options.o2 = config_.level == "O2";
  transpiler::AmpPass pass(options);
  pass.Apply(main, *startup);
  for (const std::string& p : pass.o2_params()) masters_[p] = transpiler::AmpMasterName(p);

  // The ops that extend the loss (its float32 cast, its scaling) are forward ops of the loss's
  // pipeline stage, when it has one.
  const OpDesc* loss_writer = nullptr;
  for (size_t i = block.num_ops(); i-- > 0 && loss_writer == nullptr;) {
    const auto outs = block.op(i)->OutputArgumentNames();
    if (std::find(outs.begin(), outs.end(), loss.name()) != outs.end()) loss_writer = block.op(i);
  }
  auto on_loss_stage = [&](OpDesc* op) {
    if (loss_writer != nullptr && loss_writer->HasAttr(kOpDeviceAttr))
      op->SetAttr(kOpDeviceAttr, loss_writer->GetAttr(kOpDeviceAttr));
  };
  Var target = loss;
  if (loss.dtype() != DType::kFloat32) {
    // A loss computed in low precision (a white op at the end): backward starts in float32.
    const std::string f32 = main.UniqueName(loss.name() + ".cast_fp32");
    on_loss_stage(AppendOp(block, "cast", {{"X", {loss.name()}}}, {{"Out", {f32}}},
                           {{"in_dtype", static_cast<int>(loss.dtype())},
                            {"out_dtype", static_cast<int>(DType::kFloat32)}}));
    target = Var(&block, f32);
  }
  const bool scaled = ScalesLoss(config_);
  if (scaled) {
    const float init = config_.init_loss_scaling.value_or(65536.0f);
    loss_scaling_ = AddState(main, *startup, "loss_scaling", DType::kFloat32, init);
    const std::string s = main.UniqueName(target.name() + "@SCALED");
    on_loss_stage(AppendOp(block, "elementwise_mul",
                           {{"X", {target.name()}}, {"Y", {loss_scaling_}}}, {{"Out", {s}}}, {}));
    target = Var(&block, s);
  }

  std::vector<ParamGrad> pg = opt_->backward(target, no_grad_set);
  if (!scaled) return pg;

  std::vector<std::string> grads;
  for (const ParamGrad& p : pg) grads.push_back(p.second);
  found_inf_ = main.UniqueName("find_infinite");
  VarDesc* flag = block.Var(found_inf_);
  flag->set_stop_gradient(true);
  AppendOp(block, "check_finite_and_unscale", {{"X", grads}, {"Scale", {loss_scaling_}}},
           {{"Out", grads}, {"FoundInfinite", {found_inf_}}}, {{kOpRoleAttr, kOptimize}});
  if (config_.use_dynamic_loss_scaling.value_or(true)) {
    good_steps_ = AddState(main, *startup, "num_good_steps", DType::kInt32, 0);
    bad_steps_ = AddState(main, *startup, "num_bad_steps", DType::kInt32, 0);
    AppendOp(block, "update_loss_scaling",
             {{"FoundInfinite", {found_inf_}},
              {"PrevLossScaling", {loss_scaling_}},
              {"InGoodSteps", {good_steps_}},
              {"InBadSteps", {bad_steps_}}},
             {{"LossScaling", {loss_scaling_}},
              {"OutGoodSteps", {good_steps_}},
              {"OutBadSteps", {bad_steps_}}},
             {{"incr_every_n_steps", config_.incr_every_n_steps},
              {"decr_every_n_nan_or_inf", config_.decr_every_n_nan_or_inf},
              {"incr_ratio", config_.incr_ratio},
              {"decr_ratio", config_.decr_ratio},
              {kOpRoleAttr, kOptimize}});
  }
  // The running count of skipped steps (float32: exact to 2^24, and every device adds floats):
  // skipped += float(found_inf). What TensorBoard's amp/skipped_steps shows; a checkpoint keeps it.
  skipped_steps_ = AddState(main, *startup, "num_skipped_steps", DType::kFloat32, 0);
  const std::string inc = main.UniqueName(found_inf_ + ".cast_fp32");
  block.Var(inc)->set_stop_gradient(true);
  AppendOp(block, "cast", {{"X", {found_inf_}}}, {{"Out", {inc}}},
           {{"in_dtype", static_cast<int>(DType::kBool)},
            {"out_dtype", static_cast<int>(DType::kFloat32)},
            {kOpRoleAttr, kOptimize}});
  AppendOp(block, "elementwise_add", {{"X", {skipped_steps_}}, {"Y", {inc}}},
           {{"Out", {skipped_steps_}}}, {{kOpRoleAttr, kOptimize}});
  return pg;
}

LossScalingVars FindLossScalingVars(const Program& program) {
  LossScalingVars v;
  for (int b = 0; b < program.num_blocks(); ++b) {
    const Block& block = program.block(b);
    for (size_t i = 0; i < block.num_ops(); ++i) {
      const OpDesc* op = block.op(i);
      if (op->type() == "check_finite_and_unscale" && v.loss_scaling.empty()) {
        v.loss_scaling = op->Input("Scale")[0];
        v.found_inf = op->Output("FoundInfinite")[0];
      } else if (op->type() == "cast" && !v.found_inf.empty() && op->Input("X")[0] == v.found_inf &&
                 i + 1 < block.num_ops()) {
        // backward()'s counter: cast(found_inf) then skipped += it, in place.
        const OpDesc* add = block.op(i + 1);
        if (add->type() == "elementwise_add" && add->Input("Y")[0] == op->Output("Out")[0] &&
            add->Input("X")[0] == add->Output("Out")[0])
          v.skipped_steps = add->Output("Out")[0];
      }
    }
  }
  return v;
}

void MixedPrecisionOptimizer::apply_gradients(const std::vector<ParamGrad>& params_grads,
                                              Program* startup) {
  if (!found_inf_.empty()) opt_->set_skip_update(found_inf_);
  if (config_.level == "O2") {
    // The low-precision gradients of O2 go to the updates as they are: a clip or an L2 decay
    // of them is not built.
    KEEL_ENFORCE(!opt_->has_grad_clip(), "amp::decorate(", opt_->type(),
                 "): amp_configs.level=O2 does not combine with the optimizer's gradient clip "
                 "(set_grad_clip / --clip_global_norm): clipping the float16/bfloat16 gradients of "
                 "low-precision parameters is not built; use level O1");
    KEEL_ENFORCE(opt_->weight_decay() == 0, "amp::decorate(", opt_->type(),
                 "): amp_configs.level=O2 does not combine with the optimizer's L2 weight decay "
                 "(set_weight_decay / --weight_decay) of ",
                 opt_->weight_decay(),
                 ": the decay would be computed from the low-precision parameter, not its float32 "
                 "master; use AdamW's decoupled decay (computed on the master) or level O1");
    opt_->set_master_params(masters_);
  }
  opt_->apply_gradients(params_grads, startup);
}

std::vector<ParamGrad> MixedPrecisionOptimizer::minimize(Var loss, Program* startup,
                                                         const std::set<std::string>& no_grad_set) {
  auto pg = backward(loss, startup, no_grad_set);
  apply_gradients(pg, startup);
  return pg;
}

int UseLowPrecisionParamsIn(const Program& main, Program& test) {
  Block& tb = test.global_block();
  const Block& mb = main.global_block();
  std::vector<std::string> changed;
  for (VarDesc* v : tb.AllVars()) {
    const VarDesc* m = mb.FindVar(v->name());
    if (!v->is_parameter() || m == nullptr || v->dtype() != DType::kFloat32) continue;
    if (m->dtype() == DType::kBFloat16 || m->dtype() == DType::kFloat16)
      changed.push_back(v->name());
  }
  for (const std::string& p : changed) {
    VarDesc* v = tb.MustFindVar(p);
    const std::string f32 = test.UniqueName(p + ".cast_fp32");
    VarDesc* c = tb.Var(f32);
    c->set_shape(v->shape());
    c->set_dtype(DType::kFloat32);
    c->set_stop_gradient(true);
    for (size_t i = 0; i < tb.num_ops(); ++i) {
      OpDesc* op = tb.op(i);
      for (const auto& [slot, args] : op->inputs()) {
        std::vector<std::string> renamed = args;
        bool hit = false;
        for (std::string& a : renamed)
          if (a == p) {
            a = f32;
            hit = true;
          }
        if (hit) op->SetInput(slot, renamed);
      }
    }
    v->set_dtype(mb.FindVar(p)->dtype());
    OpDesc* cast = tb.InsertOp(0, "cast");
    cast->SetInput("X", {p});
    cast->SetOutput("Out", {f32});
    cast->SetAttr("in_dtype", static_cast<int>(v->dtype()));
    cast->SetAttr("out_dtype", static_cast<int>(DType::kFloat32));
    cast->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kForward));
    InferShapeAtBuild(cast, &tb);
  }
  if (!changed.empty()) test.Touch();
  return static_cast<int>(changed.size());
}

MixedPrecisionOptimizer decorate(const optimizer::Optimizer& opt, AmpConfig config) {
  return MixedPrecisionOptimizer(opt, std::move(config));
}

}  // namespace amp
}  // namespace keel
