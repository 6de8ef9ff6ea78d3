// Parameter-server ops for sparse embedding tables (docs/sparse-embeddings.md,
// docs/parameter-server.md; transpiler/ps_pass.h writes them). CPU only: a CUDA place finds no
// kernel and is refused naming the op.
//
//   merge_sparse_grad (server): Out = scale * (X[0] + X[1] + ...) over row-sparse parts: the
//     union of their rows, each row summed in X's order (the trainers' order), then scaled
//     (1/trainers), as the dense merge's sum and scale.
//   row_seeded_random (startup): a table whose row r holds draws seeded by (seed, r) alone
//     (framework/ps/sparse_shard.h's RowInit): what the servers create row by row for an
//     is_distributed table, so that one process holds the same table.
//   distributed_lookup_table (trainer): Out = rows of a table that lives on the servers: the
//     batch's distinct ids, each asked from server id % pserver_num (which creates it on first
//     touch), then gathered per id.
//   distributed_lookup_table_grad (trainer): the table's row-sparse gradient from Ids and Out's
//     gradient, as lookup_table_grad with is_sparse (the touched rows, sorted, each summed in the
//     order of the ids), without the table.
#include <algorithm>
#include <cstring>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/op/shape_inference.h"
#include "framework/ps/sparse_shard.h"
#include "ops/ps_ops.h"
#include "ops/row_sparse_sum.h"

namespace keel {

namespace {

template <typename T>
class MergeSparseGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    SumRowSparseInputs<T>(ctx, static_cast<T>(ctx.op().Attr<float>("scale")));
  }
};

RowInitRule RuleOf(const OpDesc& op) {
  RowInitRule r;
  r.dist = op.Attr<int>("dist");
  r.a = op.Attr<float>("a");
  r.b = op.Attr<float>("b");
  r.seed = op.Attr<int64_t>("row_seed");
  return r;
}

template <typename T>
class RowSeededRandomKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const auto& shape = ctx.Attr<std::vector<int64_t>>("shape");
    Tensor* out = ctx.Output("Out");
    out->Resize(DDim(shape));
    T* o = out->mutable_data<T>(ctx.place());
    const int64_t rows = shape.empty() ? 1 : shape[0];
    const int64_t width = rows == 0 ? 0 : out->numel() / rows;
    const RowInitRule rule = RuleOf(ctx.op());
    for (int64_t r = 0; r < rows; ++r) RowInit(rule, r, width, o + r * width);
  }
};

// The distinct ids of a batch (sorted), without padding_idx, and each id's index among them; each
// id in [0, height) or a keel::Error naming the op and the table.
class DistinctIds {
 public:
  DistinctIds(const OpDesc& op, const Tensor& ids) {
    const int64_t height = op.Attr<int64_t>("height"), pad = op.Attr<int64_t>("padding_idx");
    const int64_t* p = ids.data<int64_t>();
    const int64_t n = ids.numel();
    for (int64_t r = 0; r < n; ++r)
      KEEL_ENFORCE(p[r] == pad || (p[r] >= 0 && p[r] < height), "op ", op.type(), " of table ",
                   op.Attr<std::string>("table"), ": Ids[", r, "] = ", p[r], " is outside [0, ",
                   height, ")");
    // A bit per row when the table is not much larger than the batch (a CTR table of 1 M rows
    // against 13 k ids: 16 K words), read back in order, with the bits set before each word (an
    // id's index is then one look-up and a popcount); else a sort and binary searches.
    const int64_t words = (height + 63) / 64;
    if (words <= 32 * std::max<int64_t>(n, 1)) {
      seen_.assign(static_cast<size_t>(words), 0);
      for (int64_t r = 0; r < n; ++r)
        if (p[r] != pad) seen_[p[r] >> 6] |= uint64_t{1} << (p[r] & 63);
      before_.resize(static_cast<size_t>(words));
      int64_t count = 0;
      for (int64_t i = 0; i < words; ++i) {
        before_[i] = static_cast<int32_t>(count);
        count += __builtin_popcountll(seen_[i]);
      }
      ids_.reserve(static_cast<size_t>(count));
      for (int64_t i = 0; i < words; ++i)
        for (uint64_t w = seen_[i]; w != 0; w &= w - 1) ids_.push_back(i * 64 + __builtin_ctzll(w));
      return;
    }
    ids_.reserve(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r)
      if (p[r] != pad) ids_.push_back(p[r]);
    std::sort(ids_.begin(), ids_.end());
    ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
  }

