// The kernels of the optimizer updates and gradient clipping (optimizer_ops.cc has the ops, their
// shapes and formulas), once for every device (ops/device.h): sgd and momentum apply their
// ops/functors/optimizer_functors.h formula element by element (on the CPU in pieces of
// kElementwiseGrain on the thread budget: a large weight's update is bound by memory, and one
// thread left the seed MLP's 1280 x 1280 update at 0.55-0.9 ms of a 5.3 ms step); adam and adamw,
// squared_l2_norm and clip_by_global_norm go through AdamMath and GlobalNormMath (Eigen on the CPU,
// whose rounding the functor loop would change; CUDA kernels that read the learning rate, the beta
// powers and the clip factor from device memory, so an update never waits for the host). The merged
// ops are each device's own (optimizer_ops.cc, optimizer_ops.cu): the CPU runs the per-parameter
// kernel for each parameter, CUDA updates them all in one multi-tensor launch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "framework/runtime/cpu_threads.h"
#include "ops/device.h"
#include "ops/functors/optimizer_functors.h"

namespace keel {

// Runtime guard that input `slot` matches Param's element count (the shape fn checks dims).
inline void EnforceLikeParam(const ExecutionContext& ctx, const Tensor& param, const char* slot) {
  const Tensor& t = ctx.Input(slot);
  KEEL_ENFORCE(t.numel() == param.numel(), ctx.op().type(), ": Param ", param.dims().str(), " and ",
               slot, " ", t.dims().str(), " must have the same shape");
}

// A row-sparse Grad input (an is_sparse embedding's gradient: rows of a [V, D] gradient that is
// zero elsewhere), or nullptr when Grad is dense. Only CPU kernels produce them (lookup_table_grad
// refuses is_sparse on other devices), so the helpers below run on the host.
inline const Variable* RowSparseGrad(const ExecutionContext& ctx, const Tensor& param) {
  const Variable* v = ctx.InputVar("Grad");
  if (v == nullptr || !v->is_row_sparse()) return nullptr;
  const Tensor& g = ctx.Input("Grad");
  KEEL_ENFORCE(ctx.place().is_cpu(), ctx.op().type(), ": a row-sparse Grad on ", ctx.place().str(),
               " (is_sparse embeddings train on the CPU only)");
  KEEL_ENFORCE(v->height() == param.dims()[0] && g.dims().size() == param.dims().size() &&
                   static_cast<int64_t>(v->rows().size()) == g.dims()[0] &&
                   g.numel() * param.dims()[0] == param.numel() * g.dims()[0],
               ctx.op().type(), ": row-sparse Grad ", g.dims().str(), " of height ", v->height(),
               " does not match Param ", param.dims().str());
  return v;
}

// Grad's data as a dense tensor of Param's shape: Grad itself, or a row-sparse Grad scattered
// into `scratch` (zeros elsewhere), so dense update rules give exactly their dense results.
template <typename T>
const T* DenseGradData(const ExecutionContext& ctx, const Tensor& param, Tensor* scratch) {
  const Variable* v = RowSparseGrad(ctx, param);
  if (v == nullptr) {
    EnforceLikeParam(ctx, param, "Grad");
    return ctx.Input("Grad").data<T>();
  }
  const int64_t width = param.numel() / std::max<int64_t>(param.dims()[0], 1);
  scratch->Resize(param.dims());
  T* d = scratch->mutable_data<T>(ctx.place());
  std::fill_n(d, param.numel(), T(0));
  const T* g = ctx.Input("Grad").data<T>();
  for (size_t k = 0; k < v->rows().size(); ++k)
    std::copy_n(g + k * width, width, d + v->rows()[k] * width);
  return d;
}

// A float16 / bfloat16 Grad of a float32 Param (OpTraits::widens_inputs: a gradient all-reduced
// in 16 bits, fp16_allreduce) widened into `scratch`: what a cast before the update would give.
template <typename D, typename G>
const float* WidenGradInto(const ExecutionContext& ctx, const Tensor& param, const G* g,
                           Tensor* scratch) {
  EnforceLikeParam(ctx, param, "Grad");
  scratch->Resize(param.dims());
  float* w = scratch->mutable_data<float>(ctx.place());
  Device<D>::ForEachInPieces(ctx, param.numel(), cpu_threads::kElementwiseGrain,
                             [=] KEEL_HD_LAMBDA(int64_t i) { w[i] = Widen(g[i]); });
  return w;
}

// Grad's data as T for the update of a T Param: DenseGradData's, or a 16-bit Grad of a float32
// Param widened into `scratch` (WidenGradInto).
template <typename D, typename T>
const T* WidenedGradData(const ExecutionContext& ctx, const Tensor& param, Tensor* scratch) {
  if constexpr (std::is_same_v<T, float>) {
    const Tensor& grad = ctx.Input("Grad");
    if (grad.dtype() == DType::kBFloat16)
      return WidenGradInto<D>(ctx, param, grad.data<bfloat16>(), scratch);
    if (grad.dtype() == DType::kFloat16)
      return WidenGradInto<D>(ctx, param, grad.data<float16>(), scratch);
  }
  return DenseGradData<T>(ctx, param, scratch);
}

// f(g) with g Grad's data: a T*, or, for the update of a float32 Param, the bfloat16* / float16*
// of a 16-bit Grad (OpTraits::widens_inputs), which the update widens as it reads each element.
template <typename T, typename F>
void WithGradData(const Tensor& grad, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    if (grad.dtype() == DType::kBFloat16) return f(grad.data<bfloat16>());
    if (grad.dtype() == DType::kFloat16) return f(grad.data<float16>());
  }
  f(grad.data<T>());
}

