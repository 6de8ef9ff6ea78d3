// The loss and the top-1 of a vocabulary-parallel output layer (Megatron's parallel cross-entropy;
// Paddle's c_softmax_with_cross_entropy): each rank of the tensor-parallel ring holds the logits
// of its classes [start, start + C) of the V = C * nranks, start = rank * C, and no rank ever holds
// a whole row of logits (docs/tensor-parallel.md).
//
// - c_softmax_with_cross_entropy: Logits [..., C], Label int64 [..., 1] -> Softmax [..., C],
//   Loss [..., 1]. Softmax is this rank's columns of each row's softmax over all V; Loss =
//   log(sum_V exp(x - max)) - (x[label] - max), the same on every rank. Two all-reduces on ring_id:
//   max of the rows' maxima, then the sums together with the label's shifted logit. Backward is
//   local: (Softmax - one-hot(Label)) * dLoss, the one-hot only on the rank holding the label.
// - c_top1: X [..., C] -> Out [..., 1], Indices int64 [..., 1]: each row's largest value over all
//   V and its index in [0, V), top_k's k = 1 (ties: the lower index; NaN first); one all-gather.
//   No backward (a metric).
//
// Shape algebra: rows = numel / C (C the last dim); Label and Loss [..., 1] over the same rows.
// With nranks 1 each is the plain op (softmax_with_cross_entropy, top_k with k 1): their
// one-process forms. CPU kernels only, as the other tensor-parallel slicing ops (a ring serving
// CUDA tensors is refused naming the op).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <Eigen/Core>

#include "framework/comm/comm_context.h"
#include "framework/comm/communicator.h"
#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/cpu_threads.h"
#include "ops/collective_op_call.h"
#include "ops/functors/metric_functors.h"
#include "ops/loss_ops.h"
#include "ops/op_util.h"

namespace keel {
namespace {

// ---------------------------------------------------------------- shapes

void CheckRanks(InferShapeContext& ctx) {
  const int n = ctx.Attr<int>("nranks"), r = ctx.Attr<int>("rank");
  KEEL_SHAPE_CHECK(r < n, "rank ", r, " must be < nranks ", n);
}

// [..., C] with a known C; returns the row shape [..., 1].
DDim RowsOf(InferShapeContext& ctx, const char* slot) {
  const DDim x = ctx.GetInputDim(slot);
  KEEL_SHAPE_CHECK(x.size() >= 1, slot, " needs rank >= 1, got ", x.str());
  KEEL_SHAPE_CHECK(x[x.size() - 1] > 0, "the class dim (the last) of ", slot, " ", x.str(),
                   " must be known");
  DDim rows = x;
  rows[x.size() - 1] = 1;
  return rows;
}

void SoftmaxCrossEntropyShape(InferShapeContext& ctx) {
  CheckRanks(ctx);
  const DDim rows = RowsOf(ctx, "Logits");
  const DDim label = ctx.GetInputDim("Label");
  KEEL_SHAPE_CHECK(ctx.GetInputDType("Label") == DType::kInt64, "Label must be int64, got ",
                   DTypeName(ctx.GetInputDType("Label")));
  KEEL_SHAPE_CHECK(ctx.DimsEq(label, rows), "Label ", label.str(), " must be ", rows.str(),
                   " (Logits ", ctx.GetInputDim("Logits").str(), " with the class dim 1)");
  ctx.ShareDimAndDType("Logits", "Softmax");
  ctx.SetOutputDim("Loss", rows);
  ctx.SetOutputDType("Loss", ctx.GetInputDType("Logits"));
}

void Top1Shape(InferShapeContext& ctx) {
  CheckRanks(ctx);
  const DDim rows = RowsOf(ctx, "X");
  ctx.SetOutputDim("Out", rows);
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
  ctx.SetOutputDim("Indices", rows);
  ctx.SetOutputDType("Indices", DType::kInt64);
}

// ---------------------------------------------------------------- the ring

// The op's tensor-parallel ring, or nullptr for a group of one (nothing to combine).
Communicator* RingOf(const ExecutionContext& ctx) {
  const int nranks = ctx.Attr<int>("nranks");
  if (nranks == 1) return nullptr;
  const std::string& type = ctx.op().type();
  Communicator& ring = RingRegistry::Get().At(ctx.Attr<int>("ring_id"), type);
  KEEL_ENFORCE(ring.nranks() == nranks, "op ", type, ": nranks=", nranks, " but ring ",
               ctx.Attr<int>("ring_id"), " has ", ring.nranks(), " ranks");
  KEEL_ENFORCE(ring.device_stream() == nullptr, "op ", type, ": ring ", ctx.Attr<int>("ring_id"),
               " (", ring.backend(),
               ") serves CUDA tensors, and this op has a CPU kernel only; train the "
               "vocabulary-parallel layers on CPU places");
  return &ring;
}

template <typename T>
using RowVec = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstRowVec = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// Rows in pieces on the thread budget (each row's math is the same on any thread count).
template <typename F>
void ForRows(int64_t rows, int64_t width, F&& f) {
  const int64_t grain =
      std::max<int64_t>(1, cpu_threads::kElementwiseGrain / std::max<int64_t>(width, 1));
  cpu_threads::ParallelForRange(rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) f(r);
  });
}

