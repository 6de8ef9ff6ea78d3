// lr_schedule::: learning-rate schedules for optimizer::*. A schedule becomes an `increment` op on
// the persistable step counter @LR_DECAY_COUNTER@ and an `lr_schedule` op at the start of the
// optimizer section, so save_persistables/load_persistables carry the schedule's position. The
// first training step is step 0; the formulas are in ops/lr_schedule_ops.cc.
//
//   optimizer::Adam(lr_schedule::LinearWarmup(lr_schedule::Cosine(1e-3f, 10000), 500))
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "framework/ir/program.h"

namespace keel {
namespace lr_schedule {

// The persistable float32 [1] step counter every schedule of a program shares.
inline const std::string kCounterName = "@LR_DECAY_COUNTER@";

// The attrs of one lr_schedule op.
struct Schedule {
  std::string type = "constant";  // constant | piecewise | cosine
  float base_lr = 0;
  std::vector<int> boundaries;  // piecewise
  std::vector<float> values;    // piecewise, |boundaries| + 1
  int total_steps = 0;          // cosine
  float min_lr = 0;             // cosine
  int warmup_steps = 0;
  float warmup_start_lr = 0;
  float warmup_end_lr = -1;  // < 0: the schedule's value at warmup_steps

  std::map<std::string, Attribute> Attrs() const;
};

}  // namespace lr_schedule

// A learning rate: a constant or a schedule. Converts implicitly from either, so optimizers take
// `0.01f` or `lr_schedule::Cosine(...)` alike.
class LearningRate {
 public:
  LearningRate(float value) : value_(value) {}  // NOLINT: implicit by design
  LearningRate(lr_schedule::Schedule s) : value_(0), schedule_(std::move(s)) {}  // NOLINT

  bool is_schedule() const { return schedule_.has_value(); }
  // The constant rate; a keel::Error for a schedule.
  float value() const;
  // The schedule; a constant is returned as a "constant" schedule.
  lr_schedule::Schedule schedule() const;

 private:
  float value_;
  std::optional<lr_schedule::Schedule> schedule_;
};

namespace lr_schedule {

// values[k] from step boundaries[k-1] on: Piecewise({100, 200}, {1.0f, 0.5f, 0.1f}).
Schedule Piecewise(std::vector<int> boundaries, std::vector<float> values);
// base_lr at step 0 down to min_lr at total_steps along half a cosine; min_lr after.
Schedule Cosine(float base_lr, int total_steps, float min_lr = 0);
// Linear from start_lr at step 0 towards end_lr (default: lr's value at warmup_steps) over
// warmup_steps, then lr on the same step count (Paddle's linear_lr_warmup).
Schedule LinearWarmup(const LearningRate& lr, int warmup_steps, float start_lr = 0,
                      std::optional<float> end_lr = std::nullopt);

// Appends to `main` (and `startup`) what computes `lr` each step: for a constant, a persistable
// var filled once by startup; for a schedule, the shared counter (created and incremented once
// per program) and an lr_schedule op. Returns the [1] float32 learning-rate var's name.
std::string AppendLearningRate(const LearningRate& lr, Program& main, Program& startup);

}  // namespace lr_schedule
}  // namespace keel