// The optional SkipUpdate input of an update op ([1] bool, mixed precision's overflow flag), as
// device code reads it: when it holds true, the op leaves the parameter and its accumulators as
// they are. nullptr when the op has none.
inline const bool* SkipFlag(const ExecutionContext& ctx) {
  const Tensor* t = ctx.InputOrNull("SkipUpdate");
  if (t == nullptr) return nullptr;
  KEEL_ENFORCE(t->numel() == 1, ctx.op().type(), ": SkipUpdate must hold one element, got ",
               t->dims().str());
  return t->data<bool>();
}

// multi_precision (AMP O2): a float16 / bfloat16 Param has a float32 master copy, MasterParam;
// the update runs in float32 on the master (and float32 accumulators), MasterParamOut gets the
// result and ParamOut the result rounded to Param's type. On a skipped step both stay.
struct MasterIO {
  const float* m;
  float* mo;
};
inline MasterIO MasterOf(ExecutionContext& ctx, const Tensor& param) {
  const Tensor* m = ctx.InputOrNull("MasterParam");
  KEEL_ENFORCE(m != nullptr, ctx.op().type(), ": Param is ", DTypeName(param.dtype()),
               ", which needs MasterParam, its float32 master copy (multi_precision, AMP O2)");
  KEEL_ENFORCE(m->dtype() == DType::kFloat32 && m->numel() == param.numel(), ctx.op().type(),
               ": MasterParam must be float32 of Param's shape ", param.dims().str(), ", got ",
               DTypeName(m->dtype()), " ", m->dims().str());
  return {m->data<float>(), ctx.Output("MasterParamOut")->mutable_data<float>(ctx.place())};
}

// Accumulator slot `slot` of a multi_precision update: float32, Param's element count.
inline const float* MasterAccumulator(const ExecutionContext& ctx, const Tensor& param,
                                      const char* slot) {
  const Tensor& t = ctx.Input(slot);
  KEEL_ENFORCE(t.dtype() == DType::kFloat32 && t.numel() == param.numel(), ctx.op().type(), ": ",
               slot, " of a ", DTypeName(param.dtype()),
               " Param must be float32 of its shape (multi_precision), got ", DTypeName(t.dtype()),
               " ", t.dims().str());
  return t.data<float>();
}

