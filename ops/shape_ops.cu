// CUDA twins of shape_ops.cc: lookup_table, concat, split, transpose, flatten, squeeze,
// unsqueeze. Joins and splits are strided 2-D copies (cudaMemcpy2DAsync), one per part;
// transpose maps each output element to its source through fn::TransposePlan (the CPU
// kernel's bookkeeping, tested on the CPU).
#include <vector>

#include "ops/cuda_util.cuh"
#include "ops/functors/index_plans.h"

namespace keel {
namespace {

// ------------------------------------------------------------------------------- lookup_table

[[noreturn]] void ThrowBadId(long long id, long long at, const DDim& ids, const DDim& w) {
  KEEL_THROW("Ids value ", id, " at flat index ", at, " of Ids ", ids.str(), " is outside [0, ",
             w[0], ") for W ", w.str(), " (found on the device in an earlier run)");
}

// Out[r, :] = W[ids[r], :]; zeros for padding_idx; an id outside [0, V) is reported and its row
// is NaN.
template <typename T>
class LookupTableKernel : public OpKernel {
 public:
  explicit LookupTableKernel(const OpDesc& op) : padding_idx_(op.Attr<int64_t>("padding_idx")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& w = ctx.Input("W");
    const Tensor& ids = ctx.Input("Ids");
    report_.Check([&](long long id, long long at) { ThrowBadId(id, at, ids.dims(), w.dims()); });
    const int64_t V = w.dims()[0], D = w.dims()[1], rows = ids.numel();
    const T* wp = w.data<T>();
    const int64_t* idp = ids.data<int64_t>();
    T* op = ctx.Output("Out")->mutable_data<T>(ctx.place());
    const int64_t pad = padding_idx_;
    DeviceReport* report = report_.device(ctx);
    ForEach(ctx, rows * D, [=] __device__(int64_t k) {
      const int64_t r = k / D, d = k % D, id = idp[r];
      if (id == pad) {
        op[k] = T(0);
      } else if (id < 0 || id >= V) {
        if (d == 0) Report(report, id, r);
        op[k] = T(NAN);
      } else {
        op[k] = wp[id * D + d];
      }
    });
  }

  void Replayed(ExecutionContext& ctx) override {
    const DDim& ids = ctx.Input("Ids").dims();
    const DDim& w = ctx.Input("W").dims();
    report_.Check([&](long long id, long long at) { ThrowBadId(id, at, ids, w); });
  }

 private:
  int64_t padding_idx_;
  DeviceReportSlot report_;
};

// dW[v, d] = sum of dout[r, d] over rows r with ids[r] = v: one thread per column d walks the
// rows in order, so the sums are deterministic and in the CPU kernel's order.
// An id outside [0, V) is reported (by column 0's thread) and skipped.
template <typename T>
__global__ void LookupTableGradColumns(const int64_t* ids, const T* dout, T* dw, int64_t rows,
                                       int64_t V, int64_t D, int64_t pad, DeviceReport* report) {
  for (int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; d < D;
       d += int64_t(blockDim.x) * gridDim.x)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = ids[r];
      if (id == pad) continue;
      if (id < 0 || id >= V) {
        if (d == 0) Report(report, id, r);
        continue;
      }
      dw[id * D + d] += dout[r * D + d];
    }
}

template <typename T>
class LookupTableGradKernel : public OpKernel {
 public:
  explicit LookupTableGradKernel(const OpDesc& op)
      : padding_idx_(op.Attr<int64_t>("padding_idx")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dw = ctx.OutputOrNull(GradVarName("W"));
    if (dw == nullptr) return;
    const Tensor& ids = ctx.Input("Ids");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    const DDim wd = dw->dims();
    report_.Check([&](long long id, long long at) { ThrowBadId(id, at, ids.dims(), wd); });
    const int64_t V = wd[0], D = wd[1], rows = ids.numel();
    KEEL_ENFORCE(dout.numel() == rows * D, "Out@GRAD ", dout.dims().str(), " does not match Ids ",
                 ids.dims().str(), " and W ", wd.str());
    T* dwp = dw->mutable_data<T>(ctx.place());
    KEEL_CUDA_CHECK(cudaMemsetAsync(dwp, 0, V * D * sizeof(T), Cuda(ctx).stream()));
    if (rows == 0 || D == 0) return;
    LookupTableGradColumns<T><<<GridFor(D, 128), 128, 0, Cuda(ctx).stream()>>>(
        ids.data<int64_t>(), dout.data<T>(), dwp, rows, V, D, padding_idx_, report_.device(ctx));
    KEEL_CUDA_LAUNCH_CHECK();
  }
  void Replayed(ExecutionContext& ctx) override {
    const DDim& ids = ctx.Input("Ids").dims();
    const DDim& w = ctx.Input("W").dims();
    report_.Check([&](long long id, long long at) { ThrowBadId(id, at, ids, w); });
  }

