// Reductions: mean (everything to shape [1]) and reduce_sum / reduce_mean over chosen dims.
//
// reduce_* reduce the dims listed in `dim` (negative counts from the end), or every dim when
// reduce_all is set or `dim` is empty. Reduced dims are dropped, or kept as 1 with keep_dim; a
// result with no dims left has shape [1]. Example: X [2, 3, 4], dim {1} -> Out [2, 4].
// Each grad op reads X (for X@GRAD's shape) and Out@GRAD.
#include <limits>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/functors/index_plans.h"
#include "ops/op_util.h"

namespace keel {
namespace {

// ---------------------------------------------------------------- mean

void MeanShape(InferShapeContext& ctx) {
  ctx.SetOutputDim("Out", DDim{1});
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

// out = sum(x) / numel(x).
template <typename T>
class MeanKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    T* out = ctx.Output("Out")->mutable_data<T>(ctx.place());
    out[0] = ConstVec<T>(x.data<T>(), x.numel()).sum() / static_cast<T>(x.numel());
  }
};

// dx = dout / numel(x), everywhere.
template <typename T>
class MeanGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(dout.numel() == 1, "Out@GRAD must hold one element, got ", dout.dims().str());
    const T g = dout.data<T>()[0] / static_cast<T>(dx->numel());
    Vec<T>(dx->mutable_data<T>(ctx.place()), dx->numel()).setConstant(g);
  }
};

// ---------------------------------------------------------------- reduce_sum, reduce_mean

// Which dims of X are reduced.
struct ReduceDims {
  bool reduced[DDim::kMaxRank] = {};
};

ReduceDims ResolveDims(const std::vector<int>& dim, bool reduce_all, const DDim& x) {
  ReduceDims r;
  const int rank = x.size();
  const bool all = reduce_all || dim.empty();
  for (int i = 0; i < rank; ++i) r.reduced[i] = all;
  if (all) return r;
  for (int d : dim) {
    CheckAxisInRange("dim", d, "X", x);
    r.reduced[d < 0 ? d + rank : d] = true;
  }
  return r;
}

DDim ReducedShape(const DDim& x, const ReduceDims& r, bool keep_dim) {
  DDim out;
  for (int i = 0; i < x.size(); ++i) {
    if (!r.reduced[i]) {
      out.push_back(x[i]);
    } else if (keep_dim) {
      out.push_back(1);
    }
  }
  if (out.empty()) out.push_back(1);
  return out;
}

