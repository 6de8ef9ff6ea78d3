// Embedding lookup and layout ops (PaddlePaddle Fluid 1.x slots and attrs): lookup_table, concat,
// split, transpose, flatten, unsqueeze, squeeze; each with its grad.
//
// Legend: V, D = vocabulary size and embedding width; [pre, n, post] = a shape split around the
// concat/split axis, so the n-slab of row i starts at i * n * post and is n * post contiguous.
//
//   lookup_table: Out[r, :] = W[Ids[r], :] (zeros where Ids[r] == padding_idx)
//                 dW[v, :] = sum over r with Ids[r] == v != padding_idx of dOut[r, :]  (dense)
//   concat / split: each other's gradient (split's grad op is a concat)
//   transpose:    dx = transpose(dout, inverse(perm))
//   flatten, unsqueeze, squeeze: copies in a new shape; dx = dout in X's shape
// The kernels are in shape_ops.h (flatten's, unsqueeze's and squeeze's in ops/device.h); here are
// the shapes, the CPU math and the registrations.
#include "ops/shape_ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/image_layout_cpu.h"
#include "ops/op_util.h"

namespace keel {
namespace {

template <typename V>
std::string ListStr(const std::vector<V>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// ---------------------------------------------------------------- lookup_table

void LookupTableShape(InferShapeContext& ctx) {
  const DDim w = ctx.GetInputDim("W");
  const DDim ids = ctx.GetInputDim("Ids");
  const int64_t padding_idx = ctx.Attr<int64_t>("padding_idx");
  KEEL_SHAPE_CHECK(w.size() == 2, "W must be [V, D], got W ", w.str());
  KEEL_SHAPE_CHECK(ctx.GetInputDType("Ids") == DType::kInt64, "Ids must be int64, got ",
                   DTypeName(ctx.GetInputDType("Ids")));
  KEEL_SHAPE_CHECK(ids.size() >= 1 && ctx.DimEq(ids[ids.size() - 1], 1),
                   "Ids must be [..., 1], got Ids ", ids.str(), " (W ", w.str(), ")");
  KEEL_SHAPE_CHECK(padding_idx == -1 || (padding_idx >= 0 && (w[0] < 0 || padding_idx < w[0])),
                   "padding_idx ", padding_idx, " is outside [0, ", w[0], ") for W ", w.str(),
                   "; use -1 for none");
  DDim out = ids;
  out[ids.size() - 1] = w[1];
  ctx.SetOutputDim("Out", out);
  ctx.SetOutputDType("Out", ctx.GetInputDType("W"));
}

// ---------------------------------------------------------------- concat, split

void ConcatShape(InferShapeContext& ctx) {
  const std::vector<DDim> xs = ctx.GetInputsDim("X");
  KEEL_SHAPE_CHECK(!xs.empty(), "needs at least one X");
  const int axis = ctx.Attr<int>("axis");
  CheckAxisInRange("axis", axis, "X[0]", xs[0]);
  const int a = CanonicalAxis(axis, xs[0].size());
  const DType dt = ctx.GetInputDType("X", 0);
  DDim out = xs[0];
  for (size_t k = 1; k < xs.size(); ++k) {
    const DDim& x = xs[k];
    KEEL_SHAPE_CHECK(ctx.GetInputDType("X", k) == dt, "X[", k, "] is ",
                     DTypeName(ctx.GetInputDType("X", k)), " but X[0] is ", DTypeName(dt));
    bool ok = x.size() == out.size();
    for (int d = 0; ok && d < x.size(); ++d) ok = d == a || ctx.DimEq(x[d], xs[0][d]);
    KEEL_SHAPE_CHECK(ok, "X[", k, "] ", x.str(), " does not match X[0] ", xs[0].str(),
                     " outside axis ", a);
    for (int d = 0; d < x.size(); ++d) {
      if (d == a) {
        out[d] = out[d] < 0 || x[d] < 0 ? -1 : out[d] + x[d];
      } else if (out[d] < 0) {
        out[d] = x[d];
      }
    }
  }
  ctx.SetOutputDim("Out", out);
  ctx.SetOutputDType("Out", dt);
}

void SplitShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X");
  const int axis = ctx.Attr<int>("axis");
  const int num = ctx.Attr<int>("num");
  const std::vector<int>& sections = ctx.Attr<std::vector<int>>("sections");
  const int outs = ctx.NumOutputs("Out");
  CheckAxisInRange("axis", axis, "X", x);
  const int a = CanonicalAxis(axis, x.size());
  const int64_t n = x[a];
  std::vector<int64_t> sizes;
  if (sections.empty()) {
    KEEL_SHAPE_CHECK(num > 0, "set num > 0 or sections; got num ", num, " for X ", x.str());
    KEEL_SHAPE_CHECK(num == outs, "num ", num, " differs from the ", outs, " Out variables");
    KEEL_SHAPE_CHECK(n < 0 || n % num == 0, "X ", x.str(), " has ", n, " along axis ", a,
                     ", not divisible into num ", num, " parts");
    sizes.assign(num, n < 0 ? -1 : n / num);
  } else {
    KEEL_SHAPE_CHECK(num == 0, "set num or sections, not both (num ", num, ", sections ",
                     ListStr(sections), ")");
    KEEL_SHAPE_CHECK(static_cast<int>(sections.size()) == outs, "sections ", ListStr(sections),
                     " has ", sections.size(), " parts but there are ", outs, " Out variables");
    int infer_at = -1;
    int64_t known = 0;
    for (size_t k = 0; k < sections.size(); ++k) {
      const int sec = sections[k];
      if (sec == -1) {
        KEEL_SHAPE_CHECK(infer_at < 0, "sections ", ListStr(sections), " has more than one -1");
        infer_at = static_cast<int>(k);
      } else {
        KEEL_SHAPE_CHECK(sec >= 0, "sections ", ListStr(sections), " has size ", sec);
        known += sec;
      }
      sizes.push_back(sec);
    }
    if (n >= 0) {
      if (infer_at >= 0) {
        KEEL_SHAPE_CHECK(known <= n, "sections ", ListStr(sections), " sum past X ", x.str(), "'s ",
                         n, " along axis ", a);
        sizes[infer_at] = n - known;
      } else {
        KEEL_SHAPE_CHECK(known == n, "sections ", ListStr(sections), " sum to ", known, " but X ",
                         x.str(), " has ", n, " along axis ", a);
      }
    }
  }
  for (int k = 0; k < outs; ++k) {
    DDim o = x;
    o[a] = sizes[k];
    ctx.SetOutputDim("Out", o, k);
    ctx.SetOutputDType("Out", ctx.GetInputDType("X"), k);
  }
}

// split's gradient: X@GRAD = concat(Out@GRAD, axis). Unused Out@GRADs are zeros (autodiff).
std::vector<std::unique_ptr<OpDesc>> SplitGradMaker(const OpDesc& fwd) {
  auto g = std::make_unique<OpDesc>("concat");
  std::vector<std::string> douts;
  for (const std::string& o : fwd.Output("Out")) douts.push_back(GradVarName(o));
  g->SetInput("X", douts);
  g->SetOutput("Out", {GradVarName(fwd.Input("X")[0])});
  g->SetAttr("axis", fwd.Attr<int>("axis"));
  std::vector<std::unique_ptr<OpDesc>> r;
  r.push_back(std::move(g));
  return r;
}

// ---------------------------------------------------------------- transpose

// perm must be a permutation of [0, rank of `x`).
void CheckPerm(const std::vector<int>& perm, const char* slot, const DDim& x) {
  std::vector<bool> seen(x.size(), false);
  bool ok = static_cast<int>(perm.size()) == x.size();
  for (size_t i = 0; ok && i < perm.size(); ++i) {
    ok = perm[i] >= 0 && perm[i] < x.size() && !seen[perm[i]];
    if (ok) seen[perm[i]] = true;
  }
  KEEL_SHAPE_CHECK(ok, "axis ", ListStr(perm), " is not a permutation of the ", x.size(),
                   " dims of ", slot, " ", x.str());
}

DDim Permuted(const DDim& x, const std::vector<int>& perm) {
  DDim out = x;
  for (size_t i = 0; i < perm.size(); ++i) out[i] = x[perm[i]];
  return out;
}

void TransposeShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X");
  const std::vector<int>& perm = ctx.Attr<std::vector<int>>("axis");
  CheckPerm(perm, "X", x);
  ctx.SetOutputDim("Out", Permuted(x, perm));
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

void TransposeGradShape(InferShapeContext& ctx) {
  const std::string dout = GradVarName("Out");
  const DDim dy = ctx.GetInputDim(dout);
  const std::vector<int>& perm = ctx.Attr<std::vector<int>>("axis");
  CheckPerm(perm, "Out@GRAD", dy);
  ctx.SetOutputDim(GradVarName("X"), Permuted(dy, InversePerm(perm)));
  ctx.SetOutputDType(GradVarName("X"), ctx.GetInputDType(dout));
}

// ---------------------------------------------------------------- flatten, unsqueeze, squeeze

void FlattenShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X");
  const int axis = ctx.Attr<int>("axis");
  KEEL_SHAPE_CHECK(axis >= 0 && axis <= x.size(), "axis ", axis, " is outside [0, ", x.size(),
                   "] for X ", x.str());
  ctx.SetOutputDim("Out", DDim{ProdOrUnknown(x, 0, axis), ProdOrUnknown(x, axis, x.size())});
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

// Inserts a 1 at each of `axes` in turn; a negative axis counts from the end of the shape built
// so far (-1 appends). X [3, 4], axes {0, -1} -> [1, 3, 4, 1].
void UnsqueezeShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X");
  const std::vector<int>& axes = ctx.Attr<std::vector<int>>("axes");
  KEEL_SHAPE_CHECK(!axes.empty(), "axes is empty for X ", x.str());
  KEEL_SHAPE_CHECK(x.size() + static_cast<int>(axes.size()) <= DDim::kMaxRank, "X ", x.str(),
                   " with axes ", ListStr(axes), " exceeds rank ", DDim::kMaxRank);
  std::vector<int64_t> out = x.vec();
  for (int axis : axes) {
    const int rank = static_cast<int>(out.size());
    const int at = axis < 0 ? axis + rank + 1 : axis;
    KEEL_SHAPE_CHECK(at >= 0 && at <= rank, "axis ", axis, " of axes ", ListStr(axes),
                     " is outside [", -rank - 1, ", ", rank, "] for X ", x.str());
    out.insert(out.begin() + at, 1);
  }
  ctx.SetOutputDim("Out", DDim(out));
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

// Removes the size-1 dims at `axes` (negative counts from the end), or every size-1 dim when axes
// is empty. At build time an unknown (-1) dim named in axes is taken to be 1; with empty axes it
// is kept.
void SqueezeShape(InferShapeContext& ctx) {
  const DDim x = ctx.GetInputDim("X");
  const std::vector<int>& axes = ctx.Attr<std::vector<int>>("axes");
  std::vector<bool> drop(x.size(), false);
  if (axes.empty())
    for (int d = 0; d < x.size(); ++d) drop[d] = x[d] == 1;
  for (int axis : axes) {
    KEEL_SHAPE_CHECK(axis >= -x.size() && axis < x.size(), "axis ", axis, " of axes ",
                     ListStr(axes), " is outside [", -x.size(), ", ", x.size(), ") for X ",
                     x.str());
    const int a = CanonicalAxis(axis, x.size());
    KEEL_SHAPE_CHECK(ctx.DimEq(x[a], 1), "axis ", axis, " of X ", x.str(), " has size ", x[a],
                     ", not 1");
    drop[a] = true;
  }
  DDim out;
  for (int d = 0; d < x.size(); ++d)
    if (!drop[d]) out.push_back(x[d]);
  ctx.SetOutputDim("Out", out);
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

}  // namespace

template <typename T>
struct LookupTableMath<CPUDevice, T> {
  static void Lookup(const ExecutionContext&, const Tensor& w, const Tensor& ids, int64_t pad,
                     T* op, DeviceReport*) {
    const int64_t V = w.dims()[0], D = w.dims()[1], rows = ids.numel();
    const T* wp = w.data<T>();
    const int64_t* idp = ids.data<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = idp[r];
      if (id == pad) {
        std::fill_n(op + r * D, D, T(0));
        continue;
      }
      if (id < 0 || id >= V) ThrowBadId(id, r, ids.dims(), w.dims());
      std::copy_n(wp + id * D, D, op + r * D);
    }
  }

