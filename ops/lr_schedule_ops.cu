// CUDA twins of lr_schedule_ops.cc: increment and lr_schedule compute on the device from the
// device step counter (one thread each), so a training step never waits for the host to learn
// its learning rate. The schedule's formulas are fn::LrSchedule, shared with the CPU kernel.
#include <cstring>
#include <vector>

#include "framework/runtime/device.h"
#include "ops/cuda_util.cuh"
#include "ops/functors/lr_schedule_functors.h"

namespace keel {
namespace {

// Out = X + step.
template <typename T>
class IncrementKernel : public OpKernel {
 public:
  explicit IncrementKernel(const OpDesc& op) : step_(static_cast<T>(op.Attr<float>("step"))) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    KEEL_ENFORCE(x.numel() == 1, "X must hold one element, got ", x.dims().str());
    const T* xp = x.data<T>();
    T* op = ctx.Output("Out")->mutable_data<T>(ctx.place());
    const T step = step_;
    ForEach(ctx, 1, [=] __device__(int64_t) { op[0] = xp[0] + step; });
  }

 private:
  T step_;
};

template <typename T>
__global__ void LrScheduleOne(fn::LrSchedule f, const T* step, float* lr) {
  *lr = f(static_cast<double>(*step));
}

// The piecewise boundaries and values live in one device buffer, copied on the first run.
template <typename T>
class LrScheduleKernel : public OpKernel {
 public:
  explicit LrScheduleKernel(const OpDesc& op)
      : f_(MakeLrSchedule(op)),
        boundaries_(op.Attr<std::vector<int>>("boundaries")),
        values_(op.Attr<std::vector<float>>("values")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& step = ctx.Input("Step");
    KEEL_ENFORCE(step.numel() == 1, "Step must hold one element, got ", step.dims().str());
    if (f_.type == fn::LrSchedule::kPiecewise && !table_.initialized()) {
      KEEL_ENFORCE(values_.size() == boundaries_.size() + 1,
                   "piecewise needs one more value than boundaries, got ", boundaries_.size(),
                   " boundaries and ", values_.size(), " values");
      const int64_t nb = static_cast<int64_t>(boundaries_.size());
      std::vector<int32_t> host(2 * nb + 1);  // boundaries, then values as float bits
      for (int64_t k = 0; k < nb; ++k) host[k] = boundaries_[k];
      static_assert(sizeof(float) == sizeof(int32_t), "float is 32 bits");
      std::memcpy(host.data() + nb, values_.data(), values_.size() * sizeof(float));
      int32_t* d =
          static_cast<int32_t*>(table_.Alloc(DType::kInt32, DDim{2 * nb + 1}, ctx.place()));
      CopyHostToDeviceAsync(ctx.place(), d, host.data(), host.size() * sizeof(int32_t));
      f_.boundaries = d;
      f_.values = reinterpret_cast<const float*>(d + nb);
    }
    float* lr = ctx.Output("LearningRate")->mutable_data<float>(ctx.place());
    LrScheduleOne<T><<<1, 1, 0, Cuda(ctx).stream()>>>(f_, step.data<T>(), lr);
    KEEL_CUDA_LAUNCH_CHECK();
  }

 private:
  fn::LrSchedule f_;
  std::vector<int> boundaries_;
  std::vector<float> values_;
  Tensor table_;  // on the device: boundaries, then values
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(increment, IncrementKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(lr_schedule, LrScheduleKernel, float, double, int64_t);

}  // namespace keel