// ---------------------------------------------------------------- c_softmax_with_cross_entropy

template <typename T>
class CSoftmaxWithCrossEntropyKernel : public OpKernel {
 public:
  explicit CSoftmaxWithCrossEntropyKernel(const OpDesc& op)
      : nranks_(op.Attr<int>("nranks")),
        rank_(op.Attr<int>("rank")),
        ignore_(op.Attr<int>("ignore_index")) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("Logits");
    const Tensor& label = ctx.Input("Label");
    const int64_t C = x.dims()[x.dims().size() - 1], rows = x.numel() / C;
    const int64_t start = rank_ * C, V = C * nranks_;
    KEEL_ENFORCE(label.numel() == rows, "op c_softmax_with_cross_entropy: Label ",
                 label.dims().str(), " has ", label.numel(), " values for the ", rows,
                 " rows of Logits ", x.dims().str());
    const int64_t* lp = label.data<int64_t>();
    for (int64_t r = 0; r < rows; ++r)
      if (lp[r] != ignore_ && (lp[r] < 0 || lp[r] >= V))
        ThrowBadLabel("c_softmax_with_cross_entropy", lp[r], r, V, ignore_);
    Communicator* ring = RingOf(ctx);
    Tensor* sm_t = ctx.Output("Softmax");
    sm_t->Resize(x.dims());
    T* smp = sm_t->mutable_data<T>(ctx.place());
    DDim loss_dims = x.dims();
    loss_dims[loss_dims.size() - 1] = 1;
    Tensor* loss_t = ctx.Output("Loss");
    loss_t->Resize(loss_dims);
    T* lossp = loss_t->mutable_data<T>(ctx.place());
    const T* xp = x.data<T>();

    // 1. The rows' maxima over all V.
    max_.Resize(DDim{rows});
    T* mx = max_.mutable_data<T>(CPUPlace());
    ForRows(rows, C, [&](int64_t r) { mx[r] = ConstRowVec<T>(xp + r * C, C).maxCoeff(); });
    if (ring) AsOp(ctx, [&] { ring->AllReduce(&max_, ReduceOp::kMax); });
    // 2. exp(x - max) here, and over all V the sums of it and the label's shifted logit (zero on
    // ranks without the label) in one all-reduce: [sums | label logits].
    sums_.Resize(DDim{2 * rows});
    T* s = sums_.mutable_data<T>(CPUPlace());
    ForRows(rows, C, [&](int64_t r) {
      RowVec<T> sm(smp + r * C, C);
      sm = (ConstRowVec<T>(xp + r * C, C) - mx[r]).exp();
      s[r] = sm.sum();
      const int64_t k = lp[r] - start;
      s[rows + r] = lp[r] != ignore_ && k >= 0 && k < C ? xp[r * C + k] - mx[r] : T(0);
    });
    if (ring) AsOp(ctx, [&] { ring->AllReduce(&sums_, ReduceOp::kSum); });
    // 3. Normalize; Loss = log-sum-exp minus the label's shifted logit.
    ForRows(rows, C, [&](int64_t r) {
      RowVec<T>(smp + r * C, C) *= T(1) / s[r];
      lossp[r] = lp[r] == ignore_ ? T(0) : std::log(s[r]) - s[rows + r];
    });
  }

 private:
  int nranks_, rank_, ignore_;
  Tensor max_, sums_;  // what the ring reduces
};