 private:
  int64_t padding_idx_;
  DeviceReportSlot report_;
};

// -------------------------------------------------------------------------- concat, split

// Part k of `whole` along the axis: whole is [pre, total, post], part k is [pre, ns[k], post]
// starting at offset sum(ns[:k]) * post in each of the pre rows. to_whole: part -> whole.
template <typename T>
void CopySlabs(const ExecutionContext& ctx, int64_t pre, int64_t post,
               const std::vector<int64_t>& ns, T* whole, const std::vector<T*>& parts,
               bool to_whole) {
  int64_t total = 0;
  for (int64_t n : ns) total += n;
  int64_t off = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const int64_t len = ns[k] * post;
    if (parts[k] != nullptr && len > 0 && pre == 1) {  // one contiguous run (any size)
      T* w = whole + off;
      KEEL_CUDA_CHECK(cudaMemcpyAsync(to_whole ? w : parts[k], to_whole ? parts[k] : w,
                                      len * sizeof(T), cudaMemcpyDeviceToDevice,
                                      Cuda(ctx).stream()));
    } else if (parts[k] != nullptr && len > 0 && pre > 0) {
      T* w = whole + off;
      const size_t wpitch = total * post * sizeof(T), ppitch = len * sizeof(T);
      if (to_whole)
        KEEL_CUDA_CHECK(cudaMemcpy2DAsync(w, wpitch, parts[k], ppitch, ppitch, pre,
                                          cudaMemcpyDeviceToDevice, Cuda(ctx).stream()));
      else
        KEEL_CUDA_CHECK(cudaMemcpy2DAsync(parts[k], ppitch, w, wpitch, ppitch, pre,
                                          cudaMemcpyDeviceToDevice, Cuda(ctx).stream()));
    }
    off += len;
  }
}

template <typename T>
class ConcatKernel : public OpKernel {
 public:
  explicit ConcatKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    std::vector<const Tensor*> xs = ctx.MultiInput("X");
    Tensor* out = ctx.Output("Out");
    const AxisSplit s = SplitAt(out->dims(), axis_);
    const int a = CanonicalAxis(axis_, out->dims().size());
    std::vector<int64_t> ns;
    std::vector<T*> parts;
    for (const Tensor* x : xs) {
      ns.push_back(x->dims()[a]);
      parts.push_back(const_cast<T*>(x->data<T>()));
    }
    CopySlabs<T>(ctx, s.pre, s.post, ns, out->mutable_data<T>(ctx.place()), parts, true);
  }

 private:
  int axis_;
};

