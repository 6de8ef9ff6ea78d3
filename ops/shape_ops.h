// The kernels of the embedding lookup and the layout ops (shape_ops.cc has the ops and their
// shapes): lookup_table, concat, split, transpose, each with its grad, once for every device
// (ops/device.h); flatten, unsqueeze and squeeze are CopyKernel.
//
// Legend: V, D = vocabulary size and embedding width; [pre, n, post] = a shape split around the
// concat/split axis, so the n-slab of row i starts at i * n * post and is n * post contiguous.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/axis_layout.h"
#include "ops/device.h"

namespace keel {

// ---------------------------------------------------------------- lookup_table

// `note` follows the message: where a device found the id in an earlier run.
[[noreturn]] inline void ThrowBadId(long long id, long long at, const DDim& ids, const DDim& w,
                                    const char* note = "") {
  KEEL_THROW("Ids value ", id, " at flat index ", at, " of Ids ", ids.str(), " is outside [0, ",
             w[0], ") for W ", w.str(), note);
}
constexpr const char* kFoundOnDevice = " (found on the device in an earlier run)";

// The device math. An id outside [0, V) throws on the CPU; a device reports it (its output row
// is NaN, its gradient skipped) for the op's next run to throw.
//   Lookup(ctx, w, ids, pad, out, report)          out[r, :] = w[ids[r], :], zeros for pad
//   Grad(ctx, ids, dout, w_dims, pad, dw, report)  dw[ids[r], :] += dout[r, :], rows in order
//   SparseGrad(ctx, ids, dout, w_dims, pad, dw, var, report)
//                                                  is_sparse: the same sums for the touched rows
//                                                  only, dw [n, D] and var's rows (CPU only)
template <typename D, typename T>
struct LookupTableMath;

// What both lookup_table kernels keep: padding_idx, and where a device reports bad ids.
template <typename D>
class LookupTableKernelBase : public OpKernel {
 public:
  explicit LookupTableKernelBase(const OpDesc& op)
      : padding_idx_(op.Attr<int64_t>("padding_idx")) {}
  // Throws a bad id that a device found in an earlier run.
  void Replayed(ExecutionContext& ctx) override {
    const DDim& ids = ctx.Input("Ids").dims();
    const DDim& w = ctx.Input("W").dims();
    report_.Check([&](long long id, long long at) { ThrowBadId(id, at, ids, w, kFoundOnDevice); });
  }

 protected:
  int64_t padding_idx_;
  typename Device<D>::Reports report_;
};

// Out[r, :] = W[Ids[r], :], zeros where Ids[r] == padding_idx.
template <typename D, typename T>
class LookupTableKernel : public LookupTableKernelBase<D> {
 public:
  using LookupTableKernelBase<D>::LookupTableKernelBase;
  void Compute(ExecutionContext& ctx) override {
    this->Replayed(ctx);
    T* op = ctx.Output("Out")->mutable_data<T>(ctx.place());
    LookupTableMath<D, T>::Lookup(ctx, ctx.Input("W"), ctx.Input("Ids"), this->padding_idx_, op,
                                  this->report_.device(ctx));
  }
};

// dW = 0; dW[Ids[r], :] += dOut[r, :] for Ids[r] != padding_idx (a dense [V, D] gradient, or
// with is_sparse the rows Ids touch).
template <typename D, typename T>
class LookupTableGradKernel : public LookupTableKernelBase<D> {
 public:
  explicit LookupTableGradKernel(const OpDesc& op)
      : LookupTableKernelBase<D>(op), is_sparse_(op.Attr<bool>("is_sparse")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dw = GradOutput(ctx, "W");
    if (dw == nullptr) return;
    this->Replayed(ctx);
    const Tensor& ids = ctx.Input("Ids");
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    const DDim wd = dw->dims();
    KEEL_ENFORCE(dout.numel() == ids.numel() * wd[1], "Out@GRAD ", dout.dims().str(),
                 " does not match Ids ", ids.dims().str(), " and W ", wd.str());
    if (is_sparse_) {
      LookupTableMath<D, T>::SparseGrad(ctx, ids, dout.data<T>(), wd, this->padding_idx_, dw,
                                        ctx.OutputVar(GradVarName("W")), this->report_.device(ctx));
      return;
    }
    T* dwp = dw->mutable_data<T>(ctx.place());
    Device<D>::Zero(ctx, dwp, wd[0] * wd[1]);
    LookupTableMath<D, T>::Grad(ctx, ids, dout.data<T>(), wd, this->padding_idx_, dwp,
                                this->report_.device(ctx));
  }

