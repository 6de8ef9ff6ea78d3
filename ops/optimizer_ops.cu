// CUDA twins of optimizer_ops.cc's sgd, momentum, adam and adamw: one launch per parameter (one
// per fused buffer when gradients are coalesced), the per-element math from
// ops/functors/optimizer_functors.h. LearningRate and the beta powers stay on the device: the
// kernel reads them, so an update never waits for the host.
#include "ops/cuda_util.cuh"
#include "ops/functors/optimizer_functors.h"

namespace keel {
namespace {

template <typename T>
void EnforceLike(const ExecutionContext& ctx, const Tensor& param, const char* slot) {
  const Tensor& t = ctx.Input(slot);
  KEEL_ENFORCE(t.numel() == param.numel(), ctx.op().type(), ": Param ", param.dims().str(), " and ",
               slot, " ", t.dims().str(), " must have the same shape");
}

template <typename T>
class SgdKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& param = ctx.Input("Param");
    EnforceLike<T>(ctx, param, "Grad");
    const T* lr = ctx.Input("LearningRate").data<T>();
    const T* p = param.data<T>();
    const T* g = ctx.Input("Grad").data<T>();
    T* po = ctx.Output("ParamOut")->mutable_data<T>(ctx.place());
    ForEach(ctx, param.numel(),
            [=] __device__(int64_t i) { po[i] = fn::SgdUpdate(p[i], g[i], *lr); });
  }
};

template <typename T>
class MomentumKernel : public OpKernel {
 public:
  explicit MomentumKernel(const OpDesc& op)
      : f_{static_cast<T>(op.Attr<float>("mu")), op.Attr<bool>("use_nesterov")} {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& param = ctx.Input("Param");
    EnforceLike<T>(ctx, param, "Grad");
    EnforceLike<T>(ctx, param, "Velocity");
    const T* lr = ctx.Input("LearningRate").data<T>();
    const T* p = param.data<T>();
    const T* g = ctx.Input("Grad").data<T>();
    const T* v = ctx.Input("Velocity").data<T>();
    T* vo = ctx.Output("VelocityOut")->mutable_data<T>(ctx.place());
    T* po = ctx.Output("ParamOut")->mutable_data<T>(ctx.place());
    const fn::Momentum<T> f = f_;
    ForEach(ctx, param.numel(),
            [=] __device__(int64_t i) { f(p[i], g[i], v[i], *lr, &po[i], &vo[i]); });
  }

 private:
  fn::Momentum<T> f_;
};

// Reads a one-element float32/float64 device scalar as double.
struct DeviceScalar {
  const void* p;
  bool is_double;
  __device__ double Get() const {
    return is_double ? *static_cast<const double*>(p) : *static_cast<const float*>(p);
  }
};
DeviceScalar ScalarOf(const Tensor& t) {
  KEEL_ENFORCE(t.numel() == 1, "expected one element, got ", t.dims().str());
  return DeviceScalar{t.raw_data(), t.dtype() == DType::kFloat64};
}

template <typename T>
__global__ void BetaPowUpdate(DeviceScalar b1p, DeviceScalar b2p, void* b1o, void* b2o,
                              double beta1, double beta2) {
  const double v1 = b1p.Get() * beta1, v2 = b2p.Get() * beta2;
  if (b1p.is_double)
    *static_cast<double*>(b1o) = v1;
  else
    *static_cast<float*>(b1o) = static_cast<float>(v1);
  if (b2p.is_double)
    *static_cast<double*>(b2o) = v2;
  else
    *static_cast<float*>(b2o) = static_cast<float>(v2);
}

// Adam (coeff 0) and AdamW. Every thread derives the step's scalars in double from the device
// lr and beta powers (cheap next to the memory traffic), then updates its elements.
template <typename T>
class AdamKernel : public OpKernel {
 public:
  explicit AdamKernel(const OpDesc& op) : AdamKernel(op, 0.0) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& param = ctx.Input("Param");
    EnforceLike<T>(ctx, param, "Grad");
    EnforceLike<T>(ctx, param, "Moment1");
    EnforceLike<T>(ctx, param, "Moment2");
    const DeviceScalar lr = ScalarOf(ctx.Input("LearningRate"));
    const DeviceScalar b1p = ScalarOf(ctx.Input("Beta1Pow"));
    const DeviceScalar b2p = ScalarOf(ctx.Input("Beta2Pow"));
    const T* p = param.data<T>();
    const T* g = ctx.Input("Grad").data<T>();
    const T* m1 = ctx.Input("Moment1").data<T>();
    const T* m2 = ctx.Input("Moment2").data<T>();
    T* m1o = ctx.Output("Moment1Out")->mutable_data<T>(ctx.place());
    T* m2o = ctx.Output("Moment2Out")->mutable_data<T>(ctx.place());
    T* po = ctx.Output("ParamOut")->mutable_data<T>(ctx.place());
    const double beta1 = beta1_, beta2 = beta2_, eps = epsilon_, coeff = coeff_;
    ForEach(ctx, param.numel(), [=] __device__(int64_t i) {
      const fn::Adam<T> f =
          fn::AdamStep<T>(lr.Get(), b1p.Get(), b2p.Get(), beta1, beta2, eps, coeff);
      f(p[i], g[i], m1[i], m2[i], &po[i], &m1o[i], &m2o[i]);
    });
    // Beta powers advance after every thread has read them (stream order: the next launch).
    Tensor* b1o = ctx.Output("Beta1PowOut");
    Tensor* b2o = ctx.Output("Beta2PowOut");
    void* b1d = b1o->mutable_data(ctx.Input("Beta1Pow").dtype(), ctx.place());
    void* b2d = b2o->mutable_data(ctx.Input("Beta2Pow").dtype(), ctx.place());
    BetaPowUpdate<T><<<1, 1, 0, Cuda(ctx).stream()>>>(b1p, b2p, b1d, b2d, beta1_, beta2_);
    KEEL_CUDA_LAUNCH_CHECK();
  }

 protected:
  AdamKernel(const OpDesc& op, double coeff)
      : beta1_(op.Attr<float>("beta1")),
        beta2_(op.Attr<float>("beta2")),
        epsilon_(op.Attr<float>("epsilon")),
        coeff_(coeff) {}

 private:
  double beta1_, beta2_, epsilon_, coeff_;
};

template <typename T>
class AdamWKernel : public AdamKernel<T> {
 public:
  explicit AdamWKernel(const OpDesc& op) : AdamKernel<T>(op, op.Attr<float>("coeff")) {}
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(sgd, SgdKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(momentum, MomentumKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(adam, AdamKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(adamw, AdamWKernel, float, double);

}  // namespace keel
