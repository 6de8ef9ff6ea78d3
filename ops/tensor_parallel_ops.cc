// Megatron-style tensor-parallel ops (Paddle's names and semantics), on the tensor-parallel ring
// (transpiler/tensor_parallel.h; docs/tensor-parallel.md):
//
//   op                forward                              backward (its grad op)
//   c_identity        Out = X                              X@GRAD = all-reduce sum of Out@GRAD
//   mp_allreduce_sum  Out = all-reduce sum of X            X@GRAD = Out@GRAD (assign)
//   c_split           Out = this rank's part of X along    X@GRAD = c_concat of Out@GRAD
//                     `axis` (X's dim / nranks wide)
//   c_concat          Out = the ranks' X concatenated      X@GRAD = c_split of Out@GRAD
//                     along `axis`
//
// Shape algebra (n = nranks, a = axis, negative counting from the end):
//   c_split:  X [..., d_a, ...] -> Out [..., d_a / n, ...]   (d_a must divide by n)
//   c_concat: X [..., d_a, ...] -> Out [..., d_a * n, ...]
// Paddle splits and concatenates along the last dim only; keel's `axis` (default -1, Paddle's
// behaviour) also lets the startup program cut a row-parallel weight along dim 0.
//
// c_identity and mp_allreduce_sum run on their ring (the executor's ring thread, or in order with
// compute under use_calc_stream) through the place-agnostic collective kernels, so they serve
// CUDA places too. c_split's slicing and c_concat's reordering are host loops: CPU kernels only
// (a CUDA place runs them on host copies when FLAGS_cuda_host_fallback allows, else the executor
// names the op as having no CUDA kernel).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "framework/comm/collective_watch.h"
#include "framework/comm/comm_context.h"
#include "framework/comm/communicator.h"
#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/device.h"
#include "ops/collective_op_call.h"
#include "ops/device.h"

namespace keel {

namespace {

std::string NonNegative(const Attribute& a) { return std::get<int>(a) >= 0 ? "" : "must be >= 0"; }
std::string Positive(const Attribute& a) { return std::get<int>(a) >= 1 ? "" : "must be >= 1"; }

Communicator& TpRing(const ExecutionContext& ctx) {
  return RingRegistry::Get().At(ctx.Attr<int>("ring_id"), ctx.op().type());
}

// Out = X (a copy unless they alias, on the ring's stream for CUDA tensors), then all-reduce sum
// of Out on the ring.
void CopyThenReduce(ExecutionContext& ctx) {
  const Tensor& x = ctx.Input("X");
  Tensor* out = ctx.Output("Out");
  if (out->holder() != x.holder() || out->offset() != x.offset()) {
    out->Resize(x.dims());
    out->mutable_data(x.dtype(), ctx.place());
    void* ring_stream = x.place().is_cuda() ? TpRing(ctx).device_stream() : nullptr;
    if (ring_stream != nullptr) {
      DeviceCopyOnStreamAfterCompute(ctx.place(), out->raw_data(), x.raw_data(), x.nbytes(),
                                     ring_stream);
    } else {
      out->CopyFrom(x);
    }
  }
  AsOp(ctx, [&] { TpRing(ctx).AllReduce(out, ReduceOp::kSum); });
}

// c_identity's forward is a plain copy on the compute side; its ring is its grad's.
template <typename T>
class IdentityKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    Tensor* out = ctx.Output("Out");
    if (out->holder() == x.holder() && out->offset() == x.offset()) return;
    out->Resize(x.dims());
    if (ShareInput(ctx, "Out", x, out)) return;
    out->mutable_data(x.dtype(), ctx.place());
    out->CopyFrom(x);
  }
};

template <typename T>
class MpAllReduceKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override { CopyThenReduce(ctx); }
};

// Axis arithmetic shared by the shapes and the kernels.
int NormAxis(int axis, int rank) { return axis < 0 ? axis + rank : axis; }

void CheckRankAttrs(InferShapeContext& ctx) {
  const int n = ctx.Attr<int>("nranks"), r = ctx.Attr<int>("rank");
  KEEL_SHAPE_CHECK(r < n, "rank ", r, " must be < nranks ", n);
}