// param_out = param - lr * grad. The rate may be float32 for a float64 parameter.
template <typename D, typename T>
class SgdKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    if constexpr (kIsHalf<T>) {
      ComputeMaster(ctx);
    } else {
      ComputePlain(ctx);
    }
  }

  // (Public: nvcc's device lambdas may not live in private member functions.)
  void ComputeMaster(ExecutionContext& ctx) {
    const Tensor& param = ctx.Input("Param");
    EnforceLikeParam(ctx, param, "Grad");
    const typename Device<D>::Scalar lr = Device<D>::ScalarOf(ctx.Input("LearningRate"));
    const MasterIO mp = MasterOf(ctx, param);
    const float* m = mp.m;
    float* mo = mp.mo;
    const T* p = param.data<T>();
    const T* g = ctx.Input("Grad").data<T>();
    T* po = ctx.Output("ParamOut")->mutable_data<T>(ctx.place());
    const bool* skip = SkipFlag(ctx);
    Device<D>::ForEachInPieces(
        ctx, param.numel(), cpu_threads::kElementwiseGrain, [=] KEEL_HD_LAMBDA(int64_t i) {
          if (skip != nullptr && *skip) {
            mo[i] = m[i];
            po[i] = p[i];
            return;
          }
          const float v = fn::SgdUpdate(m[i], Widen(g[i]), static_cast<float>(lr.Get()));
          mo[i] = v;
          po[i] = Narrow<T>(v);
        });
  }

  void ComputePlain(ExecutionContext& ctx) {
    const Tensor& param = ctx.Input("Param");
    const typename Device<D>::Scalar lr = Device<D>::ScalarOf(ctx.Input("LearningRate"));
    const T* p = param.data<T>();
    T* po = ctx.Output("ParamOut")->mutable_data<T>(ctx.place());
    const bool* skip = SkipFlag(ctx);
    if (const Variable* sparse = RowSparseGrad(ctx, param)) {
      // Rows without a gradient keep their values, as the dense rule leaves them (p - lr * 0).
      if (po != p) std::copy_n(p, param.numel(), po);
      if (skip != nullptr && *skip) return;
      const int64_t width = param.numel() / std::max<int64_t>(param.dims()[0], 1);
      const T* g = ctx.Input("Grad").data<T>();
      const T rate = static_cast<T>(lr.Get());
      for (size_t k = 0; k < sparse->rows().size(); ++k) {
        const int64_t at = sparse->rows()[k] * width;
        for (int64_t j = 0; j < width; ++j)
          po[at + j] = fn::SgdUpdate(p[at + j], g[k * width + j], rate);
      }
      return;
    }
    EnforceLikeParam(ctx, param, "Grad");
    WithGradData<T>(ctx.Input("Grad"),
                    [&](const auto* g) { UpdateDense(ctx, param.numel(), p, g, po, lr, skip); });
  }

  // po = p - lr * g, each element of g widened to T as it is read (a 16-bit Grad of a float32
  // Param: the float32 update of the cast gradient, bit for bit, without the cast's pass).
  template <typename G>
  void UpdateDense(ExecutionContext& ctx, int64_t n, const T* p, const G* g, T* po,
                   typename Device<D>::Scalar lr, const bool* skip) {
    Device<D>::ForEachInPieces(
        ctx, n, cpu_threads::kElementwiseGrain, [=] KEEL_HD_LAMBDA(int64_t i) {
          if (skip != nullptr && *skip) {
            po[i] = p[i];
            return;
          }
          po[i] = fn::SgdUpdate(p[i], static_cast<T>(Widen(g[i])), static_cast<T>(lr.Get()));
        });
  }
};

// v = mu * v + g;  param -= lr * (g + mu * v) with Nesterov, lr * v without.
template <typename D, typename T>
class MomentumKernel : public OpKernel {
 public:
  explicit MomentumKernel(const OpDesc& op)
      : f_{static_cast<T>(op.Attr<float>("mu")), op.Attr<bool>("use_nesterov")},
        f32_{op.Attr<float>("mu"), op.Attr<bool>("use_nesterov")} {}
  void Compute(ExecutionContext& ctx) override {
    if constexpr (kIsHalf<T>) {
      ComputeMaster(ctx);
    } else {
      ComputePlain(ctx);
    }
  }

  // multi_precision: the float32 master and velocity, ParamOut rounded from the master.
  void ComputeMaster(ExecutionContext& ctx) {
    const Tensor& param = ctx.Input("Param");
    EnforceLikeParam(ctx, param, "Grad");
    const typename Device<D>::Scalar lr = Device<D>::ScalarOf(ctx.Input("LearningRate"));
    const MasterIO mp = MasterOf(ctx, param);
    const float* m = mp.m;
    float* mo = mp.mo;
    const float* v = MasterAccumulator(ctx, param, "Velocity");
    float* vo = ctx.Output("VelocityOut")->mutable_data<float>(ctx.place());
    const T* p = param.data<T>();
    const T* g = ctx.Input("Grad").data<T>();
    T* po = ctx.Output("ParamOut")->mutable_data<T>(ctx.place());
    const fn::Momentum<float> f = f32_;
    const bool* skip = SkipFlag(ctx);
    Device<D>::ForEachInPieces(
        ctx, param.numel(), cpu_threads::kElementwiseGrain, [=] KEEL_HD_LAMBDA(int64_t i) {
          if (skip != nullptr && *skip) {
            mo[i] = m[i];
            vo[i] = v[i];
            po[i] = p[i];
            return;
          }
          f(m[i], Widen(g[i]), v[i], static_cast<float>(lr.Get()), &mo[i], &vo[i]);
          po[i] = Narrow<T>(mo[i]);
        });
  }