// Logits@GRAD = (Softmax - one-hot(Label)) * Loss@GRAD on this rank's columns: no communication.
template <typename T>
class CSoftmaxWithCrossEntropyGradKernel : public OpKernel {
 public:
  explicit CSoftmaxWithCrossEntropyGradKernel(const OpDesc& op)
      : rank_(op.Attr<int>("rank")), ignore_(op.Attr<int>("ignore_index")) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& sm = ctx.Input("Softmax");
    const Tensor& label = ctx.Input("Label");
    const Tensor& dloss = ctx.Input(GradVarName("Loss"));
    const int64_t C = sm.dims()[sm.dims().size() - 1], rows = sm.numel() / C;
    const int64_t start = rank_ * C;
    Tensor* dx = ctx.Output(GradVarName("Logits"));
    dx->Resize(sm.dims());
    T* g = dx->mutable_data<T>(ctx.place());
    const T* smp = sm.data<T>();
    const T* dl = dloss.data<T>();
    const int64_t* lp = label.data<int64_t>();
    ForRows(rows, C, [&](int64_t r) {
      RowVec<T> gr(g + r * C, C);
      if (lp[r] == ignore_) {
        gr.setZero();
        return;
      }
      gr = ConstRowVec<T>(smp + r * C, C) * dl[r];
      const int64_t k = lp[r] - start;
      if (k >= 0 && k < C) gr[k] -= dl[r];
    });
  }

 private:
  int rank_, ignore_;
};

// ---------------------------------------------------------------- c_top1

template <typename T>
class CTop1Kernel : public OpKernel {
 public:
  explicit CTop1Kernel(const OpDesc& op)
      : nranks_(op.Attr<int>("nranks")), rank_(op.Attr<int>("rank")) {}

  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const int64_t C = x.dims()[x.dims().size() - 1], rows = x.numel() / C;
    const int64_t start = rank_ * C;
    DDim rd = x.dims();
    rd[rd.size() - 1] = 1;
    Tensor* out = ctx.Output("Out");
    Tensor* idx = ctx.Output("Indices");
    out->Resize(rd);
    idx->Resize(rd);
    T* vp = out->mutable_data<T>(ctx.place());
    int64_t* ip = idx->mutable_data<int64_t>(ctx.place());
    const T* xp = x.data<T>();
    // This rank's best of each row, as (value, index over all V) in double (exact for both).
    best_.Resize(DDim{rows, 2});
    double* b = best_.mutable_data<double>(CPUPlace());
    ForRows(rows, C, [&](int64_t r) {
      const T* row = xp + r * C;
      int64_t k = 0;
      for (int64_t j = 1; j < C; ++j)
        if (fn::RanksBefore(row[j], j, row[k], k)) k = j;
      b[2 * r] = static_cast<double>(row[k]);
      b[2 * r + 1] = static_cast<double>(start + k);
    });
    Communicator* ring = RingOf(ctx);
    const double* all = b;
    int ranks = 1;
    if (ring) {
      AsOp(ctx, [&] { ring->AllGather(best_, &gathered_); });
      all = gathered_.data<double>();
      ranks = nranks_;
    }
    // The best of the ranks' bests by top_k's ranking (an index decides ties, so the order of the
    // ranks does not matter).
    for (int64_t r = 0; r < rows; ++r) {
      double v = all[2 * r], i = all[2 * r + 1];
      for (int q = 1; q < ranks; ++q) {
        const double* o = all + (q * rows + r) * 2;
        if (fn::RanksBefore(o[0], static_cast<int64_t>(o[1]), v, static_cast<int64_t>(i))) {
          v = o[0];
          i = o[1];
        }
      }
      vp[r] = static_cast<T>(v);
      ip[r] = static_cast<int64_t>(i);
    }
  }

 private:
  int nranks_, rank_;
  Tensor best_, gathered_;
};