  static void Grad(const ExecutionContext&, const Tensor& ids, const T* dyp, const DDim& wd,
                   int64_t pad, T* dwp, DeviceReport*) {
    const int64_t V = wd[0], D = wd[1], rows = ids.numel();
    const int64_t* idp = ids.data<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = idp[r];
      if (id == pad) continue;
      if (id < 0 || id >= V) ThrowBadId(id, r, ids.dims(), wd);
      Vec<T>(dwp + id * D, D) += ConstVec<T>(dyp + r * D, D);
    }
  }

  // The same sums, in the same order, kept for the touched rows only.
  static void SparseGrad(const ExecutionContext& ctx, const Tensor& ids, const T* dyp,
                         const DDim& wd, int64_t pad, Tensor* dw, Variable* var, DeviceReport*) {
    const int64_t V = wd[0], D = wd[1], n = ids.numel();
    const int64_t* idp = ids.data<int64_t>();
    std::vector<int64_t> rows;
    rows.reserve(n);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t id = idp[r];
      if (id == pad) continue;
      if (id < 0 || id >= V) ThrowBadId(id, r, ids.dims(), wd);
      rows.push_back(id);
    }
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    dw->Resize(DDim({static_cast<int64_t>(rows.size()), D}));
    T* dwp = dw->mutable_data<T>(ctx.place());
    std::fill_n(dwp, rows.size() * D, T(0));
    for (int64_t r = 0; r < n; ++r) {
      if (idp[r] == pad) continue;
      const int64_t k = std::lower_bound(rows.begin(), rows.end(), idp[r]) - rows.begin();
      Vec<T>(dwp + k * D, D) += ConstVec<T>(dyp + r * D, D);
    }
    var->SetRows(V, std::move(rows));
  }
};