template <typename T>
class ConcatGradKernel : public OpKernel {
 public:
  explicit ConcatGradKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    std::vector<Tensor*> dxs = ctx.MultiOutput(GradVarName("X"));
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    const AxisSplit s = SplitAt(dout.dims(), axis_);
    const int a = CanonicalAxis(axis_, dout.dims().size());
    std::vector<int64_t> ns;
    std::vector<T*> parts;
    for (size_t k = 0; k < dxs.size(); ++k) {
      ns.push_back(ctx.Input("X", static_cast<int>(k)).dims()[a]);
      parts.push_back(dxs[k] ? dxs[k]->mutable_data<T>(ctx.place()) : nullptr);
    }
    CopySlabs<T>(ctx, s.pre, s.post, ns, const_cast<T*>(dout.data<T>()), parts, false);
  }

 private:
  int axis_;
};

template <typename T>
class SplitKernel : public OpKernel {
 public:
  explicit SplitKernel(const OpDesc& op) : axis_(op.Attr<int>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    std::vector<Tensor*> outs = ctx.MultiOutput("Out");
    const AxisSplit s = SplitAt(x.dims(), axis_);
    const int a = CanonicalAxis(axis_, x.dims().size());
    std::vector<int64_t> ns;
    std::vector<T*> parts;
    for (Tensor* o : outs) {
      KEEL_ENFORCE(o != nullptr, "every Out of split must be set");
      ns.push_back(o->dims()[a]);
      parts.push_back(o->mutable_data<T>(ctx.place()));
    }
    CopySlabs<T>(ctx, s.pre, s.post, ns, const_cast<T*>(x.data<T>()), parts, false);
  }

 private:
  int axis_;
};

// ---------------------------------------------------------------------------------- transpose

std::vector<int> InversePerm(const std::vector<int>& perm) {
  std::vector<int> inv(perm.size(), -1);
  for (size_t i = 0; i < perm.size(); ++i) {
    const int p = perm[i];
    KEEL_ENFORCE(p >= 0 && p < static_cast<int>(perm.size()) && inv[p] < 0,
                 "axis is not a "
                 "permutation");
    inv[p] = static_cast<int>(i);
  }
  return inv;
}

// out[o] = in[SrcIndex(o)].
template <typename T>
void TransposeInto(const ExecutionContext& ctx, const Tensor& in, const std::vector<int>& perm,
                   Tensor* out) {
  const T* src = in.data<T>();
  T* dst = out->mutable_data<T>(ctx.place());
  KEEL_ENFORCE(static_cast<int>(perm.size()) == in.dims().size(), "axis has ", perm.size(),
               " entries for a tensor of rank ", in.dims().size());
  if (in.dims().size() == 0) {
    CopyOnStream(ctx, src, dst, in.numel());
    return;
  }
  const fn::TransposePlan p = fn::MakeTransposePlan(in.dims(), perm);
  ForEach(ctx, in.numel(), [=] __device__(int64_t o) { dst[o] = src[p.SrcIndex(o)]; });
}

template <typename T>
class TransposeKernel : public OpKernel {
 public:
  explicit TransposeKernel(const OpDesc& op) : perm_(op.Attr<std::vector<int>>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    TransposeInto<T>(ctx, ctx.Input("X"), perm_, ctx.Output("Out"));
  }

 private:
  std::vector<int> perm_;
};

template <typename T>
class TransposeGradKernel : public OpKernel {
 public:
  explicit TransposeGradKernel(const OpDesc& op)
      : inv_(InversePerm(op.Attr<std::vector<int>>("axis"))) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    TransposeInto<T>(ctx, ctx.Input(GradVarName("Out")), inv_, dx);
  }

 private:
  std::vector<int> inv_;
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(lookup_table, LookupTableKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(lookup_table_grad, LookupTableGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(concat, ConcatKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(concat_grad, ConcatGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(split, SplitKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(transpose, TransposeKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(transpose_grad, TransposeGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(flatten, CudaCopyKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(flatten_grad, CudaCopyGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(unsqueeze, CudaCopyKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(unsqueeze_grad, CudaCopyGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(squeeze, CudaCopyKernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(squeeze_grad, CudaCopyGradKernel, float, double);

}  // namespace keel
