// CUDA twins of tensor_ops.cc: fill_constant, fill_zeros_like, uniform_random, gaussian_random,
// cast, reshape.
//
// The random ops draw on the host with the CPU kernel's own generator (ops/random_fill.h) and
// copy the values to the device without waiting (staged through pinned memory): they are
// initializers that run once in the startup program, and so one seed gives bit-identical
// parameters on CPUPlace and CUDAPlace, which a Philox redraw on the device would not.
#include <type_traits>
#include <vector>

#include "framework/runtime/device.h"
#include "ops/cuda_util.cuh"
#include "ops/random_fill.h"

namespace keel {
namespace {

// ---------------------------------------------------------------- fill_constant, fill_zeros_like

template <typename T>
class FillConstantKernel : public OpKernel {
 public:
  explicit FillConstantKernel(const OpDesc& op) : value_(static_cast<T>(op.Attr<float>("value"))) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Out");
    T* p = out->mutable_data<T>(ctx.place());
    const T v = value_;
    ForEach(ctx, out->numel(), [=] __device__(int64_t i) { p[i] = v; });
  }

 private:
  T value_;
};

template <typename T>
class FillZerosLikeKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Out");
    T* p = out->mutable_data<T>(ctx.place());
    if (out->numel() > 0)
      KEEL_CUDA_CHECK(cudaMemsetAsync(p, 0, out->numel() * sizeof(T), Cuda(ctx).stream()));
  }
};

// ---------------------------------------------------------------- uniform_random, gaussian_random

// Draws into host_ with `fill`, then copies to the device output.
template <typename T, typename Fill>
void DrawOnHostAndCopy(ExecutionContext& ctx, std::vector<T>* host, Fill fill) {
  Tensor* out = ctx.Output("Out");
  T* p = out->mutable_data<T>(ctx.place());
  host->resize(out->numel());
  fill(host->data(), out->numel());
  if (out->numel() > 0) CopyHostToDeviceAsync(ctx.place(), p, host->data(), out->nbytes());
}

template <typename T>
class UniformRandomKernel : public OpKernel {
 public:
  explicit UniformRandomKernel(const OpDesc& op)
      : min_(op.Attr<float>("min")), max_(op.Attr<float>("max")) {}
  void Compute(ExecutionContext& ctx) override {
    std::mt19937_64& e = engine_.Get(ctx.seed());
    DrawOnHostAndCopy<T>(ctx, &host_, [&](T* p, int64_t n) { FillUniform(e, min_, max_, p, n); });
  }

 private:
  double min_, max_;
  SeededEngine engine_;
  std::vector<T> host_;
};

template <typename T>
class GaussianRandomKernel : public OpKernel {
 public:
  explicit GaussianRandomKernel(const OpDesc& op)
      : mean_(op.Attr<float>("mean")), std_(op.Attr<float>("std")) {}
  void Compute(ExecutionContext& ctx) override {
    std::mt19937_64& e = engine_.Get(ctx.seed());
    DrawOnHostAndCopy<T>(ctx, &host_, [&](T* p, int64_t n) { FillGaussian(e, mean_, std_, p, n); });
  }

 private:
  double mean_, std_;
  SeededEngine engine_;
  std::vector<T> host_;
};

// ---------------------------------------------------------------- cast

// out[i] = static_cast<Out>(in[i]) (float -> int truncates; nonzero -> true), as the CPU kernel.
template <typename In, typename Out>
__global__ void CastElements(const In* in, Out* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(blockDim.x) * gridDim.x)
    out[i] = static_cast<Out>(in[i]);
}

template <typename In, typename Out>
void CastAs(const ExecutionContext& ctx, const Tensor& in, Tensor* out) {
  const In* src = in.data<In>();
  Out* dst = out->mutable_data<Out>(ctx.place());
  const int64_t n = in.numel();
  if constexpr (std::is_same_v<In, Out>) {
    CopyOnStream(ctx, src, dst, n);
  } else {
    if (n == 0) return;
    CastElements<In, Out><<<GridFor(n), 256, 0, Cuda(ctx).stream()>>>(src, dst, n);
    KEEL_CUDA_LAUNCH_CHECK();
  }
}

template <typename In>
void CastTo(const ExecutionContext& ctx, const Tensor& in, DType to, Tensor* out) {
  switch (to) {
    case DType::kFloat32:
      return CastAs<In, float>(ctx, in, out);
    case DType::kFloat64:
      return CastAs<In, double>(ctx, in, out);
    case DType::kInt32:
      return CastAs<In, int32_t>(ctx, in, out);
    case DType::kInt64:
      return CastAs<In, int64_t>(ctx, in, out);
    case DType::kBool:
      return CastAs<In, bool>(ctx, in, out);
    case DType::kUInt8:
      return CastAs<In, uint8_t>(ctx, in, out);
    case DType::kInt8:
      return CastAs<In, int8_t>(ctx, in, out);
    default:
      KEEL_THROW("cast: no CUDA cast to ", DTypeName(to));
  }
}

template <typename In>
class CastKernel : public OpKernel {
 public:
  explicit CastKernel(const OpDesc& op)
      : out_dtype_(static_cast<DType>(op.Attr<int>("out_dtype"))) {}
  void Compute(ExecutionContext& ctx) override {
    CastTo<In>(ctx, ctx.Input("X"), out_dtype_, ctx.Output("Out"));
  }

 private:
  DType out_dtype_;
};

// dx = cast(dout) back to X's dtype; In is Out's dtype.
template <typename In>
class CastGradKernel : public OpKernel {
 public:
  explicit CastGradKernel(const OpDesc& op) : in_dtype_(op.Attr<int>("in_dtype")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const DType to = in_dtype_ == -1 ? ctx.Input("X").dtype() : static_cast<DType>(in_dtype_);
    CastTo<In>(ctx, ctx.Input(GradVarName("Out")), to, dx);
  }

 private:
  int in_dtype_;
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(fill_constant, FillConstantKernel, float, double, int32_t, int64_t, bool);
KEEL_REGISTER_CUDA_KERNEL(fill_zeros_like, FillZerosLikeKernel, float, double, int32_t, int64_t,
                          bool);
KEEL_REGISTER_CUDA_KERNEL(uniform_random, UniformRandomKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(gaussian_random, GaussianRandomKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(cast, CastKernel, float, double, int32_t, int64_t, bool, uint8_t, int8_t);
KEEL_REGISTER_CUDA_KERNEL(cast_grad, CastGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(reshape, CudaCopyKernel, float, double, int32_t, int64_t, bool, uint8_t,
                          int8_t);
KEEL_REGISTER_CUDA_KERNEL(reshape_grad, CudaCopyGradKernel, float, double);

}  // namespace keel