// Walks out in order, stepping through in with in's stride of dim perm[d] (an odometer). The
// trailing dims that stay in place (perm[d] == d from some d on: the attention's [N, L, H, E] ->
// [N, H, L, E]) are one contiguous run in both, copied whole at each step. A permutation that
// swaps two blocks of trailing dims after some leading ones (a matrix's [1, 0]; NCHW to NHWC's
// [0, 2, 3, 1] and back's [0, 3, 1, 2]) is a batch of 2-D transposes, copied in 16 x 16 tiles
// (ops/image_layout_cpu.h): the odometer's one element a step took 267 us for ResNet-20's
// [32, 3, 32, 32] images.
template <typename T>
struct TransposeMath<CPUDevice, T> {
  static void Run(const ExecutionContext&, const DDim& id, const std::vector<int>& perm,
                  const T* src, T* dst) {
    const int rank = id.size();
    const int64_t n = id.numel();
    int t = rank;  // dims [t, rank) stay in place
    while (t > 0 && perm[t - 1] == t - 1) --t;
    if (t == 0) {
      std::copy_n(src, n, dst);
      return;
    }
    if (t == rank && n > 0) {
      int k = 0;  // dims [0, k) stay in place; perm[k, rank) = [j, rank) then [k, j)?
      while (perm[k] == k) ++k;
      const int j = perm[k];
      bool swap = true;
      for (int d = k; d < rank; ++d)
        swap = swap && perm[d] == (d - k < rank - j ? j + d - k : k + d - k - (rank - j));
      if (swap) {
        TransposeImages(src, dst, id.prod(0, k), id.prod(k, j), id.prod(j, rank),
                        /*to_planes=*/true);
        return;
      }
    }
    int64_t run = 1;
    for (int d = t; d < rank; ++d) run *= id[d];
    std::vector<int64_t> in_stride(rank, 1), step(t), size(t), idx(t, 0);
    for (int d = rank - 2; d >= 0; --d) in_stride[d] = in_stride[d + 1] * id[d + 1];
    for (int d = 0; d < t; ++d) {
      step[d] = in_stride[perm[d]];
      size[d] = id[perm[d]];
    }
    int64_t off = 0;
    for (int64_t o = 0; o < n; o += run) {
      if (run == 1)
        dst[o] = src[off];
      else
        std::copy_n(src + off, run, dst + o);
      for (int d = t - 1; d >= 0; --d) {
        off += step[d];
        if (++idx[d] < size[d]) break;
        off -= step[d] * size[d];
        idx[d] = 0;
      }
    }
  }
};

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(lookup_table)
    .Doc(
        "Out[..., :] = W[Ids[..., 0], :]; rows whose id is padding_idx are zeros. "
        "W [V, D], Ids int64 [N, 1] -> Out [N, D]; Ids [B, T, 1] -> Out [B, T, D].")
    .Input("W", "the embedding table [V, D]")
    .Input("Ids", "int64 [..., 1], each in [0, V)")
    .Output("Out", "Ids' shape with the last dim D, W's dtype")
    .Attr<int64_t>("padding_idx", -1, "an id whose output is zeros and gets no gradient; -1: none")
    .Attr<bool>("is_sparse", false,
                "W's gradient holds only the rows the ids touch (row-sparse, each row once, "
                "sorted), which sgd, momentum and adam (lazy_mode) update; false: a dense [V, D] "
                "gradient")
    .Attr<bool>("is_distributed", false,
                "W is a distributed table (needs is_sparse): in parameter-server training it "
                "lives on the servers (the transpiler turns this op into "
                "distributed_lookup_table); elsewhere a lookup like any other")
    .Shape(LookupTableShape)
    .Grad(GradMaker("lookup_table_grad", {"W", "Ids"}, {"Out"}, {"W"}));