  const std::vector<int64_t>& ids() const { return ids_; }
  std::vector<int64_t> Take() { return std::move(ids_); }
  // The index in ids() of `id`, one of the batch's (not padding_idx).
  int64_t Index(int64_t id) const {
    if (seen_.empty()) return std::lower_bound(ids_.begin(), ids_.end(), id) - ids_.begin();
    const uint64_t below = (uint64_t{1} << (id & 63)) - 1;
    return before_[id >> 6] + __builtin_popcountll(seen_[id >> 6] & below);
  }

 private:
  std::vector<int64_t> ids_;
  std::vector<uint64_t> seen_;   // the bitmap path: a bit per row
  std::vector<int32_t> before_;  // the bits set in the words before each word
};

template <typename T>
class DistributedLookupTableKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const OpDesc& op = ctx.op();
    const Tensor& ids = ctx.Input("Ids");
    const int64_t D = op.Attr<int64_t>("dim"), pad = op.Attr<int64_t>("padding_idx");
    const int table = op.Attr<int>("table_slot");
    const std::string& name = op.Attr<std::string>("table");
    const DistinctIds distinct(op, ids);
    ps::Transport& t = PsConnected(op);
    const int S = t.nservers();
    KEEL_ENFORCE(S == op.Attr<int>("pserver_num"), "op distributed_lookup_table of ", name,
                 ": pserver_num=", op.Attr<int>("pserver_num"), " but the job has ", S, " servers");
    // Per server, its ids (id % S) and, once they arrive, their rows; each distinct id's place in
    // its server's list.
    std::vector<std::vector<int64_t>> asked(static_cast<size_t>(S));
    std::vector<int64_t> place(distinct.ids().size());
    for (size_t g = 0; g < place.size(); ++g) {
      const int64_t id = distinct.ids()[g];
      place[g] = static_cast<int64_t>(asked[id % S].size());
      asked[id % S].push_back(id);
    }
    std::vector<std::vector<T>> rows(static_cast<size_t>(S));
    std::vector<std::unique_ptr<ps::Transport::Transfer>> recvs, sends;
    const int64_t done = t.step();  // the steps this trainer completed (the server echoes it)
    for (int s = 0; s < S; ++s) {
      rows[s].resize(asked[s].size() * D);
      const std::string what = StrCat("op distributed_lookup_table: ", asked[s].size(), " rows of ",
                                      name, " from ", t.PeerName(s));
      recvs.push_back(t.PostRecv({s}, ps::Slot(ps::Kind::kPrefetch, table, done), rows[s].data(),
                                 rows[s].size() * sizeof(T), what));
      ps::Header h;
      h.step = ps::kPrefetch;
      h.steps = done;
      h.table = table;
      h.count = static_cast<int64_t>(asked[s].size());
      // The ids in the request's message when they fit (ps::HeaderWithIds), else after it.
      const bool inline_ids = h.count <= ps::kInlineIds;
      std::vector<char> request(sizeof(h) + (inline_ids ? h.count * sizeof(int64_t) : 0));
      std::memcpy(request.data(), &h, sizeof(h));
      if (inline_ids && h.count > 0)
        std::memcpy(request.data() + sizeof(h), asked[s].data(), h.count * sizeof(int64_t));
      sends.push_back(t.PostSend(s, t.async() ? t.PrefetchHeaderSlot() : t.HeaderSlot(done + 1),
                                 std::move(request), what));
      if (!inline_ids)
        sends.push_back(t.PostSend(s, ps::Slot(ps::Kind::kIds, table, done), asked[s].data(),
                                   asked[s].size() * sizeof(int64_t), what));
    }
    for (auto& x : sends) t.Wait(*x);
    for (auto& x : recvs) t.Wait(*x);
    DDim dims = ids.dims();
    dims[dims.size() - 1] = D;
    Tensor* out = ctx.Output("Out");
    out->Resize(dims);
    T* o = out->mutable_data<T>(ctx.place());
    const int64_t* p = ids.data<int64_t>();
    for (int64_t r = 0; r < ids.numel(); ++r) {
      if (p[r] == pad) {
        std::fill_n(o + r * D, D, T(0));
        continue;
      }
      const int s = static_cast<int>(p[r] % S);
      std::copy_n(rows[s].data() + place[distinct.Index(p[r])] * D, D, o + r * D);
    }
  }
};

