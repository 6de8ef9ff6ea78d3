// The learning-rate schedules of lr_schedule (formulas in ops/lr_schedule_ops.cc), shared by its
// CPU kernel and its CUDA twin, which computes the rate on the device from the device step counter
// so an update never waits for the host. Computed in double.
#pragma once

#include <string>

#include "framework/ir/program.h"
#include "ops/functors/hd.h"

namespace keel {
namespace fn {

struct LrSchedule {
  enum Type { kConstant = 0, kPiecewise = 1, kCosine = 2 };
  int type = kConstant;
  double base_lr = 0, min_lr = 0;
  const int* boundaries = nullptr;  // piecewise: num_boundaries ascending steps
  const float* values = nullptr;    // piecewise: num_boundaries + 1 rates
  int num_boundaries = 0;
  int total_steps = 0, warmup_steps = 0;
  double warmup_start_lr = 0, warmup_end_lr = -1;

  // The schedule without warm-up at step s >= 0.
  KEEL_HD double Schedule(double s) const {
    if (type == kPiecewise) {
      int k = 0;
      while (k < num_boundaries && s >= boundaries[k]) ++k;
      return values[k];
    }
    if (type == kCosine) {
      const double t = (s < total_steps ? s : static_cast<double>(total_steps)) / total_steps;
      return min_lr + (base_lr - min_lr) * (1 + cos(3.14159265358979323846 * t)) / 2;
    }
    return base_lr;
  }
  // The rate at counter value `step` (clamped below at 0), warm-up included, as float32.
  KEEL_HD float operator()(double step) const {
    const double s = step > 0.0 ? step : 0.0;
    double lr;
    if (s < warmup_steps) {
      const double end = warmup_end_lr >= 0 ? warmup_end_lr : Schedule(warmup_steps);
      lr = warmup_start_lr + (end - warmup_start_lr) * s / warmup_steps;
    } else {
      lr = Schedule(s);
    }
    return static_cast<float>(lr);
  }
};

}  // namespace fn

// The schedule of an lr_schedule op's attrs; boundaries and values are left for the caller to
// point at its own copies (host or device memory).
inline fn::LrSchedule MakeLrSchedule(const OpDesc& op) {
  fn::LrSchedule f;
  const std::string& type = op.Attr<std::string>("type");
  f.type = type == "piecewise" ? fn::LrSchedule::kPiecewise
           : type == "cosine"  ? fn::LrSchedule::kCosine
                               : fn::LrSchedule::kConstant;
  f.base_lr = op.Attr<float>("base_lr");
  f.min_lr = op.Attr<float>("min_lr");
  f.num_boundaries = static_cast<int>(op.Attr<std::vector<int>>("boundaries").size());
  f.total_steps = op.Attr<int>("total_steps");
  f.warmup_steps = op.Attr<int>("warmup_steps");
  f.warmup_start_lr = op.Attr<float>("warmup_start_lr");
  f.warmup_end_lr = op.Attr<float>("warmup_end_lr");
  return f;
}

}  // namespace keel
