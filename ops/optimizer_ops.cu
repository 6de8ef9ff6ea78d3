// CUDA twins of optimizer_ops.cc: sgd, momentum, adam and adamw, one launch per parameter, the
// per-element math from ops/functors/optimizer_functors.h; squared_l2_norm and
// clip_by_global_norm, whose sums of squares run in double in a fixed order (per-block partials,
// then one block adds them), so they repeat bit for bit. LearningRate, the beta powers and the
// clip factor stay on the device: kernels read them, so an update never waits for the host.
//
// merged_sgd, merged_momentum, merged_adam and merged_adamw (the merge pass forms them from the
// per-parameter ops of a fused gradient group) update all their parameters in one multi-tensor
// launch: a table of per-parameter pointers goes to the device, blockIdx.y picks the parameter.
#include <vector>

#include "framework/runtime/device.h"
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
class SgdKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& param = ctx.Input("Param");
    EnforceLike<T>(ctx, param, "Grad");
    // The rate may be float32 for a float64 parameter, as item<T>() allows on the CPU.
    const DeviceScalar lr = ScalarOf(ctx.Input("LearningRate"));
    const T* p = param.data<T>();
    const T* g = ctx.Input("Grad").data<T>();
    T* po = ctx.Output("ParamOut")->mutable_data<T>(ctx.place());
    ForEach(ctx, param.numel(), [=] __device__(int64_t i) {
      po[i] = fn::SgdUpdate(p[i], g[i], static_cast<T>(lr.Get()));
    });
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
    // The rate may be float32 for a float64 parameter, as item<T>() allows on the CPU.
    const DeviceScalar lr = ScalarOf(ctx.Input("LearningRate"));
    const T* p = param.data<T>();
    const T* g = ctx.Input("Grad").data<T>();
    const T* v = ctx.Input("Velocity").data<T>();
    T* vo = ctx.Output("VelocityOut")->mutable_data<T>(ctx.place());
    T* po = ctx.Output("ParamOut")->mutable_data<T>(ctx.place());
    const fn::Momentum<T> f = f_;
    ForEach(ctx, param.numel(), [=] __device__(int64_t i) {
      f(p[i], g[i], v[i], static_cast<T>(lr.Get()), &po[i], &vo[i]);
    });
  }

 private:
  fn::Momentum<T> f_;
};


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

// ------------------------------------------------- merged_sgd, merged_momentum, merged_adam(w)

// One parameter of a multi-tensor launch: its element count and pointers (unused ones null).
template <typename T>
struct MtEntry {
  int64_t n;
  const T *p, *g, *a, *b;  // param, grad, accumulators (velocity or moment1, moment2)
  T *po, *ao, *bo;
  DeviceScalar b1p, b2p;  // adam's beta powers
  void *b1o, *b2o;
};

// f(entry, i) for every element i of parameter blockIdx.y.
template <typename T, typename F>
__global__ void MultiTensorKernel(const MtEntry<T>* table, F f) {
  const MtEntry<T>& e = table[blockIdx.y];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < e.n;
       i += int64_t(blockDim.x) * gridDim.x)
    f(e, i);
}

// Beta powers advance after every thread has read them: one thread per parameter.
template <typename T>
__global__ void MultiBetaPowUpdate(const MtEntry<T>* table, int count, double beta1, double beta2) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= count) return;
  const MtEntry<T>& e = table[t];
  const double v1 = e.b1p.Get() * beta1, v2 = e.b2p.Get() * beta2;
  if (e.b1p.is_double)
    *static_cast<double*>(e.b1o) = v1;
  else
    *static_cast<float*>(e.b1o) = static_cast<float>(v1);
  if (e.b2p.is_double)
    *static_cast<double*>(e.b2o) = v2;
  else
    *static_cast<float*>(e.b2o) = static_cast<float>(v2);
}

