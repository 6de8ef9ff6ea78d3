// The optimizer ops on CUDA: the kernels are optimizer_ops.h's (sgd, momentum, adam and adamw one
// launch per parameter); here is adam's math and the norms', whose sums of squares run in double
// in a fixed order (per-block partials, then one block adds them), so they repeat bit for bit.
// LearningRate, the beta powers and the clip factor stay on the device: kernels read them, so an
// update never waits for the host.
//
// merged_sgd, merged_momentum, merged_adam and merged_adamw (the merge pass forms them from the
// per-parameter ops of a fused gradient group) update all their parameters in one multi-tensor
// launch: a table of per-parameter pointers goes to the device, blockIdx.y picks the parameter.
#include <vector>

#include "framework/runtime/device.h"
#include "ops/cuda_util.cuh"
#include "ops/functors/optimizer_functors.h"
#include "ops/optimizer_ops.h"

namespace keel {
namespace {

template <typename T>
__global__ void BetaPowUpdate(DeviceScalar b1p, DeviceScalar b2p, void* b1o, void* b2o,
                              double beta1, double beta2, const bool* skip) {
  if (skip != nullptr && *skip) beta1 = beta2 = 1.0;  // a skipped step leaves the powers
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
__global__ void MultiBetaPowUpdate(const MtEntry<T>* table, int count, double beta1, double beta2,
                                   const bool* skip) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= count) return;
  if (skip != nullptr && *skip) beta1 = beta2 = 1.0;
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
        e.b1p = Device<CUDADevice>::ScalarOf(ctx.Input("Beta1Pow", i));
        e.b2p = Device<CUDADevice>::ScalarOf(ctx.Input("Beta2Pow", i));
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
    const DeviceScalar lr = Device<CUDADevice>::ScalarOf(ctx.Input("LearningRate"));
    const bool* skip = SkipFlag(ctx);
    LaunchMultiTensor(ctx, table_, [=] __device__(const MtEntry<T>& e, int64_t i) {
      if (skip != nullptr && *skip) {
        e.po[i] = e.p[i];
        return;
      }
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
    const DeviceScalar lr = Device<CUDADevice>::ScalarOf(ctx.Input("LearningRate"));
    const fn::Momentum<T> f = f_;
    const bool* skip = SkipFlag(ctx);
    LaunchMultiTensor(ctx, table_, [=] __device__(const MtEntry<T>& e, int64_t i) {
      if (skip != nullptr && *skip) {
        e.po[i] = e.p[i];
        e.ao[i] = e.a[i];
        return;
      }
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
    const DeviceScalar lr = Device<CUDADevice>::ScalarOf(ctx.Input("LearningRate"));
    const double beta1 = beta1_, beta2 = beta2_, eps = epsilon_, coeff = coeff_;
    const bool* skip = SkipFlag(ctx);
    LaunchMultiTensor(ctx, table_, [=] __device__(const MtEntry<T>& e, int64_t i) {
      if (skip != nullptr && *skip) {
        e.po[i] = e.p[i];
        e.ao[i] = e.a[i];
        e.bo[i] = e.b[i];
        return;
      }
      const fn::Adam<T> f =
          fn::AdamStep<T>(lr.Get(), e.b1p.Get(), e.b2p.Get(), beta1, beta2, eps, coeff);
      f(e.p[i], e.g[i], e.a[i], e.b[i], &e.po[i], &e.ao[i], &e.bo[i]);
    });
    const int count = table_.count();
    if (count == 0) return;
    MultiBetaPowUpdate<T><<<(count + 127) / 128, 128, 0, Cuda(ctx).stream()>>>(
        table_.device(), count, beta1_, beta2_, skip);
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

}  // namespace

// Every thread derives the step's scalars in double from the device lr and beta powers (cheap next
// to the memory traffic), then updates its elements; the beta powers advance after every thread
// has read them (stream order: the next launch).
template <typename T>
struct AdamMath<CUDADevice, T> {
  static void Update(const ExecutionContext& ctx, const AdamIO<CUDADevice, T>& io, double beta1,
                     double beta2, double epsilon, double coeff) {
    const T *p = io.p, *g = io.g, *m1 = io.m1, *m2 = io.m2;
    T *po = io.po, *m1o = io.m1o, *m2o = io.m2o;
    const DeviceScalar lr = io.lr, b1p = io.b1p, b2p = io.b2p;
    const bool* skip = io.skip;
    ForEach(ctx, io.n, [=] __device__(int64_t i) {
      if (skip != nullptr && *skip) {
        po[i] = p[i];
        m1o[i] = m1[i];
        m2o[i] = m2[i];
        return;
      }
      const fn::Adam<T> f =
          fn::AdamStep<T>(lr.Get(), b1p.Get(), b2p.Get(), beta1, beta2, epsilon, coeff);
      f(p[i], g[i], m1[i], m2[i], &po[i], &m1o[i], &m2o[i]);
    });
    void* b1d = io.b1o->mutable_data(io.b1p_in->dtype(), ctx.place());
    void* b2d = io.b2o->mutable_data(io.b2p_in->dtype(), ctx.place());
    BetaPowUpdate<T><<<1, 1, 0, Cuda(ctx).stream()>>>(b1p, b2p, b1d, b2d, beta1, beta2, skip);
    KEEL_CUDA_LAUNCH_CHECK();
  }
};

// Per-block partial sums, then one block adds them in order; the clip factor stays on the device.
template <typename T>
class GlobalNormMath<CUDADevice, T> {
 public:
  void SquaredL2(const ExecutionContext& ctx, const Tensor& x, T* out) {
    SumOfSquares<T>(ctx, {&x}, &scratch_, 1.0, out, nullptr, nullptr);
  }

  void ClipByGlobalNorm(const ExecutionContext& ctx, const std::vector<const Tensor*>& xs,
                        const std::vector<Tensor*>& outs, double clip_norm, T* global_norm) {
    if (!scale_.initialized()) scale_.Alloc(DTypeOf<T>::value, DDim{1}, ctx.place());
    T* scale = scale_.data<T>();
    SumOfSquares<T>(ctx, xs, &scratch_, clip_norm, nullptr, global_norm, scale);
    for (size_t i = 0; i < xs.size(); ++i) {
      const T* x = xs[i]->data<T>();
      T* out = outs[i]->mutable_data<T>(ctx.place());
      ForEach(ctx, xs[i]->numel(), [=] __device__(int64_t k) { out[k] = x[k] * *scale; });
    }
  }

 private:
  Tensor scratch_, scale_;
};

KEEL_REGISTER_KERNEL(CUDA, squared_l2_norm, SquaredL2NormKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, clip_by_global_norm, ClipByGlobalNormKernel, float, double);
KEEL_REGISTER_KERNEL(CUDA, sgd, SgdKernel, float, double, float16, bfloat16);
KEEL_REGISTER_KERNEL(CUDA, momentum, MomentumKernel, float, double, float16, bfloat16);
KEEL_REGISTER_KERNEL(CUDA, adam, AdamKernel, float, double, float16, bfloat16);
KEEL_REGISTER_KERNEL(CUDA, adamw, AdamWKernel, float, double, float16, bfloat16);
KEEL_REGISTER_CUDA_KERNEL(merged_sgd, MergedSgdKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(merged_momentum, MergedMomentumKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(merged_adam, MergedAdamKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(merged_adamw, MergedAdamWKernel, float, double);

}  // namespace keel