 private:
  bool is_sparse_;
};

// ---------------------------------------------------------------- concat, split

// Copies between a [pre, sum(ns), post] tensor `whole` and its parts [pre, ns[k], post] cut along
// the middle dim, part by part (to_whole: parts into whole). A null part (a gradient nobody needs)
// is skipped.
template <typename D, typename T>
void CopySlabs(const ExecutionContext& ctx, int64_t pre, int64_t post,
               const std::vector<int64_t>& ns, T* whole, const std::vector<T*>& parts,
               bool to_whole) {
  int64_t total = 0;
  for (int64_t n : ns) total += n;
  int64_t off = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const int64_t len = ns[k] * post;
    if (parts[k] != nullptr) {
      if (to_whole) {
        Device<D>::CopyRows(ctx, parts[k], len, whole + off, total * post, pre, len);
      } else {
        Device<D>::CopyRows(ctx, whole + off, total * post, parts[k], len, pre, len);
      }
    }
    off += len;
  }
}

// Out = X[0], X[1], ... back to back along `axis`.
template <typename D, typename T>
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
    CopySlabs<D, T>(ctx, s.pre, s.post, ns, out->mutable_data<T>(ctx.place()), parts, true);
  }

 private:
  int axis_;
};

// X@GRAD[k] = the slab of Out@GRAD that X[k] filled.
template <typename D, typename T>
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
    CopySlabs<D, T>(ctx, s.pre, s.post, ns, const_cast<T*>(dout.data<T>()), parts, false);
  }

 private:
  int axis_;
};

// Out[k] = the k-th slab of X along `axis`, of the size the shape function gave it.
template <typename D, typename T>
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
    CopySlabs<D, T>(ctx, s.pre, s.post, ns, const_cast<T*>(x.data<T>()), parts, false);
  }

 private:
  int axis_;
};

// ---------------------------------------------------------------- transpose

// Kernels build it from the attribute before any shape check runs: a non-permutation is refused.
inline std::vector<int> InversePerm(const std::vector<int>& perm) {
  std::vector<int> inv(perm.size(), -1);
  for (size_t i = 0; i < perm.size(); ++i) {
    const int p = perm[i];
    KEEL_ENFORCE(p >= 0 && p < static_cast<int>(perm.size()) && inv[p] < 0, "axis ", IntsStr(perm),
                 " is not a permutation");
    inv[p] = static_cast<int>(i);
  }
  return inv;
}

// The device math: TransposeMath<D, T>::Run(ctx, x_dims, perm, src, dst) writes out = x with
// out's dim d being x's dim perm[d] (x of rank >= 1, not empty).
template <typename D, typename T>
struct TransposeMath;

template <typename D, typename T>
void TransposeInto(const ExecutionContext& ctx, const Tensor& in, const std::vector<int>& perm,
                   Tensor* out) {
  const T* src = in.data<T>();
  T* dst = out->mutable_data<T>(ctx.place());
  KEEL_ENFORCE(static_cast<int>(perm.size()) == in.dims().size(), "axis has ", perm.size(),
               " entries for a tensor of rank ", in.dims().size());
  if (in.dims().size() == 0 || in.numel() == 0) {
    Device<D>::Copy(ctx, src, dst, in.numel());
    return;
  }
  TransposeMath<D, T>::Run(ctx, in.dims(), perm, src, dst);
}

template <typename D, typename T>
class TransposeKernel : public OpKernel {
 public:
  explicit TransposeKernel(const OpDesc& op) : perm_(op.Attr<std::vector<int>>("axis")) {}
  void Compute(ExecutionContext& ctx) override {
    TransposeInto<D, T>(ctx, ctx.Input("X"), perm_, ctx.Output("Out"));
  }

 private:
  std::vector<int> perm_;
};

// dx = transpose(dout, inverse(perm)).
template <typename D, typename T>
class TransposeGradKernel : public OpKernel {
 public:
  explicit TransposeGradKernel(const OpDesc& op)
      : inv_(InversePerm(op.Attr<std::vector<int>>("axis"))) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "X");
    if (dx == nullptr) return;
    TransposeInto<D, T>(ctx, ctx.Input(GradVarName("Out")), inv_, dx);
  }

 private:
  std::vector<int> inv_;
};

}  // namespace keel
