#include "framework/dsl/lr_schedule.h"

#include "framework/dsl/program_guard.h"

namespace keel {

float LearningRate::value() const {
  KEEL_ENFORCE(!is_schedule(), "the learning rate is a ", schedule_->type,
               " schedule, not a constant");
  return value_;
}

lr_schedule::Schedule LearningRate::schedule() const {
  if (schedule_) return *schedule_;
  lr_schedule::Schedule s;
  s.base_lr = value_;
  return s;
}

namespace lr_schedule {

namespace {

constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);

// A persistable, gradient-free float32 [1] var in main and startup.
void DeclareScalar(const std::string& name, Program& main, Program& startup) {
  for (Program* p : {&main, &startup}) {
    VarDesc* v = p->global_block().Var(name);
    v->set_shape({1});
    v->set_dtype(DType::kFloat32);
    v->set_persistable(true);
    v->set_stop_gradient(true);
  }
}

void FillInStartup(Program& startup, const std::string& name, float value) {
  AppendOp(startup.global_block(), "fill_constant", {}, {{"Out", {name}}},
           {{"shape", std::vector<int64_t>{1}},
            {"dtype", static_cast<int>(DType::kFloat32)},
            {"value", value}});
}

}  // namespace

std::map<std::string, Attribute> Schedule::Attrs() const {
  return {{"type", type},
          {"base_lr", base_lr},
          {"boundaries", boundaries},
          {"values", values},
          {"total_steps", total_steps},
          {"min_lr", min_lr},
          {"warmup_steps", warmup_steps},
          {"warmup_start_lr", warmup_start_lr},
          {"warmup_end_lr", warmup_end_lr}};
}

Schedule Piecewise(std::vector<int> boundaries, std::vector<float> values) {
  KEEL_ENFORCE(values.size() == boundaries.size() + 1,
               "lr_schedule::Piecewise needs one more value than boundaries, got ",
               boundaries.size(), " boundaries and ", values.size(), " values");
  Schedule s;
  s.type = "piecewise";
  s.boundaries = std::move(boundaries);
  s.values = std::move(values);
  return s;
}

Schedule Cosine(float base_lr, int total_steps, float min_lr) {
  KEEL_ENFORCE(total_steps > 0, "lr_schedule::Cosine needs total_steps > 0, got ", total_steps);
  Schedule s;
  s.type = "cosine";
  s.base_lr = base_lr;
  s.total_steps = total_steps;
  s.min_lr = min_lr;
  return s;
}

Schedule LinearWarmup(const LearningRate& lr, int warmup_steps, float start_lr,
                      std::optional<float> end_lr) {
  KEEL_ENFORCE(warmup_steps >= 0, "lr_schedule::LinearWarmup needs warmup_steps >= 0, got ",
               warmup_steps);
  Schedule s = lr.schedule();
  KEEL_ENFORCE(s.warmup_steps == 0, "lr_schedule::LinearWarmup: the schedule already warms up (",
               s.warmup_steps, " steps)");
  KEEL_ENFORCE(!end_lr || *end_lr >= 0, "lr_schedule::LinearWarmup needs end_lr >= 0, got ",
               end_lr.value_or(0));
  s.warmup_steps = warmup_steps;
  s.warmup_start_lr = start_lr;
  s.warmup_end_lr = end_lr.value_or(-1.0f);
  return s;
}

std::string AppendLearningRate(const LearningRate& lr, Program& main, Program& startup) {
  const std::string name = main.UniqueName("learning_rate");
  if (!lr.is_schedule()) {
    DeclareScalar(name, main, startup);
    FillInStartup(startup, name, lr.value());
    return name;
  }
  Block& block = main.global_block();
  if (!block.HasVar(kCounterName)) {
    // -1 so that the increment of the first run makes it 0.
    DeclareScalar(kCounterName, main, startup);
    FillInStartup(startup, kCounterName, -1.0f);
    AppendOp(block, "increment", {{"X", {kCounterName}}}, {{"Out", {kCounterName}}},
             {{"step", 1.0f}, {kOpRoleAttr, kOptimize}});
  }
  VarDesc* v = block.Var(name);
  v->set_stop_gradient(true);
  std::map<std::string, Attribute> attrs = lr.schedule().Attrs();
  attrs[kOpRoleAttr] = kOptimize;
  AppendOp(block, "lr_schedule", {{"Step", {kCounterName}}}, {{"LearningRate", {name}}}, attrs);
  return name;
}

}  // namespace lr_schedule
}  // namespace keel
