// The kernels of the tensor-creation ops (tensor_ops.cc has the ops and their shapes):
// fill_constant, fill_zeros_like, uniform_random, gaussian_random and cast, once for every device
// (ops/device.h); reshape is CopyKernel.
//
// The random ops draw on the host with the CPU's generator (ops/random_fill.h) on every device:
// they are initializers that run once in the startup program, and so one seed gives bit-identical
// parameters on CPUPlace and CUDAPlace, which a Philox redraw on the device would not.
#pragma once

#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "ops/device.h"
#include "ops/random_fill.h"

namespace keel {

template <typename D, typename T>
class FillConstantKernel : public OpKernel {
 public:
  explicit FillConstantKernel(const OpDesc& op) : value_(static_cast<T>(op.Attr<float>("value"))) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Out");
    Device<D>::Fill(ctx, out->mutable_data<T>(ctx.place()), out->numel(), value_);
  }

 private:
  T value_;
};

template <typename D, typename T>
class FillZerosLikeKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Out");
    Device<D>::Zero(ctx, out->mutable_data<T>(ctx.place()), out->numel());
  }
};

// out ~ U[min, max).
template <typename D, typename T>
class UniformRandomKernel : public OpKernel {
 public:
  explicit UniformRandomKernel(const OpDesc& op)
      : min_(op.Attr<float>("min")), max_(op.Attr<float>("max")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Out");
    std::mt19937_64& e = engine_.Get(ctx.seed());
    Device<D>::FromHost(ctx, out->mutable_data<T>(ctx.place()), out->numel(), &host_,
                        [&](T* p, int64_t n) { FillUniform(e, min_, max_, p, n); });
  }

 private:
  double min_, max_;
  SeededEngine engine_;
  std::vector<T> host_;  // CUDA's staging
};

// out ~ N(mean, std^2), by Box-Muller: two normals from two uniforms.
template <typename D, typename T>
class GaussianRandomKernel : public OpKernel {
 public:
  explicit GaussianRandomKernel(const OpDesc& op)
      : mean_(op.Attr<float>("mean")), std_(op.Attr<float>("std")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Out");
    std::mt19937_64& e = engine_.Get(ctx.seed());
    Device<D>::FromHost(ctx, out->mutable_data<T>(ctx.place()), out->numel(), &host_,
                        [&](T* p, int64_t n) { FillGaussian(e, mean_, std_, p, n); });
  }

 private:
  double mean_, std_;
  SeededEngine engine_;
  std::vector<T> host_;  // CUDA's staging
};

// The device math: CastMath<D>::Run<In, Out>(ctx, src, dst, n), dst[i] = ConvertTo<Out>(src[i])
// (framework/runtime/float16.h: static_cast, through float32 for the 16-bit types; float -> int
// truncates; nonzero -> true), In and Out different types.
template <typename D>
struct CastMath;

// f(T{}) for the C++ type of `t`: VisitDType's compute types and the 16-bit floats.
template <typename F>
void VisitCastType(DType t, F&& f) {
  switch (t) {
    case DType::kFloat16:
      return f(float16{});
    case DType::kBFloat16:
      return f(bfloat16{});
    default:
      VisitDType(t, f);
  }
}

// out = in converted to `to`, In being in's C++ type; a copy when the types agree.
template <typename D, typename In>
void CastInto(const ExecutionContext& ctx, const Tensor& in, DType to, Tensor* out) {
  VisitCastType(to, [&](auto zero) {
    using Out = decltype(zero);
    const In* src = in.data<In>();
    Out* dst = out->mutable_data<Out>(ctx.place());
    if constexpr (std::is_same_v<In, Out>) {
      Device<D>::Copy(ctx, src, dst, in.numel());
    } else {
      CastMath<D>::template Run<In, Out>(ctx, src, dst, in.numel());
    }
  });
}

template <typename D, typename In>
class CastKernel : public OpKernel {
 public:
  explicit CastKernel(const OpDesc& op)
      : out_dtype_(static_cast<DType>(op.Attr<int>("out_dtype"))) {}
  void Compute(ExecutionContext& ctx) override {
    CastInto<D, In>(ctx, ctx.Input("X"), out_dtype_, ctx.Output("Out"));
  }

 private:
  DType out_dtype_;
};

// dx = cast(dout) back to X's dtype; In is Out's dtype.
template <typename D, typename In>
class CastGradKernel : public OpKernel {
 public:
  explicit CastGradKernel(const OpDesc& op) : in_dtype_(op.Attr<int>("in_dtype")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "X");
    if (dx == nullptr) return;
    const DType to = in_dtype_ == -1 ? ctx.Input("X").dtype() : static_cast<DType>(in_dtype_);
    CastInto<D, In>(ctx, ctx.Input(GradVarName("Out")), to, dx);
  }

 private:
  int in_dtype_;
};

}  // namespace keel