template <typename T>
class DistributedLookupTableGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const OpDesc& op = ctx.op();
    const Tensor& ids = ctx.Input("Ids");
    const Tensor& dy = ctx.Input("OutGrad");
    const int64_t D = op.Attr<int64_t>("dim"), pad = op.Attr<int64_t>("padding_idx");
    KEEL_ENFORCE(dy.numel() == ids.numel() * D, "op distributed_lookup_table_grad of ",
                 op.Attr<std::string>("table"), ": OutGrad ", dy.dims(), " does not hold ",
                 ids.numel(), " rows of ", D);
    DistinctIds distinct(op, ids);
    const std::vector<int64_t>& rows = distinct.ids();
    Tensor* dw = ctx.Output("WGrad");
    dw->Resize(DDim({static_cast<int64_t>(rows.size()), D}));
    T* g = dw->mutable_data<T>(ctx.place());
    std::fill_n(g, rows.size() * D, T(0));
    const int64_t* p = ids.data<int64_t>();
    const T* d = dy.data<T>();
    for (int64_t r = 0; r < ids.numel(); ++r) {
      if (p[r] == pad) continue;
      const int64_t k = distinct.Index(p[r]);
      for (int64_t j = 0; j < D; ++j) g[k * D + j] += d[r * D + j];
    }
    ctx.OutputVar("WGrad")->SetRows(op.Attr<int64_t>("height"), distinct.Take());
  }
};

OpSchema& TableAttrs(OpSchema& s) {
  return s.RequiredAttr<std::string>("table", "the table's name (for messages)")
      .RequiredAttr<int64_t>("height", "the table's rows (V)")
      .RequiredAttr<int64_t>("dim", "the table's row width (D)")
      .Attr<int64_t>("padding_idx", -1, "an id whose output is zeros and gets no gradient");
}

std::string MustBeTrue(const Attribute& a) {
  return std::get<bool>(a) ? "" : "must be true (Out is row-sparse)";
}

}  // namespace

KEEL_REGISTER_OP(merge_sparse_grad)
    .Doc(
        "Out = scale * (X[0] + X[1] + ...) over row-sparse parts (a parameter server merging the "
        "trainers' gradients of an is_sparse embedding): the union of their rows, each summed "
        "in X's order, then scaled")
    .InputList("X", "the row-sparse parts, in the trainers' order")
    .Output("Out", "their merged rows")
    .Attr<float>("scale", 1.0f, "the factor applied after summing (1 / trainers)")
    .Attr<bool>("row_sparse", true, "Out is row-sparse", MustBeTrue)
    .Shape([](InferShapeContext& ctx) {
      ctx.SetOutputDim("Out", ctx.GetInputDim("X", 0));
      ctx.SetOutputDType("Out", ctx.GetInputDType("X", 0));
    })
    .AcceptsRowSparse("X")
    .WritesRowSparseWhen("Out", "row_sparse");
KEEL_REGISTER_CPU_KERNEL(merge_sparse_grad, MergeSparseGradKernel, float, double);