// W only for W@GRAD's shape: a dense [V, D] tensor, or with is_sparse its touched rows.
KEEL_REGISTER_GRAD_OP(lookup_table_grad, lookup_table).WritesRowSparseWhen("W@GRAD", "is_sparse");
KEEL_REGISTER_KERNEL(CPU, lookup_table, LookupTableKernel, float, double);
KEEL_REGISTER_KERNEL(CPU, lookup_table_grad, LookupTableGradKernel, float, double);

KEEL_REGISTER_OP(concat)
    .Doc(
        "Out = X[0], X[1], ... joined along axis; the other dims must agree. "
        "X [2, 3], [2, 5], axis 1 -> Out [2, 8].")
    .InputList("X", "one or more tensors of one dtype and rank")
    .Output("Out", "the sum of the X along axis, their dims elsewhere")
    .Attr<int>("axis", 0, "the joined dimension; negative counts from the end")
    .Shape(ConcatShape)
    .Grad(GradMaker("concat_grad", {"X"}, {"Out"}, {"X"}));  // X for the slab sizes
KEEL_REGISTER_GRAD_OP(concat_grad, concat);
KEEL_REGISTER_KERNEL(CPU, concat, ConcatKernel, float, double, int32_t, int64_t, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, concat_grad, ConcatGradKernel, float, double, bfloat16, float16);