void SplitShape(InferShapeContext& ctx) {
  CheckRankAttrs(ctx);
  DDim d = ctx.GetInputDim("X");
  const int n = ctx.Attr<int>("nranks");
  const int a = NormAxis(ctx.Attr<int>("axis"), d.size());
  KEEL_SHAPE_CHECK(a >= 0 && a < d.size(), "axis ", ctx.Attr<int>("axis"), " is outside the ",
                   d.size(), " dims of X ", d.str());
  if (d[a] > 0) {
    KEEL_SHAPE_CHECK(d[a] % n == 0, "dim ", a, " of X ", d.str(), " must divide by nranks ", n);
    d[a] /= n;
  }
  ctx.SetOutputDim("Out", d);
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

void ConcatShape(InferShapeContext& ctx) {
  CheckRankAttrs(ctx);
  DDim d = ctx.GetInputDim("X");
  const int a = NormAxis(ctx.Attr<int>("axis"), d.size());
  KEEL_SHAPE_CHECK(a >= 0 && a < d.size(), "axis ", ctx.Attr<int>("axis"), " is outside the ",
                   d.size(), " dims of X ", d.str());
  if (d[a] > 0) d[a] *= ctx.Attr<int>("nranks");
  ctx.SetOutputDim("Out", d);
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

// [outer, mid, inner] of `d` around axis a (bytes of one element folded into inner by callers).
struct Around {
  int64_t outer = 1, mid = 1, inner = 1;
};
Around AroundAxis(const DDim& d, int a) {
  Around r;
  for (int i = 0; i < a; ++i) r.outer *= d[i];
  r.mid = d[a];
  for (int i = a + 1; i < d.size(); ++i) r.inner *= d[i];
  return r;
}

template <typename T>
class CSplitKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const int n = ctx.Attr<int>("nranks"), r = ctx.Attr<int>("rank");
    const int a = NormAxis(ctx.Attr<int>("axis"), x.dims().size());
    KEEL_ENFORCE(a >= 0 && a < x.dims().size() && x.dims()[a] % n == 0, "op c_split: X ",
                 x.dims().str(), " cannot be cut into ", n, " parts along axis ",
                 ctx.Attr<int>("axis"));
    const Around s = AroundAxis(x.dims(), a);
    DDim od = x.dims();
    od[a] /= n;
    Tensor* out = ctx.Output("Out");
    out->Resize(od);
    char* o = static_cast<char*>(out->mutable_data(x.dtype(), ctx.place()));
    const char* in = static_cast<const char*>(x.raw_data());
    const size_t es = SizeOf(x.dtype());
    const size_t part = static_cast<size_t>(s.mid / n * s.inner) * es;
    const size_t row = static_cast<size_t>(s.mid * s.inner) * es;
    for (int64_t i = 0; i < s.outer; ++i)
      std::memcpy(o + i * part, in + i * row + static_cast<size_t>(r) * part, part);
  }
};

template <typename T>
class CConcatKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const int n = ctx.Attr<int>("nranks");
    const int a = NormAxis(ctx.Attr<int>("axis"), x.dims().size());
    KEEL_ENFORCE(a >= 0 && a < x.dims().size(), "op c_concat: axis ", ctx.Attr<int>("axis"),
                 " is outside the dims of X ", x.dims().str());
    DDim od = x.dims();
    od[a] *= n;
    Tensor* out = ctx.Output("Out");
    if (n == 1) {
      out->Resize(od);
      out->mutable_data(x.dtype(), ctx.place());
      out->CopyFrom(x);
      return;
    }
    // The ring gathers along dim 0: [n, X...]; then part k of every outer row goes to column
    // block k of Out.
    Tensor gathered;
    AsOp(ctx, [&] {
      Communicator& ring = TpRing(ctx);
      KEEL_ENFORCE(ring.nranks() == n, "op c_concat: nranks=", n, " but ring ",
                   ctx.Attr<int>("ring_id"), " has ", ring.nranks(), " ranks");
      ring.AllGather(x, &gathered);
    });
    const Around s = AroundAxis(x.dims(), a);
    out->Resize(od);
    char* o = static_cast<char*>(out->mutable_data(x.dtype(), ctx.place()));
    const char* g = static_cast<const char*>(gathered.raw_data());
    const size_t es = SizeOf(x.dtype());
    const size_t part = static_cast<size_t>(s.mid * s.inner) * es;  // one rank's outer row
    const size_t per_rank = static_cast<size_t>(s.outer) * part;
    for (int64_t i = 0; i < s.outer; ++i)
      for (int k = 0; k < n; ++k)
        std::memcpy(o + (i * n + k) * part, g + k * per_rank + i * part, part);
  }
};