void ReduceShape(InferShapeContext& ctx) {
  DDim x = ctx.GetInputDim("X");
  ReduceDims r = ResolveDims(ctx.Attr<std::vector<int>>("dim"), ctx.Attr<bool>("reduce_all"), x);
  ctx.SetOutputDim("Out", ReducedShape(x, r, ctx.Attr<bool>("keep_dim")));
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

// X's dims merged by kind (ops/functors/index_plans.h, shared with the CUDA kernels); the
// innermost merged dim is walked with vector ops, the others with an odometer.
using fn::ReduceLayout;
ReduceLayout MakeLayout(const DDim& x, const ReduceDims& r) {
  return fn::MakeReduceLayout(x, r.reduced);
}

// Calls fn(x_offset, out_offset) for each contiguous run of the innermost merged dim.
template <typename Fn>
void WalkRuns(const ReduceLayout& l, Fn&& fn) {
  const int64_t inner = l.dims[l.n - 1];
  const int64_t runs = l.numel / inner;
  int64_t idx[DDim::kMaxRank] = {};
  int64_t out_off = 0;
  for (int64_t run = 0; run < runs; ++run) {
    fn(run * inner, out_off);
    for (int k = l.n - 2; k >= 0; --k) {
      out_off += l.out_stride[k];
      if (++idx[k] < l.dims[k]) break;
      out_off -= l.out_stride[k] * l.dims[k];
      idx[k] = 0;
    }
  }
}

// out = sum of x over the reduced dims (times out_numel / numel for the mean).
template <typename T, bool kMean>
class ReduceKernel : public OpKernel {
 public:
  explicit ReduceKernel(const OpDesc& op)
      : dim_(op.Attr<std::vector<int>>("dim")), reduce_all_(op.Attr<bool>("reduce_all")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    Tensor* out = ctx.Output("Out");
    Vec<T> o(out->mutable_data<T>(ctx.place()), out->numel());
    o.setZero();
    if (x.numel() == 0) {
      if constexpr (kMean) o.setConstant(std::numeric_limits<T>::quiet_NaN());
      return;
    }
    const ReduceLayout l = MakeLayout(x.dims(), ResolveDims(dim_, reduce_all_, x.dims()));
    const int64_t inner = l.dims[l.n - 1];
    const T* xp = x.data<T>();
    T* op = o.data();
    if (l.reduced[l.n - 1]) {
      WalkRuns(l, [&](int64_t xo, int64_t oo) { op[oo] += ConstVec<T>(xp + xo, inner).sum(); });
    } else {
      WalkRuns(l, [&](int64_t xo, int64_t oo) {
        Vec<T>(op + oo, inner) += ConstVec<T>(xp + xo, inner);
      });
    }
    if constexpr (kMean) o *= static_cast<T>(l.out_numel) / static_cast<T>(l.numel);
  }

 private:
  std::vector<int> dim_;
  bool reduce_all_;
};

// dx = dout broadcast back over the reduced dims (times out_numel / numel for the mean).
template <typename T, bool kMean>
class ReduceGradKernel : public OpKernel {
 public:
  explicit ReduceGradKernel(const OpDesc& op)
      : dim_(op.Attr<std::vector<int>>("dim")), reduce_all_(op.Attr<bool>("reduce_all")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& x = ctx.Input("X");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    T* dxp = dx->mutable_data<T>(ctx.place());
    if (x.numel() == 0) return;
    const ReduceLayout l = MakeLayout(x.dims(), ResolveDims(dim_, reduce_all_, x.dims()));
    KEEL_ENFORCE(dout.numel() == l.out_numel, "Out@GRAD ", dout.dims().str(),
                 " does not match the reduction of X ", x.dims().str());
    const T scale = kMean ? static_cast<T>(l.out_numel) / static_cast<T>(l.numel) : T(1);
    const int64_t inner = l.dims[l.n - 1];
    const T* dop = dout.data<T>();
    if (l.reduced[l.n - 1]) {
      WalkRuns(
          l, [&](int64_t xo, int64_t oo) { Vec<T>(dxp + xo, inner).setConstant(dop[oo] * scale); });
    } else {
      WalkRuns(l, [&](int64_t xo, int64_t oo) {
        Vec<T>(dxp + xo, inner) = ConstVec<T>(dop + oo, inner) * scale;
      });
    }
  }

 private:
  std::vector<int> dim_;
  bool reduce_all_;
};

template <typename T>
using ReduceSumKernel = ReduceKernel<T, false>;
template <typename T>
using ReduceMeanKernel = ReduceKernel<T, true>;
template <typename T>
using ReduceSumGradKernel = ReduceGradKernel<T, false>;
template <typename T>
using ReduceMeanGradKernel = ReduceGradKernel<T, true>;

}  // namespace

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(mean)
    .Doc("Out = sum(X) / numel(X). X of any shape -> Out [1].")
    .Input("X", "any shape")
    .Output("Out", "[1]")
    .Shape(MeanShape)
    .Grad(GradMaker("mean_grad", {"X"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(mean_grad, mean);
KEEL_REGISTER_CPU_KERNEL(mean, MeanKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(mean_grad, MeanGradKernel, float, double);

KEEL_REGISTER_OP(reduce_sum)
    .Doc("Out = sum of X over `dim`. X [2, 3, 4], dim {-1} -> Out [2, 3]; keep_dim -> [2, 3, 1].")
    .Input("X", "any shape")
    .Output("Out", "X without (or with size 1 in) the reduced dims; [1] when none are left")
    .Attr<std::vector<int>>("dim", {0}, "dims to reduce; negative counts from the end; empty: all")
    .Attr<bool>("keep_dim", false, "keep reduced dims with size 1")
    .Attr<bool>("reduce_all", false, "reduce every dim, ignoring `dim`")
    .Shape(ReduceShape)
    .Grad(GradMaker("reduce_sum_grad", {"X"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(reduce_sum_grad, reduce_sum);
KEEL_REGISTER_CPU_KERNEL(reduce_sum, ReduceSumKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CPU_KERNEL(reduce_sum_grad, ReduceSumGradKernel, float, double);

KEEL_REGISTER_OP(reduce_mean)
    .Doc("Out = mean of X over `dim`. X [2, 3, 4], dim {0, 2} -> Out [3].")
    .Input("X", "any shape")
    .Output("Out", "X without (or with size 1 in) the reduced dims; [1] when none are left")
    .Attr<std::vector<int>>("dim", {0}, "dims to reduce; negative counts from the end; empty: all")
    .Attr<bool>("keep_dim", false, "keep reduced dims with size 1")
    .Attr<bool>("reduce_all", false, "reduce every dim, ignoring `dim`")
    .Shape(ReduceShape)
    .Grad(GradMaker("reduce_mean_grad", {"X"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(reduce_mean_grad, reduce_mean);
KEEL_REGISTER_CPU_KERNEL(reduce_mean, ReduceMeanKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(reduce_mean_grad, ReduceMeanGradKernel, float, double);

}  // namespace keel