KEEL_REGISTER_OP(row_seeded_random)
    .Doc(
        "Out [shape] with row r drawn from a generator seeded by (seed, r) alone: uniform in [a, "
        "b) (dist 0), normal with mean a and std b (dist 1) or the constant a (dist 2); the "
        "initializer of an is_distributed table, whose servers create its rows one by one")
    .Output("Out", "the table")
    .Attr<std::vector<int64_t>>("shape", {}, "Out's shape")
    .Attr<int>("dtype", static_cast<int>(DType::kFloat32), "Out's keel::DType as int")
    .Attr<int>("dist", 0, "0: uniform, 1: normal, 2: constant",
               [](const Attribute& a) -> std::string {
                 const int d = std::get<int>(a);
                 return d >= 0 && d <= 2 ? "" : "must be 0, 1 or 2";
               })
    .Attr<float>("a", 0.0f, "uniform's low bound, normal's mean, or the constant")
    .Attr<float>("b", 0.0f, "uniform's high bound, normal's std")
    .Attr<int64_t>("row_seed", 0, "the table's seed (row r: draws seeded by (row_seed, r))")
    .Shape([](InferShapeContext& ctx) {
      ctx.SetOutputDim("Out", DDim(ctx.Attr<std::vector<int64_t>>("shape")));
      ctx.SetOutputDType("Out", static_cast<DType>(ctx.Attr<int>("dtype")));
    });
KEEL_REGISTER_CPU_KERNEL(row_seeded_random, RowSeededRandomKernel, float, double);

[[maybe_unused]] static OpSchema& keel_schema_distributed_lookup_table = TableAttrs(
    OpRegistry::Register("distributed_lookup_table")
        .Doc("Out[..., :] = the rows of Ids from a table that lives on the parameter servers "
             "(is_distributed): the batch's distinct ids go to server id % pserver_num, which "
             "creates a row on first touch; zeros where Ids is padding_idx")
        .Input("Ids", "int64 [..., 1], each in [0, height)")
        .Output("Out", "Ids' shape with the last dim D")
        .RequiredAttr<int>("table_slot", "the table's index in the transpiler's plan")
        .Attr<int>("dtype", static_cast<int>(DType::kFloat32),
                   "the table's keel::DType as int (Out's; it picks the kernel)")
        // No input of the table's dtype (Ids are int64): the dtype attr picks the kernel.
        .KernelDTypeFrom("Out")
        .Attr<int>("pserver_num", 1, "servers in the job")
        .Attr<int>("mode", 0, "0: synchronous, 1: asynchronous (transpiler/ps_pass.h)")
        .Shape([](InferShapeContext& ctx) {
          DDim d = ctx.GetInputDim("Ids");
          d[d.size() - 1] = ctx.Attr<int64_t>("dim");
          ctx.SetOutputDim("Out", d);
          ctx.SetOutputDType("Out", static_cast<DType>(ctx.Attr<int>("dtype")));
        })
        .Barrier("waits for the servers' rows")
        .NotCapturable("waits for the network"));
KEEL_REGISTER_CPU_KERNEL(distributed_lookup_table, DistributedLookupTableKernel, float);

[[maybe_unused]] static OpSchema& keel_schema_distributed_lookup_table_grad = TableAttrs(
    OpRegistry::Register("distributed_lookup_table_grad")
        .Doc("WGrad = the row-sparse gradient of a distributed table: the distinct ids of Ids "
             "(sorted) and, per id, the sum of OutGrad's rows of that id in the order of Ids")
        .Input("Ids", "int64 [..., 1]")
        .Input("OutGrad", "the gradient of distributed_lookup_table's Out")
        .Output("WGrad", "row-sparse [n, D], standing for [height, D]")
        .Attr<bool>("row_sparse", true, "WGrad is row-sparse", MustBeTrue)
        .KernelDTypeFrom("OutGrad")
        .Shape([](InferShapeContext& ctx) {
          ctx.SetOutputDim("WGrad", DDim({ctx.Attr<int64_t>("height"), ctx.Attr<int64_t>("dim")}));
          ctx.SetOutputDType("WGrad", ctx.GetInputDType("OutGrad"));
        })
        .WritesRowSparseWhen("WGrad", "row_sparse"));
KEEL_REGISTER_CPU_KERNEL(distributed_lookup_table_grad, DistributedLookupTableGradKernel, float);

}  // namespace keel