// c_embedding: rows [start_index, start_index + V_r) of a [V, D] table held as W [V_r, D].
void EmbeddingShape(InferShapeContext& ctx) {
  const DDim w = ctx.GetInputDim("W");
  const DDim ids = ctx.GetInputDim("Ids");
  KEEL_SHAPE_CHECK(w.size() == 2, "W must be [V / n, D], got W ", w.str());
  KEEL_SHAPE_CHECK(ctx.GetInputDType("Ids") == DType::kInt64, "Ids must be int64, got ",
                   DTypeName(ctx.GetInputDType("Ids")));
  KEEL_SHAPE_CHECK(ids.size() >= 1 && ctx.DimEq(ids[ids.size() - 1], 1),
                   "Ids must be [..., 1], got Ids ", ids.str(), " (W ", w.str(), ")");
  DDim out = ids;
  out[ids.size() - 1] = w[1];
  ctx.SetOutputDim("Out", out);
  ctx.SetOutputDType("Out", ctx.GetInputDType("W"));
}

template <typename T>
class EmbeddingKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& w = ctx.Input("W");
    const Tensor& ids = ctx.Input("Ids");
    const int64_t start = ctx.Attr<int64_t>("start_index");
    const int64_t V = w.dims()[0], D = w.dims()[1], rows = ids.numel();
    DDim od = ids.dims();
    od[od.size() - 1] = D;
    Tensor* out = ctx.Output("Out");
    out->Resize(od);
    T* o = out->mutable_data<T>(ctx.place());
    const T* wp = w.data<T>();
    const int64_t* id = ids.data<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t k = id[r] - start;
      if (k >= 0 && k < V)
        std::memcpy(o + r * D, wp + k * D, sizeof(T) * static_cast<size_t>(D));
      else
        std::fill_n(o + r * D, D, T(0));
    }
  }
};

template <typename T>
class EmbeddingGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& w = ctx.Input("W");
    const Tensor& ids = ctx.Input("Ids");
    const Tensor& dy = ctx.Input(GradVarName("Out"));
    const int64_t start = ctx.Attr<int64_t>("start_index");
    const int64_t V = w.dims()[0], D = w.dims()[1], rows = ids.numel();
    Tensor* dw = ctx.Output(GradVarName("W"));
    dw->Resize(w.dims());
    T* g = dw->mutable_data<T>(ctx.place());
    std::fill_n(g, V * D, T(0));
    const T* d = dy.data<T>();
    const int64_t* id = ids.data<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t k = id[r] - start;
      if (k < 0 || k >= V) continue;
      for (int64_t j = 0; j < D; ++j) g[k * D + j] += d[r * D + j];
    }
  }
};

// Grad makers: each backward is another op of this family (or assign), on the same ring.
std::vector<std::unique_ptr<OpDesc>> OneOp(std::unique_ptr<OpDesc> g) {
  std::vector<std::unique_ptr<OpDesc>> r;
  r.push_back(std::move(g));
  return r;
}

std::unique_ptr<OpDesc> GradOf(const OpDesc& fwd, const std::string& type) {
  auto g = std::make_unique<OpDesc>(type);
  g->SetInput("X", {GradVarName(fwd.Output("Out")[0])});
  g->SetOutput("Out", {GradVarName(fwd.Input("X")[0])});
  return g;
}

std::vector<std::unique_ptr<OpDesc>> IdentityGrad(const OpDesc& fwd) {
  auto g = GradOf(fwd, "c_allreduce_sum");
  g->SetAttr("ring_id", fwd.Attr<int>("ring_id"));
  g->SetAttr("use_calc_stream", fwd.Attr<bool>("use_calc_stream"));
  return OneOp(std::move(g));
}

std::vector<std::unique_ptr<OpDesc>> MpAllReduceGrad(const OpDesc& fwd) {
  return OneOp(GradOf(fwd, "assign"));
}

std::vector<std::unique_ptr<OpDesc>> SplitConcatGrad(const OpDesc& fwd, const std::string& type) {
  auto g = GradOf(fwd, type);
  for (const char* a : {"ring_id", "nranks", "rank", "axis"}) g->SetAttr(a, fwd.GetAttr(a));
  g->SetAttr("use_calc_stream", fwd.Attr<bool>("use_calc_stream"));
  return OneOp(std::move(g));
}

OpSchema& TpOp(const std::string& type, const std::string& doc) {
  return OpRegistry::Register(type)
      .Doc(doc)
      .ShardsModel()
      .OneProcessForm("assign")  // on one rank of one, each passes X through
      .Input("X", "the tensor")
      .Output("Out", "the result")
      .Attr<int>("ring_id", 0, "the tensor-parallel ring", NonNegative)
      .Attr<bool>("use_calc_stream", true,
                  "run in order with compute (true: what the tensor-parallel layers use, since "
                  "the next op waits for the result anyway); false: on the ring's own thread");
}