// Builds the table of a merged op's parameters and copies it to the device (staged, no wait).
template <typename T>
class MtTable {
 public:
  // Reads slot `in` (and writes `out`) of every parameter into member `a` or `b` of the entries.
  void Build(const ExecutionContext& ctx, const char* acc_a, const char* acc_a_out,
             const char* acc_b, const char* acc_b_out, bool beta_pows) {
    const int n = ctx.NumInputs("Param");
    host_.assign(n, MtEntry<T>{});
    max_n_ = 0;
    for (int i = 0; i < n; ++i) {
      MtEntry<T>& e = host_[i];
      const Tensor& param = ctx.Input("Param", i);
      e.n = param.numel();
      max_n_ = e.n > max_n_ ? e.n : max_n_;
      auto like = [&](const char* slot) -> const T* {
        const Tensor& t = ctx.Input(slot, i);
        KEEL_ENFORCE(t.numel() == param.numel(), ctx.op().type(), ": Param[", i, "] ",
                     param.dims().str(), " and ", slot, "[", i, "] ", t.dims().str(),
                     " must have the same shape");
        return t.data<T>();
      };
      e.p = param.data<T>();
      e.g = like("Grad");
      e.po = ctx.Output("ParamOut", i)->mutable_data<T>(ctx.place());
      if (acc_a) {
        e.a = like(acc_a);
        e.ao = ctx.Output(acc_a_out, i)->mutable_data<T>(ctx.place());
      }
      if (acc_b) {
        e.b = like(acc_b);
        e.bo = ctx.Output(acc_b_out, i)->mutable_data<T>(ctx.place());
      }
      if (beta_pows) {
        e.b1p = ScalarOf(ctx.Input("Beta1Pow", i));
        e.b2p = ScalarOf(ctx.Input("Beta2Pow", i));
        e.b1o = ctx.Output("Beta1PowOut", i)
                    ->mutable_data(ctx.Input("Beta1Pow", i).dtype(), ctx.place());
        e.b2o = ctx.Output("Beta2PowOut", i)
                    ->mutable_data(ctx.Input("Beta2Pow", i).dtype(), ctx.place());
      }
    }
    KEEL_ENFORCE(n <= 65535, ctx.op().type(), ": ", n, " parameters exceed one launch");
    const int64_t bytes = static_cast<int64_t>(n * sizeof(MtEntry<T>));
    if (!device_.initialized() || device_.numel() < bytes)
      device_.Alloc(DType::kUInt8, DDim{bytes}, ctx.place());
    CopyHostToDeviceAsync(ctx.place(), device_.raw_data(), host_.data(), bytes);
  }
  int count() const { return static_cast<int>(host_.size()); }
  const MtEntry<T>* device() const { return static_cast<const MtEntry<T>*>(device_.raw_data()); }
  dim3 Grid() const {
    const unsigned x = GridFor(max_n_);
    return dim3(x < 1024 ? x : 1024, static_cast<unsigned>(host_.size()));
  }

 private:
  std::vector<MtEntry<T>> host_;
  Tensor device_;
  int64_t max_n_ = 0;
};

template <typename T, typename F>
void LaunchMultiTensor(const ExecutionContext& ctx, const MtTable<T>& table, F f) {
  if (table.count() == 0) return;
  MultiTensorKernel<T><<<table.Grid(), 256, 0, Cuda(ctx).stream()>>>(table.device(), f);
  KEEL_CUDA_LAUNCH_CHECK();
}

template <typename T>
class MergedSgdKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    table_.Build(ctx, nullptr, nullptr, nullptr, nullptr, false);
    // The rate may be float32 for a float64 parameter, as item<T>() allows on the CPU.
    const DeviceScalar lr = ScalarOf(ctx.Input("LearningRate"));
    LaunchMultiTensor(ctx, table_, [=] __device__(const MtEntry<T>& e, int64_t i) {
      e.po[i] = fn::SgdUpdate(e.p[i], e.g[i], static_cast<T>(lr.Get()));
    });
  }

 private:
  MtTable<T> table_;
};

