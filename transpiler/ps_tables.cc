// Distributed embedding tables (is_distributed) in the parameter-server pass
// (transpiler/ps_pass.h): the trainer's lookups that fetch rows from the servers and the servers'
// shards; and the helpers the pass's files share (ps_pass_internal.h).
#include <algorithm>
#include <memory>

#include "framework/error.h"
#include "framework/op/op_registry.h"
#include "transpiler/ps_pass_internal.h"

namespace keel {
namespace transpiler {
namespace ps_internal {

namespace {
constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);
}  // namespace

std::vector<std::string> Args(const OpDesc& op) {
  std::vector<std::string> all = op.InputArgumentNames();
  for (const std::string& o : op.OutputArgumentNames()) all.push_back(o);
  return all;
}

// Declares `name` in `b` as a copy of `like` with dims `shape` (and `persistable`).
VarDesc* Declare(Block& b, const std::string& name, const VarDesc& like,
                 const std::vector<int64_t>& shape, bool persistable) {
  VarDesc* v = b.Var(name);
  v->set_dtype(like.dtype());
  v->set_shape(shape);
  v->set_persistable(persistable);
  v->set_stop_gradient(true);
  v->set_is_parameter(like.is_parameter() && persistable);
  return v;
}

OpDesc* Append(Block& b, const std::string& type, const OpDesc::VarMap& ins,
               const OpDesc::VarMap& outs, const std::map<std::string, Attribute>& attrs) {
  OpDesc* op = b.AppendOp(type);
  for (const auto& [slot, args] : ins) op->SetInput(slot, args);
  for (const auto& [slot, args] : outs) op->SetOutput(slot, args);
  for (const auto& [name, value] : attrs) op->SetAttr(name, value);
  op->SetAttr(kOpRoleAttr, kOptimize);
  OpRegistry::Get(type).Complete(op);
  return op;
}

OpDesc* AppendCopy(Block& b, const OpDesc& op) {
  return b.InsertOp(b.num_ops(), std::make_unique<OpDesc>(op));
}

// Trainer: table p's lookup_table becomes distributed_lookup_table (the batch's rows from the
// servers), its lookup_table_grad distributed_lookup_table_grad (the same row-sparse gradient
// without the table), in place.
void ReplaceDistributedLookup(Block& b, const PsPlan::Param& p, int nservers, int mode) {
  for (size_t i = 0; i < b.num_ops(); ++i) {
    const OpDesc& op = *b.op(i);
    const bool fwd = op.type() == "lookup_table", bwd = op.type() == "lookup_table_grad";
    if ((!fwd && !bwd) || op.Input("W").empty() || op.Input("W")[0] != p.name) continue;
    auto d = std::make_unique<OpDesc>(fwd ? "distributed_lookup_table"
                                          : "distributed_lookup_table_grad");
    d->SetInput("Ids", op.Input("Ids"));
    if (fwd) {
      d->SetOutput("Out", op.Output("Out"));
      d->SetAttr("table_slot", p.blocks[0]);
      d->SetAttr("pserver_num", nservers);
      d->SetAttr("mode", mode);
      d->SetAttr("dtype", static_cast<int>(b.MustFindVar(p.name)->dtype()));
    } else {
      d->SetInput("OutGrad", op.Input("Out@GRAD"));
      d->SetOutput("WGrad", op.Output("W@GRAD"));
    }
    d->SetAttr("table", p.name);
    d->SetAttr("height", p.shape[0]);
    d->SetAttr("dim", p.shape[1]);
    d->SetAttr("padding_idx", op.Attr<int64_t>("padding_idx"));
    for (const std::string& a : {kOpRoleAttr, kOpRoleVarAttr})
      if (op.HasAttr(a)) d->SetAttr(a, op.GetAttr(a));
    OpRegistry::Get(d->type()).Complete(d.get());
    b.RemoveOp(i);
    b.InsertOp(i, std::move(d));
  }
}

// Server: distributed table p's shard. Startup: the table's initializer and those of its state
// with the table's shape keep their places (so later initializers draw what they draw in one
// process) but fill [0, D] (the shard grows row by row); the rest of its state (Adam's beta
// powers) as for any parameter. Main: the shard, its row-shaped state and its ids, declared
// [-1, D] / [-1]; an optimize block: the trainers' row gradients merged (sync), the update ops.
void AddServerTable(const PsPlan::Param& p, const Block& om, Program& main, Program& startup,
                    int ntrainers, bool async, ServerTables* t) {
  Block& mb = main.global_block();
  Block& sb = startup.global_block();
  const int64_t D = p.shape[1];
  const std::vector<int64_t> rows = {-1, D}, none = {0, D};
  // The startup op writing `n` (exactly one).
  auto writer = [&](const std::string& n) -> OpDesc& {
    OpDesc* w = nullptr;
    for (size_t i = 0; i < sb.num_ops(); ++i)
      for (const std::string& o : sb.op(i)->OutputArgumentNames())
        if (o == n) {
          KEEL_ENFORCE(w == nullptr, "parameter-server transpiler: distributed table ", p.name,
                       ": ", n, " has two initializers");
          w = sb.op(i);
        }
    KEEL_ENFORCE(w != nullptr,
                 "parameter-server transpiler: the startup program does not "
                 "initialize ",
                 n);
    return *w;
  };
  OpDesc& init = writer(p.name);
  KEEL_ENFORCE(init.type() == "row_seeded_random",
               "parameter-server transpiler: distributed table ", p.name, " is initialized by ",
               init.type(),
               "; its rows are created one by one, so it needs row_seeded_random (build it "
               "with layers::embedding(..., is_distributed=true))");
  t->dists.push_back(init.Attr<int>("dist"));
  t->as.push_back(init.Attr<float>("a"));
  t->bs.push_back(init.Attr<float>("b"));
  t->seeds.push_back(init.Attr<int64_t>("row_seed"));
  init.SetAttr("shape", none);
  sb.MustFindVar(p.name)->set_shape(none);
  const VarDesc& pv = *om.MustFindVar(p.name);
  Declare(mb, p.name, pv, rows, true)->set_is_parameter(true);
  const std::string ids = StrCat(p.name, "@IDS");
  VarDesc* iv = Declare(mb, ids, pv, {-1}, true);
  iv->set_dtype(DType::kInt64);
  iv->set_is_parameter(false);
  int counted = 0;
  for (const std::string& s : p.state) {
    const VarDesc& sv = *om.MustFindVar(s);
    OpDesc& w = writer(s);
    if (sv.shape() != p.shape) {
      sb.MustFindVar(s)->set_persistable(true);  // a scalar (Adam's beta powers): as it is
      Declare(mb, s, sv, sv.shape(), true);
      continue;
    }
    KEEL_ENFORCE(w.type() == "fill_constant", "parameter-server transpiler: distributed table ",
                 p.name, "'s optimizer state ", s, " is initialized by ", w.type(),
                 "; rows of state are created with the table's, from a constant");
    t->state_values.push_back(w.Attr<float>("value"));
    w.SetAttr("shape", none);
    sb.MustFindVar(s)->set_shape(none);
    Declare(mb, s, sv, rows, true);
    t->state.push_back(s);
    ++counted;
  }
  // The optimize block: the trainers' parts merged (sync) into the gradient, then the updates.
  Block& ob = main.AppendBlock(0);
  Declare(mb, p.grad, pv, rows, false)->set_row_sparse(true);
  std::vector<std::string> copies;
  if (async) {
    copies.push_back(p.grad);
  } else {
    for (int r = 0; r < ntrainers; ++r) {
      copies.push_back(StrCat(p.grad, ".trainer_", r));
      Declare(mb, copies.back(), pv, rows, false)->set_row_sparse(true);
    }
    Append(ob, "merge_sparse_grad", {{"X", copies}}, {{"Out", {p.grad}}},
           {{"scale", 1.0f / static_cast<float>(ntrainers)}});
  }
  for (size_t i : p.ops) {
    OpDesc* c = AppendCopy(ob, *om.op(i));
    for (const std::string& a : Args(*c))
      if (!mb.FindVar(a)) {
        const VarDesc& v = *om.MustFindVar(a);
        KEEL_ENFORCE(v.shape() != p.shape, "parameter-server transpiler: distributed table ",
                     p.name, ": update op ", c->type(), " uses ", a,
                     " of the table's shape, which is not its state (not built)");
        Declare(mb, a, v, v.shape(), v.persistable());
      }
  }
  t->names.push_back(p.name);
  t->ids.push_back(ids);
  t->grads.insert(t->grads.end(), copies.begin(), copies.end());
  t->slots.push_back(p.blocks[0]);
  t->blocks.push_back(ob.idx());
  t->heights.push_back(p.shape[0]);
  t->widths.push_back(D);
  t->state_counts.push_back(counted);
}

// Whether `p` is an is_distributed embedding table: every lookup_table of it says so (a mix is a
// keel::Error). Each lookup fetches its own ids' rows; their row-sparse gradients are summed by
// backward's `sum` into the table's one gradient, which is pushed as one table's.
bool IsDistributedTable(const Block& b, const PsPlan::Param& p) {
  int lookups = 0, distributed = 0;
  for (size_t i = 0; i < b.num_ops(); ++i) {
    const OpDesc& op = *b.op(i);
    if (op.type() != "lookup_table" || op.Input("W").empty() || op.Input("W")[0] != p.name)
      continue;
    ++lookups;
    if (op.HasAttr("is_distributed") && op.Attr<bool>("is_distributed")) ++distributed;
  }
  if (distributed == 0) return false;
  KEEL_ENFORCE(distributed == lookups, "parameter-server transpiler: table ", p.name, " has ",
               distributed, " lookup_table ops with is_distributed=true and ",
               lookups - distributed, " without; look it up one way");
  KEEL_ENFORCE(p.sparse && p.shape.size() == 2, "parameter-server transpiler: distributed table ",
               p.name, " needs is_sparse=true and dims [V, D], got ", DDim(p.shape));
  return true;
}

}  // namespace ps_internal

void RewriteDistributedLookups(Program& program, const PsPlan& plan, int nservers, int mode) {
  Block& b = program.global_block();
  for (const PsPlan::Param& p : plan.params) {
    if (!p.distributed || b.FindVar(p.name) == nullptr) continue;
    ps_internal::ReplaceDistributedLookup(b, p, nservers, mode);
    for (size_t i = 0; i < b.num_ops(); ++i)
      for (const std::string& a : ps_internal::Args(*b.op(i)))
        KEEL_ENFORCE(a != p.name, "parameter-server transpiler: op ", b.op(i)->type(),
                     " of the evaluation program reads distributed table ", p.name,
                     ", which lives on the servers only");
    b.RemoveVar(p.name);
  }
}

}  // namespace transpiler
}  // namespace keel
