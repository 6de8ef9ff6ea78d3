// Reductions: mean (everything to shape [1]) and reduce_sum / reduce_mean over chosen dims.
//
// reduce_* reduce the dims listed in `dim` (negative counts from the end), or every dim when
// reduce_all is set or `dim` is empty. Reduced dims are dropped, or kept as 1 with keep_dim; a
// result with no dims left has shape [1]. Example: X [2, 3, 4], dim {1} -> Out [2, 4].
// Each grad op reads X (for X@GRAD's shape) and Out@GRAD. The kernels are in reduce_ops.h; here
// are the shapes, the CPU math and the registrations.
#include "ops/reduce_ops.h"

#include <cstdint>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/op_util.h"

namespace keel {
namespace {

void MeanShape(InferShapeContext& ctx) {
  ctx.SetOutputDim("Out", DDim{1});
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
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
  ReduceDims r =
      ResolveReduceDims(ctx.Attr<std::vector<int>>("dim"), ctx.Attr<bool>("reduce_all"), x);
  ctx.SetOutputDim("Out", ReducedShape(x, r, ctx.Attr<bool>("keep_dim")));
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

// Calls fn(x_offset, out_offset) for each contiguous run of the innermost merged dim of l, the
// other dims walked with an odometer.
template <typename Fn>
void WalkRuns(const fn::ReduceLayout& l, Fn&& fn) {
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

}  // namespace

// The innermost merged dim is summed (or added to Out) with Eigen's vector ops, run by run.
template <typename T>
struct ReduceMath<CPUDevice, T> {
  static void Mean(const ExecutionContext&, const Tensor& x, T* out) {
    out[0] = ConstVec<T>(x.data<T>(), x.numel()).sum() / static_cast<T>(x.numel());
  }

  static void Sum(const ExecutionContext&, const T* xp, const fn::ReduceLayout& l, T scale, T* op) {
    Vec<T> o(op, l.out_numel);
    o.setZero();
    const int64_t inner = l.dims[l.n - 1];
    if (l.reduced[l.n - 1]) {
      WalkRuns(l, [&](int64_t xo, int64_t oo) { op[oo] += ConstVec<T>(xp + xo, inner).sum(); });
    } else {
      WalkRuns(l, [&](int64_t xo, int64_t oo) {
        Vec<T>(op + oo, inner) += ConstVec<T>(xp + xo, inner);
      });
    }
    if (scale != T(1)) o *= scale;
  }

  static void Broadcast(const ExecutionContext&, const T* dop, const fn::ReduceLayout& l, T scale,
                        T* dxp) {
    const int64_t inner = l.dims[l.n - 1];
    if (l.reduced[l.n - 1]) {
      WalkRuns(
          l, [&](int64_t xo, int64_t oo) { Vec<T>(dxp + xo, inner).setConstant(dop[oo] * scale); });
    } else {
      WalkRuns(l, [&](int64_t xo, int64_t oo) {
        Vec<T>(dxp + xo, inner) = ConstVec<T>(dop + oo, inner) * scale;
      });
    }
  }
};

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(mean)
    .Doc("Out = sum(X) / numel(X). X of any shape -> Out [1].")
    .Input("X", "any shape")
    .Output("Out", "[1]")
    .Shape(MeanShape)
    .Grad(GradMaker("mean_grad", {"X"}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(mean_grad, mean);
KEEL_REGISTER_KERNEL(CPU, mean, MeanKernel, float, double);
KEEL_REGISTER_KERNEL(CPU, mean_grad, MeanGradKernel, float, double);

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
KEEL_REGISTER_KERNEL(CPU, reduce_sum, ReduceSumKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_KERNEL(CPU, reduce_sum_grad, ReduceSumGradKernel, float, double);

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
KEEL_REGISTER_KERNEL(CPU, reduce_mean, ReduceMeanKernel, float, double);
KEEL_REGISTER_KERNEL(CPU, reduce_mean_grad, ReduceMeanGradKernel, float, double);

}  // namespace keel
