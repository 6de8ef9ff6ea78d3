#include "framework/dsl/optimizer.h"

namespace keel {
namespace optimizer {

std::vector<ParamGrad> Optimizer::backward(Var loss, const std::set<std::string>& no_grad_set) {
  KEEL_ENFORCE(loss.valid(), type(), ": minimize needs a loss variable");
  return append_backward(*loss.block()->program(), loss.name(), no_grad_set);
}

void Optimizer::apply_gradients(const std::vector<ParamGrad>& params_grads, Program* startup) {
  if (!startup) startup = &default_startup_program();
  Program& main = default_main_program();
  KEEL_ENFORCE(!params_grads.empty(), type(), ": no parameter receives a gradient from the loss");
  std::string lr = main.UniqueName("learning_rate");
  for (Program* p : {&main, startup}) {
    VarDesc* v = p->global_block().Var(lr);
    v->set_shape({1});
    v->set_dtype(DType::kFloat32);
    v->set_persistable(true);
    v->set_stop_gradient(true);
  }
  AppendOp(startup->global_block(), "fill_constant", {}, {{"Out", {lr}}},
           {{"shape", std::vector<int64_t>{1}},
            {"dtype", static_cast<int>(DType::kFloat32)},
            {"value", learning_rate_}});
  for (auto& pg : params_grads) AppendUpdateOp(main.global_block(), pg, lr);
}

std::vector<ParamGrad> Optimizer::minimize(Var loss, Program* startup,
                                           const std::set<std::string>& no_grad_set) {
  auto pg = backward(loss, no_grad_set);
  apply_gradients(pg, startup);
  return pg;
}

void SGD::AppendUpdateOp(Block& block, const ParamGrad& pg, const std::string& lr) {
  AppendOp(block, "sgd",
           {{"Param", {pg.first}}, {"Grad", {pg.second}}, {"LearningRate", {lr}}},
           {{"ParamOut", {pg.first}}},
           {{kOpRoleAttr, static_cast<int>(OpRole::kOptimize)},
            {kOpRoleVarAttr, std::vector<std::string>{pg.first, pg.second}}});
}

}  // namespace optimizer
}  // namespace keel