KEEL_REGISTER_OP(split)
    .Doc(
        "Out[k] = the k-th part of X along axis: num equal parts, or parts of the given "
        "sections (one may be -1, inferred). "
        "X [4, 6], sections {1, -1, 2}, axis 1 -> Out [4, 1], [4, 3], [4, 2].")
    .Input("X", "any shape")
    .OutputList("Out", "the parts, one var each")
    .Attr<int>("num", 0, "number of equal parts; 0: use sections")
    .Attr<std::vector<int>>("sections", {}, "size of each part along axis; one -1 is inferred")
    .Attr<int>("axis", 0, "the split dimension; negative counts from the end")
    .Shape(SplitShape)
    .Grad(SplitGradMaker);
KEEL_REGISTER_KERNEL(CPU, split, SplitKernel, float, double, int32_t, int64_t, bfloat16, float16);

KEEL_REGISTER_OP(transpose)
    .Doc("Out's dim i is X's dim axis[i]. X [2, 3, 4], axis {2, 0, 1} -> Out [4, 2, 3].")
    .Input("X", "any shape")
    .Output("Out", "X's dims permuted")
    .RequiredAttr<std::vector<int>>("axis", "a permutation of [0, rank of X)")
    .Shape(TransposeShape)
    .Grad(GradMaker("transpose_grad", {}, {"Out"}, {"X"}));