template <typename T>
class MergedMomentumKernel : public OpKernel {
 public:
  explicit MergedMomentumKernel(const OpDesc& op)
      : f_{static_cast<T>(op.Attr<float>("mu")), op.Attr<bool>("use_nesterov")} {}
  void Compute(ExecutionContext& ctx) override {
    table_.Build(ctx, "Velocity", "VelocityOut", nullptr, nullptr, false);
    // The rate may be float32 for a float64 parameter, as item<T>() allows on the CPU.
    const DeviceScalar lr = ScalarOf(ctx.Input("LearningRate"));
    const fn::Momentum<T> f = f_;
    LaunchMultiTensor(ctx, table_, [=] __device__(const MtEntry<T>& e, int64_t i) {
      f(e.p[i], e.g[i], e.a[i], static_cast<T>(lr.Get()), &e.po[i], &e.ao[i]);
    });
  }

 private:
  fn::Momentum<T> f_;
  MtTable<T> table_;
};

template <typename T>
class MergedAdamKernel : public OpKernel {
 public:
  explicit MergedAdamKernel(const OpDesc& op) : MergedAdamKernel(op, 0.0) {}
  void Compute(ExecutionContext& ctx) override {
    table_.Build(ctx, "Moment1", "Moment1Out", "Moment2", "Moment2Out", true);
    const DeviceScalar lr = ScalarOf(ctx.Input("LearningRate"));
    const double beta1 = beta1_, beta2 = beta2_, eps = epsilon_, coeff = coeff_;
    LaunchMultiTensor(ctx, table_, [=] __device__(const MtEntry<T>& e, int64_t i) {
      const fn::Adam<T> f =
          fn::AdamStep<T>(lr.Get(), e.b1p.Get(), e.b2p.Get(), beta1, beta2, eps, coeff);
      f(e.p[i], e.g[i], e.a[i], e.b[i], &e.po[i], &e.ao[i], &e.bo[i]);
    });
    const int count = table_.count();
    if (count == 0) return;
    MultiBetaPowUpdate<T><<<(count + 127) / 128, 128, 0, Cuda(ctx).stream()>>>(
        table_.device(), count, beta1_, beta2_);
    KEEL_CUDA_LAUNCH_CHECK();
  }

 protected:
  MergedAdamKernel(const OpDesc& op, double coeff)
      : beta1_(op.Attr<float>("beta1")),
        beta2_(op.Attr<float>("beta2")),
        epsilon_(op.Attr<float>("epsilon")),
        coeff_(coeff) {}

 private:
  double beta1_, beta2_, epsilon_, coeff_;
  MtTable<T> table_;
};

template <typename T>
class MergedAdamWKernel : public MergedAdamKernel<T> {
 public:
  explicit MergedAdamWKernel(const OpDesc& op) : MergedAdamKernel<T>(op, op.Attr<float>("coeff")) {}
};

// ---------------------------------------------------------- squared_l2_norm, clip_by_global_norm

