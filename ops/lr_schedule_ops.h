// The kernels of increment and lr_schedule (lr_schedule_ops.cc has the ops, their shapes and the
// formulas), once for every device (ops/device.h). Both compute where the step counter lives: on
// CUDA a one-thread launch, so a training step never waits for the host to learn its learning
// rate. The schedule is fn::LrSchedule.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/device.h"
#include "ops/functors/lr_schedule_functors.h"

namespace keel {

// Out = X + step.
template <typename D, typename T>
class IncrementKernel : public OpKernel {
 public:
  explicit IncrementKernel(const OpDesc& op) : step_(static_cast<T>(op.Attr<float>("step"))) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    KEEL_ENFORCE(x.numel() == 1, "X must hold one element, got ", x.dims().str());
    const T* xp = x.data<T>();
    T* op = ctx.Output("Out")->mutable_data<T>(ctx.place());
    const T step = step_;
    Device<D>::ForEach(ctx, 1, [=] KEEL_HD_LAMBDA(int64_t) { op[0] = xp[0] + step; });
  }

 private:
  T step_;
};

// LearningRate = lr(Step), computed in double, written as float32. The piecewise boundaries and
// values are one table of int32 (the values as float bits) that the device reads, uploaded on
// the first run.
template <typename D, typename T>
class LrScheduleKernel : public OpKernel {
 public:
  explicit LrScheduleKernel(const OpDesc& op)
      : f_(MakeLrSchedule(op)),
        boundaries_(op.Attr<std::vector<int>>("boundaries")),
        values_(op.Attr<std::vector<float>>("values")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& step = ctx.Input("Step");
    KEEL_ENFORCE(step.numel() == 1, "Step must hold one element, got ", step.dims().str());
    if (f_.type == fn::LrSchedule::kPiecewise && f_.values == nullptr) {
      KEEL_ENFORCE(values_.size() == boundaries_.size() + 1,
                   "piecewise needs one more value than boundaries, got ", boundaries_.size(),
                   " boundaries and ", values_.size(), " values");
      const int64_t nb = static_cast<int64_t>(boundaries_.size());
      table_.assign(2 * nb + 1, 0);  // boundaries, then values as float bits
      for (int64_t k = 0; k < nb; ++k) table_[k] = boundaries_[k];
      static_assert(sizeof(float) == sizeof(int32_t), "float is 32 bits");
      std::memcpy(table_.data() + nb, values_.data(), values_.size() * sizeof(float));
      const int32_t* d = static_cast<const int32_t*>(
          Device<D>::Upload(ctx, table_.data(), table_.size() * sizeof(int32_t), &device_table_));
      f_.boundaries = d;
      f_.values = reinterpret_cast<const float*>(d + nb);
    }
    const fn::LrSchedule f = f_;
    const T* s = step.data<T>();
    float* lr = ctx.Output("LearningRate")->mutable_data<float>(ctx.place());
    Device<D>::ForEach(ctx, 1,
                       [=] KEEL_HD_LAMBDA(int64_t) { lr[0] = f(static_cast<double>(s[0])); });
  }

 private:
  fn::LrSchedule f_;
  std::vector<int> boundaries_;
  std::vector<float> values_;
  std::vector<int32_t> table_;  // on the host
  Tensor device_table_;         // CUDA's copy of table_
};

}  // namespace keel