  void ComputePlain(ExecutionContext& ctx) {
    const Tensor& param = ctx.Input("Param");
    EnforceLikeParam(ctx, param, "Velocity");
    const typename Device<D>::Scalar lr = Device<D>::ScalarOf(ctx.Input("LearningRate"));
    const T* p = param.data<T>();
    // Every row's velocity decays, so a row-sparse Grad is made dense (as Paddle's sparse
    // momentum updates every row); a 16-bit Grad of a float32 Param is widened.
    Tensor dense_grad;
    const T* g = WidenedGradData<D, T>(ctx, param, &dense_grad);
    const T* v = ctx.Input("Velocity").data<T>();
    T* vo = ctx.Output("VelocityOut")->mutable_data<T>(ctx.place());
    T* po = ctx.Output("ParamOut")->mutable_data<T>(ctx.place());
    const fn::Momentum<T> f = f_;
    const bool* skip = SkipFlag(ctx);
    Device<D>::ForEachInPieces(ctx, param.numel(), cpu_threads::kElementwiseGrain,
                               [=] KEEL_HD_LAMBDA(int64_t i) {
                                 if (skip != nullptr && *skip) {
                                   po[i] = p[i];
                                   vo[i] = v[i];
                                   return;
                                 }
                                 f(p[i], g[i], v[i], static_cast<T>(lr.Get()), &po[i], &vo[i]);
                               });
  }

 private:
  fn::Momentum<T> f_;
  fn::Momentum<float> f32_;
};

// Adam's tensors, as pointers, and its scalars as the device reads them.
template <typename D, typename T>
struct AdamIO {
  int64_t n;
  const T *p, *g, *m1, *m2;
  T *po, *m1o, *m2o;
  typename Device<D>::Scalar lr, b1p, b2p;
  const Tensor *b1p_in, *b2p_in;
  Tensor *b1o, *b2o;  // written in the dtype of b1p_in, b2p_in
  const bool* skip;   // SkipFlag: when *skip, nothing changes
};

// The device math: AdamMath<D, T>::Update(ctx, io, beta1, beta2, epsilon, coeff), the update,
// then Beta1Pow *= beta1 and Beta2Pow *= beta2 after every element has read them; when io.skip
// points to true, outputs keep their inputs' values.
template <typename D, typename T>
struct AdamMath;

// The device math of the norms, an object a kernel keeps (CUDA's scratch), sums of squares in
// double in a fixed order:
//   SquaredL2(ctx, x, out)     out[0] = sum(x^2)
//   ClipByGlobalNorm(ctx, xs, outs, clip_norm, global_norm)   norm = sqrt(sum_i sum(x_i^2));
//                              out_i = x_i * clip_norm / max(norm, clip_norm); global_norm (may
//                              be null) = norm
template <typename D, typename T>
class GlobalNormMath;

// Adam (coeff 0) and AdamW (coeff: decoupled weight decay). Scalars are computed in double.
template <typename D, typename T>
class AdamKernel : public OpKernel {
 public:
  explicit AdamKernel(const OpDesc& op) : AdamKernel(op, 0.0) {}
  void Compute(ExecutionContext& ctx) override {
    if constexpr (kIsHalf<T>) {
      ComputeMaster(ctx);
    } else {
      ComputePlain(ctx);
    }
  }