// partial[b] = sum over block b's grid-stride share of x of x^2, in double.
template <typename T>
__global__ void SquarePartials(const T* x, int64_t n, double* partial) {
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(blockDim.x) * gridDim.x) {
    const double v = static_cast<double>(x[i]);
    acc += v * v;
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// sum_sq = the partials added in order by one block. Writes sum_sq (squared_l2_norm), the norm
// sqrt(sum_sq) and the clip factor (clip_by_global_norm); each output may be null.
template <typename T>
__global__ void FinishNorm(const double* partial, int count, double clip_norm, T* sum_sq_out,
                           T* norm_out, T* scale_out) {
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = BlockSum(acc);
  if (threadIdx.x != 0) return;
  if (sum_sq_out) *sum_sq_out = static_cast<T>(acc);
  const double norm = sqrt(acc);
  if (norm_out) *norm_out = static_cast<T>(norm);
  if (scale_out) *scale_out = static_cast<T>(fn::GlobalNormScale(norm, clip_norm));
}

constexpr int kNormThreads = 256;
int NormBlocks(int64_t n) {
  const unsigned g = GridFor(n, kNormThreads);
  return static_cast<int>(g < 64 ? g : 64);
}

// Partials of every x into scratch (double), then FinishNorm. scratch grows as needed and is
// kept across runs (no allocation in steady state).
template <typename T>
void SumOfSquares(const ExecutionContext& ctx, const std::vector<const Tensor*>& xs,
                  Tensor* scratch, double clip_norm, T* sum_sq_out, T* norm_out, T* scale_out) {
  int64_t slots = 0;
  for (const Tensor* x : xs) slots += NormBlocks(x->numel());
  if (!scratch->initialized() || scratch->numel() < slots + 1)
    scratch->Alloc(DType::kFloat64, DDim{slots + 1}, ctx.place());
  double* partial = scratch->data<double>();
  cudaStream_t stream = Cuda(ctx).stream();
  int64_t at = 0;
  for (const Tensor* x : xs) {
    const int blocks = NormBlocks(x->numel());
    SquarePartials<T><<<blocks, kNormThreads, 0, stream>>>(x->data<T>(), x->numel(), partial + at);
    KEEL_CUDA_LAUNCH_CHECK();
    at += blocks;
  }
  KEEL_ENFORCE(at < (int64_t(1) << 31), "too many tensors for one norm");
  FinishNorm<T><<<1, 256, 0, stream>>>(partial, static_cast<int>(at), clip_norm, sum_sq_out,
                                       norm_out, scale_out);
  KEEL_CUDA_LAUNCH_CHECK();
}

// Out = sum(X^2).
template <typename T>
class SquaredL2NormKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    T* out = ctx.Output("Out")->mutable_data<T>(ctx.place());
    SumOfSquares<T>(ctx, {&ctx.Input("X")}, &scratch_, 1.0, out, nullptr, nullptr);
  }

 private:
  Tensor scratch_;
};

// norm = sqrt(sum_i sum(X_i^2)); Out_i = X_i * clip_norm / max(norm, clip_norm), the factor read
// from the device.
template <typename T>
class ClipByGlobalNormKernel : public OpKernel {
 public:
  explicit ClipByGlobalNormKernel(const OpDesc& op) : clip_norm_(op.Attr<float>("clip_norm")) {}
  void Compute(ExecutionContext& ctx) override {
    std::vector<const Tensor*> xs = ctx.MultiInput("X");
    std::vector<Tensor*> outs = ctx.MultiOutput("Out");
    KEEL_ENFORCE(xs.size() == outs.size(), "clip_by_global_norm: ", xs.size(), " X but ",
                 outs.size(), " Out");
    if (!scale_.initialized()) scale_.Alloc(DTypeOf<T>::value, DDim{1}, ctx.place());
    T* scale = scale_.data<T>();
    Tensor* g = ctx.OutputOrNull("GlobalNorm");
    SumOfSquares<T>(ctx, xs, &scratch_, clip_norm_, nullptr,
                    g ? g->mutable_data<T>(ctx.place()) : nullptr, scale);
    for (size_t i = 0; i < xs.size(); ++i) {
      KEEL_ENFORCE(outs[i] != nullptr && outs[i]->numel() == xs[i]->numel(), "Out[", i,
                   "] must have the shape of X[", i, "] ", xs[i]->dims().str());
      const T* x = xs[i]->data<T>();
      T* out = outs[i]->mutable_data<T>(ctx.place());
      ForEach(ctx, xs[i]->numel(), [=] __device__(int64_t k) { out[k] = x[k] * *scale; });
    }
  }

 private:
  double clip_norm_;
  Tensor scratch_, scale_;
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(squared_l2_norm, SquaredL2NormKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(clip_by_global_norm, ClipByGlobalNormKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(sgd, SgdKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(momentum, MomentumKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(adam, AdamKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(adamw, AdamWKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(merged_sgd, MergedSgdKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(merged_momentum, MergedMomentumKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(merged_adam, MergedAdamKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(merged_adamw, MergedAdamWKernel, float, double);

}  // namespace keel