KEEL_REGISTER_GRAD_OP(transpose_grad, transpose)
    .Shape(TransposeGradShape)
    .KernelDTypeFrom(GradVarName("Out"));
KEEL_REGISTER_KERNEL(CPU, transpose, TransposeKernel, float, double, int32_t, int64_t, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CPU, transpose_grad, TransposeGradKernel, float, double, bfloat16, float16);

KEEL_REGISTER_OP(flatten)
    .Doc("Out = X as [prod(dims[:axis]), prod(dims[axis:])]. X [2, 3, 4], axis 1 -> [2, 12].")
    .Input("X", "any shape")
    .Output("Out", "2-D, X's elements")
    .Attr<int>("axis", 1, "dims before it become rows, the rest columns; in [0, rank]")
    .Shape(FlattenShape)
    .Grad(GradMaker("flatten_grad", {"X"}, {"Out"}, {"X"}))  // X for X@GRAD's shape
    .MayShareBuffer("Out", "X");
KEEL_REGISTER_GRAD_OP(flatten_grad, flatten).MayShareBuffer(GradVarName("X"), GradVarName("Out"));
KEEL_REGISTER_KERNEL(CPU, flatten, CopyKernel, float, double, int32_t, int64_t, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, flatten_grad, CopyGradKernel, float, double, bfloat16, float16);

KEEL_REGISTER_OP(unsqueeze)
    .Doc("Out = X with a size-1 dim inserted at each of axes, in turn. X [3], axes {0} -> [1, 3].")
    .Input("X", "any shape")
    .Output("Out", "X's elements, rank + len(axes)")
    .RequiredAttr<std::vector<int>>("axes", "where to insert; negative counts from the end")
    .Shape(UnsqueezeShape)
    .Grad(GradMaker("unsqueeze_grad", {"X"}, {"Out"}, {"X"}))
    .MayShareBuffer("Out", "X");
KEEL_REGISTER_GRAD_OP(unsqueeze_grad, unsqueeze)
    .MayShareBuffer(GradVarName("X"), GradVarName("Out"));
KEEL_REGISTER_KERNEL(CPU, unsqueeze, CopyKernel, float, double, int32_t, int64_t, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CPU, unsqueeze_grad, CopyGradKernel, float, double, bfloat16, float16);

KEEL_REGISTER_OP(squeeze)
    .Doc("Out = X without the size-1 dims at axes (all of them if empty). [1, 3, 1] -> [3].")
    .Input("X", "any shape")
    .Output("Out", "X's elements")
    .Attr<std::vector<int>>("axes", {}, "size-1 dims to drop; empty: every size-1 dim")
    .Shape(SqueezeShape)
    .Grad(GradMaker("squeeze_grad", {"X"}, {"Out"}, {"X"}))
    .MayShareBuffer("Out", "X");
KEEL_REGISTER_GRAD_OP(squeeze_grad, squeeze).MayShareBuffer(GradVarName("X"), GradVarName("Out"));
KEEL_REGISTER_KERNEL(CPU, squeeze, CopyKernel, float, double, int32_t, int64_t, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, squeeze_grad, CopyGradKernel, float, double, bfloat16, float16);

}  // namespace keel