  // multi_precision: float32 Adam on the master (the gradient widened into a float32 scratch
  // first, so the float32 math is the one float32 parameters get), then ParamOut rounded from it.
  void ComputeMaster(ExecutionContext& ctx) {
    const Tensor& param = ctx.Input("Param");
    EnforceLikeParam(ctx, param, "Grad");
    const int64_t n = param.numel();
    const MasterIO mp = MasterOf(ctx, param);
    Tensor grad32;
    grad32.Resize(param.dims());
    float* gw = grad32.mutable_data<float>(ctx.place());
    const T* g = ctx.Input("Grad").data<T>();
    Device<D>::ForEachInPieces(ctx, n, cpu_threads::kElementwiseGrain,
                               [=] KEEL_HD_LAMBDA(int64_t i) { gw[i] = Widen(g[i]); });
    AdamIO<D, float> io;
    io.n = n;
    io.p = mp.m;
    io.g = gw;
    io.m1 = MasterAccumulator(ctx, param, "Moment1");
    io.m2 = MasterAccumulator(ctx, param, "Moment2");
    io.lr = Device<D>::ScalarOf(ctx.Input("LearningRate"));
    io.b1p = Device<D>::ScalarOf(ctx.Input("Beta1Pow"));
    io.b2p = Device<D>::ScalarOf(ctx.Input("Beta2Pow"));
    io.b1p_in = &ctx.Input("Beta1Pow");
    io.b2p_in = &ctx.Input("Beta2Pow");
    io.m1o = ctx.Output("Moment1Out")->mutable_data<float>(ctx.place());
    io.m2o = ctx.Output("Moment2Out")->mutable_data<float>(ctx.place());
    io.po = mp.mo;
    io.b1o = ctx.Output("Beta1PowOut");
    io.b2o = ctx.Output("Beta2PowOut");
    io.skip = SkipFlag(ctx);
    AdamMath<D, float>::Update(ctx, io, beta1_, beta2_, epsilon_, coeff_);
    // The parameter is always the master rounded (startup casts it so), also on a skipped step.
    const float* mo = mp.mo;
    T* po = ctx.Output("ParamOut")->mutable_data<T>(ctx.place());
    Device<D>::ForEachInPieces(ctx, n, cpu_threads::kElementwiseGrain,
                               [=] KEEL_HD_LAMBDA(int64_t i) { po[i] = Narrow<T>(mo[i]); });
  }

  void ComputePlain(ExecutionContext& ctx) {
    const Tensor& param = ctx.Input("Param");
    EnforceLikeParam(ctx, param, "Moment1");
    EnforceLikeParam(ctx, param, "Moment2");
    AdamIO<D, T> io;
    io.n = param.numel();
    io.p = param.data<T>();
    io.m1 = ctx.Input("Moment1").data<T>();
    io.m2 = ctx.Input("Moment2").data<T>();
    io.lr = Device<D>::ScalarOf(ctx.Input("LearningRate"));
    io.b1p = Device<D>::ScalarOf(ctx.Input("Beta1Pow"));
    io.b2p = Device<D>::ScalarOf(ctx.Input("Beta2Pow"));
    io.b1p_in = &ctx.Input("Beta1Pow");
    io.b2p_in = &ctx.Input("Beta2Pow");
    io.m1o = ctx.Output("Moment1Out")->mutable_data<T>(ctx.place());
    io.m2o = ctx.Output("Moment2Out")->mutable_data<T>(ctx.place());
    io.po = ctx.Output("ParamOut")->mutable_data<T>(ctx.place());
    io.b1o = ctx.Output("Beta1PowOut");
    io.b2o = ctx.Output("Beta2PowOut");
    io.skip = SkipFlag(ctx);
    const Variable* sparse = RowSparseGrad(ctx, param);
    if (sparse != nullptr && lazy_mode_) return UpdateRows(ctx, io, *sparse);
    // Dense, or row-sparse outside lazy mode: every row's moments decay, as with a dense Grad. A
    // 16-bit Grad of a float32 Param is widened first.
    Tensor dense_grad;
    io.g = WidenedGradData<D, T>(ctx, param, &dense_grad);
    AdamMath<D, T>::Update(ctx, io, beta1_, beta2_, epsilon_, coeff_);
  }

 protected:
  AdamKernel(const OpDesc& op, double coeff)
      : beta1_(op.Attr<float>("beta1")),
        beta2_(op.Attr<float>("beta2")),
        epsilon_(op.Attr<float>("epsilon")),
        coeff_(coeff),
        lazy_mode_(op.Attr<bool>("lazy_mode")) {}