OpSchema& SliceOp(const std::string& type, const std::string& doc) {
  return TpOp(type, doc)
      .Attr<int>("nranks", 1, "ranks of the tensor-parallel group", Positive)
      .PerRankAttr<int>("rank", 0, "this rank's index in the group", NonNegative)
      .Attr<int>("axis", -1, "the dim cut or joined; negative counts from the end");
}

}  // namespace

#define KEEL_REGISTER_TP_KERNEL(name, Kernel, ...)     \
  KEEL_REGISTER_CPU_KERNEL(name, Kernel, __VA_ARGS__); \
  KEEL_REGISTER_CUDA_KERNEL(name, Kernel, __VA_ARGS__)

[[maybe_unused]] static OpSchema& keel_schema_c_identity =
    TpOp("c_identity",
         "Out = X; backward all-reduces the gradient (sum) over ring_id. The entry of a "
         "column-parallel block: every rank holds the whole input, and its gradient is the sum of "
         "the ranks' partial gradients.")
        .Shape([](InferShapeContext& ctx) { ctx.ShareDimAndDType("X", "Out"); })
        .Grad(IdentityGrad)
        .MayShareBuffer("Out", "X");
KEEL_REGISTER_TP_KERNEL(c_identity, IdentityKernel, float, double, int32_t, int64_t, float16,
                        bfloat16);

[[maybe_unused]] static OpSchema& keel_schema_mp_allreduce_sum =
    TpOp("mp_allreduce_sum",
         "Out = sum of X over the ranks of ring_id; backward passes the gradient through. The exit "
         "of a row-parallel block: each rank's partial product summed.")
        .RunsOnRing()
        .Shape([](InferShapeContext& ctx) { ctx.ShareDimAndDType("X", "Out"); })
        .Grad(MpAllReduceGrad);
KEEL_REGISTER_TP_KERNEL(mp_allreduce_sum, MpAllReduceKernel, float, double, int32_t, int64_t,
                        float16, bfloat16);

[[maybe_unused]] static OpSchema& keel_schema_c_split =
    SliceOp("c_split",
            "Out = this rank's part (X's dim `axis` / nranks wide) of X; backward all-gathers the "
            "gradient (c_concat). X [4, 6], nranks 2, rank 1, axis -1 -> Out = X[:, 3:6].")
        .Shape(SplitShape)
        .Grad([](const OpDesc& fwd) { return SplitConcatGrad(fwd, "c_concat"); });
KEEL_REGISTER_CPU_KERNEL(c_split, CSplitKernel, float, double, int32_t, int64_t, float16, bfloat16);

[[maybe_unused]] static OpSchema& keel_schema_c_concat =
    SliceOp("c_concat",
            "Out = the ranks' X concatenated along `axis`, in rank order; backward keeps this "
            "rank's part of the gradient (c_split). X [4, 3] on 2 ranks -> Out [4, 6].")
        .RunsOnRing()
        .Shape(ConcatShape)
        .Grad([](const OpDesc& fwd) { return SplitConcatGrad(fwd, "c_split"); });
KEEL_REGISTER_CPU_KERNEL(c_concat, CConcatKernel, float, double, int32_t, int64_t, float16,
                         bfloat16);

KEEL_REGISTER_OP(c_embedding)
    .Doc(
        "Out[..., :] = W[Ids[..., 0] - start_index, :] when that row is this rank's (in [0, "
        "rows of W)), else zeros: one rank's part of a vocabulary-parallel embedding, whose "
        "ranks' outputs mp_allreduce_sum adds. W [4, D], start_index 4, Ids {1, 5} -> Out "
        "{0, W[1]}.")
    .ShardsModel()
    .OneProcessForm("lookup_table")  // the whole table: every id is this rank's
    .Input("W", "this rank's rows of the table, [V / n, D]")
    .Input("Ids", "int64 [..., 1], ids of the whole vocabulary")
    .Output("Out", "Ids' shape with the last dim D, W's dtype")
    .PerRankAttr<int64_t>("start_index", 0, "the vocabulary id of W's first row")
    .Shape(EmbeddingShape)
    .Grad(GradMaker("c_embedding_grad", {"W", "Ids"}, {"Out"}, {"W"}));
// W only for W@GRAD's shape; the gradient is dense, zero on rows no id of this rank hit.
KEEL_REGISTER_GRAD_OP(c_embedding_grad, c_embedding);
KEEL_REGISTER_CPU_KERNEL(c_embedding, EmbeddingKernel, float, double);
KEEL_REGISTER_CPU_KERNEL(c_embedding_grad, EmbeddingGradKernel, float, double);

}  // namespace keel