std::string NonNegative(const Attribute& a) { return std::get<int>(a) >= 0 ? "" : "must be >= 0"; }
std::string Positive(const Attribute& a) { return std::get<int>(a) >= 1 ? "" : "must be >= 1"; }

// The attributes of both ops: the ring and this rank's place in it.
OpSchema& VocabParallelOp(const std::string& type, const std::string& doc,
                          const std::string& one_process_form) {
  return OpRegistry::Register(type)
      .Doc(doc)
      .ShardsModel()
      .OneProcessForm(one_process_form)
      .RunsOnRing()
      .Attr<int>("ring_id", 0, "the tensor-parallel ring", NonNegative)
      .Attr<bool>("use_calc_stream", true,
                  "true: in order with compute (the op's math waits for its collectives); false: "
                  "the whole op on the ring's own thread")
      .Attr<int>("nranks", 1, "ranks of the tensor-parallel group", Positive)
      .PerRankAttr<int>("rank", 0,
                        "this rank's index in the group: it holds classes [rank * C, (rank + 1) "
                        "* C) of the V = C * nranks",
                        NonNegative);
}

}  // namespace

[[maybe_unused]] static OpSchema& keel_schema_c_softmax_with_cross_entropy =
    VocabParallelOp(
        "c_softmax_with_cross_entropy",
        "softmax_with_cross_entropy over logits split by class across the ranks of ring_id: "
        "Softmax is this rank's columns of each row's softmax over all classes, Loss the row's "
        "cross-entropy (on every rank). Forward all-reduces the row maxima, then the row sums "
        "with the label's logit; backward needs no communication. Logits [N, C] on each of n "
        "ranks, Label int64 [N, 1] in [0, n * C) -> Softmax [N, C], Loss [N, 1].",
        "softmax_with_cross_entropy")
        .Input("Logits", "this rank's class columns of the logits, [..., C]")
        .Input("Label", "int64 class indices over all ranks' classes, [..., 1]")
        .Output("Softmax", "this rank's columns of the softmax over all classes")
        .Output("Loss", "[..., 1], the same on every rank")
        .Attr<int>("ignore_index", -100, "label value that yields zero loss and gradient")
        .Shape(SoftmaxCrossEntropyShape)
        .Grad(GradMaker("c_softmax_with_cross_entropy_grad", {"Label", "Softmax"}, {"Loss"},
                        {"Logits"}));
KEEL_REGISTER_GRAD_OP(c_softmax_with_cross_entropy_grad, c_softmax_with_cross_entropy)
    .Shape(GradShapeLike("Logits", "Softmax"))
    .KernelDTypeFrom("Softmax");
KEEL_REGISTER_CPU_KERNEL(c_softmax_with_cross_entropy, CSoftmaxWithCrossEntropyKernel, float,
                         double);
KEEL_REGISTER_CPU_KERNEL(c_softmax_with_cross_entropy_grad, CSoftmaxWithCrossEntropyGradKernel,
                         float, double);

[[maybe_unused]] static OpSchema& keel_schema_c_top1 =
    VocabParallelOp("c_top1",
                    "top_k with k = 1 over values split by class across the ranks of ring_id: "
                    "each row's largest value over all ranks' classes and its class index (ties: "
                    "the lower index; NaN ranks first), on every rank; one all-gather. X [N, C] "
                    "on each of n ranks -> Out [N, 1], Indices int64 [N, 1] in [0, n * C).",
                    "top_k")
        .Input("X", "this rank's class columns, [..., C]")
        .Output("Out", "[..., 1]: the row's largest value over all classes")
        .Output("Indices", "int64 [..., 1]: its class index over all ranks' classes")
        .Shape(Top1Shape);
KEEL_REGISTER_CPU_KERNEL(c_top1, CTop1Kernel, float, double);

}  // namespace keel