 private:
  // lazy_mode: only the rows of a row-sparse Grad change (their moments and values); the others
  // keep theirs, as if that step had not happened for them. The beta powers advance once.
  // Each row is updated in a 64-byte aligned copy: the CPU math's vector code takes a scalar path
  // for the elements before the first aligned one, which rounds differently, so a row updated in
  // place would round by its address (its row number), and a parameter server's shard, whose row
  // numbers are not the table's, would drift from one process's table in the last bits.
  void UpdateRows(ExecutionContext& ctx, AdamIO<D, T> io, const Variable& sparse) {
    const int64_t n = io.n, width = n / std::max<int64_t>(ctx.Input("Param").dims()[0], 1);
    if (io.p != io.po) std::copy_n(io.p, n, io.po);
    if (io.m1 != io.m1o) std::copy_n(io.m1, n, io.m1o);
    if (io.m2 != io.m2o) std::copy_n(io.m2, n, io.m2o);
    const T* g = ctx.Input("Grad").data<T>();
    AdamIO<D, T> row = io;
    row.n = 0;
    row.g = g;
    AdamMath<D, T>::Update(ctx, row, beta1_, beta2_, epsilon_, coeff_);  // the beta powers alone
    constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
    const int64_t stride = (width + kLine - 1) / kLine * kLine;
    Tensor scratch;
    T* s = static_cast<T*>(scratch.Alloc(DTypeOf<T>::value, DDim({4 * stride})));
    T *sp = s, *sm1 = s + stride, *sm2 = s + 2 * stride, *sg = s + 3 * stride;
    row.n = width;
    row.p = row.po = sp;
    row.m1 = row.m1o = sm1;
    row.m2 = row.m2o = sm2;
    row.g = sg;
    for (size_t k = 0; k < sparse.rows().size(); ++k) {
      const int64_t at = sparse.rows()[k] * width;
      std::copy_n(io.po + at, width, sp);  // the copies above already hold the inputs
      std::copy_n(io.m1o + at, width, sm1);
      std::copy_n(io.m2o + at, width, sm2);
      std::copy_n(g + k * width, width, sg);
      AdamMath<D, T>::Update(ctx, row, beta1_, beta2_, epsilon_, coeff_);
      std::copy_n(sp, width, io.po + at);
      std::copy_n(sm1, width, io.m1o + at);
      std::copy_n(sm2, width, io.m2o + at);
    }
  }

  double beta1_, beta2_, epsilon_, coeff_;
  bool lazy_mode_;
};

template <typename D, typename T>
class AdamWKernel : public AdamKernel<D, T> {
 public:
  explicit AdamWKernel(const OpDesc& op) : AdamKernel<D, T>(op, op.Attr<float>("coeff")) {}
};

// Out = sum(X^2).
template <typename D, typename T>
class SquaredL2NormKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    math_.SquaredL2(ctx, ctx.Input("X"), ctx.Output("Out")->mutable_data<T>(ctx.place()));
  }

 private:
  GlobalNormMath<D, T> math_;
};

// norm = sqrt(sum_i sum(X_i^2)); Out_i = X_i * clip_norm / max(norm, clip_norm).
template <typename D, typename T>
class ClipByGlobalNormKernel : public OpKernel {
 public:
  explicit ClipByGlobalNormKernel(const OpDesc& op) : clip_norm_(op.Attr<float>("clip_norm")) {}
  void Compute(ExecutionContext& ctx) override {
    std::vector<const Tensor*> xs = ctx.MultiInput("X");
    std::vector<Tensor*> outs = ctx.MultiOutput("Out");
    KEEL_ENFORCE(xs.size() == outs.size(), "clip_by_global_norm: ", xs.size(), " X but ",
                 outs.size(), " Out");
    for (size_t i = 0; i < xs.size(); ++i)
      KEEL_ENFORCE(outs[i] != nullptr && outs[i]->numel() == xs[i]->numel(), "Out[", i,
                   "] must have the shape of X[", i, "] ", xs[i]->dims().str());
    Tensor* g = ctx.OutputOrNull("GlobalNorm");
    math_.ClipByGlobalNorm(ctx, xs, outs, clip_norm_,
                           g ? g->mutable_data<T>(ctx.place()) : nullptr);
  }

 private:
  double clip_norm_;
  GlobalNormMath<D, T> math_;
};

}  // namespace keel
