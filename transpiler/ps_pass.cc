#include "transpiler/ps_pass.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "framework/error.h"
#include "framework/op/op_registry.h"
#include "transpiler/ps_pass_internal.h"

namespace keel {
namespace transpiler {

using ps_internal::AddServerTable;
using ps_internal::Append;
using ps_internal::AppendCopy;
using ps_internal::Args;
using ps_internal::Declare;
using ps_internal::IsDistributedTable;
using ps_internal::ReplaceDistributedLookup;
using ps_internal::ServerTables;

namespace {

constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);

std::vector<int64_t> WithRows(std::vector<int64_t> shape, int64_t rows) {
  if (shape.empty()) return {rows};
  shape[0] = rows;
  return shape;
}

bool IsOptimize(const OpDesc& op) {
  if (!op.HasAttr(kOpRoleAttr)) return false;
  const int role = op.Attr<int>(kOpRoleAttr);
  return (role & kOptimize) != 0 && (role & static_cast<int>(OpRole::kBackward)) == 0;
}

std::vector<std::string> RoleVar(const OpDesc& op) {
  if (!op.HasAttr(kOpRoleVarAttr)) return {};
  return op.Attr<std::vector<std::string>>(kOpRoleVarAttr);
}

// The rows of each block of parameter `p` and the servers they go to, as attrs of send / recv.
struct BlockAttrs {
  std::vector<int> epmap, slots;
  std::vector<int64_t> sections;
  std::vector<std::string> names, grad_names;
};
BlockAttrs AttrsOf(const PsPlan& plan, const PsPlan::Param& p) {
  BlockAttrs a;
  for (int k : p.blocks) {
    const PsPlan::Block& b = plan.blocks[k];
    a.epmap.push_back(b.server);
    a.slots.push_back(k);
    a.sections.push_back(b.rows);
    a.names.push_back(b.name);
    a.grad_names.push_back(b.grad_name);
  }
  return a;
}

// The trainer's persistable vars (what it holds for the whole run) against its budget.
void CheckWorkerMemory(const Program& main, int64_t budget_mb) {
  double total = 0, largest = 0;
  const VarDesc* big = nullptr;
  for (const VarDesc* v : main.global_block().AllVars()) {
    if (!v->persistable()) continue;
    double bytes = static_cast<double>(SizeOf(v->dtype()));
    for (int64_t d : v->shape()) bytes *= std::max<int64_t>(d, 1);
    total += bytes;
    if (bytes > largest) {
      largest = bytes;
      big = v;
    }
  }
  const double mib = 1024.0 * 1024.0;
  KEEL_ENFORCE(
      total <= static_cast<double>(budget_mb) * mib,
      "parameter-server transpiler: this trainer would hold ", total / mib,
      " MiB of parameters and state, over DistributedStrategy.ps_worker_memory_mb=", budget_mb,
      "; the largest is ", big->name(), " ", DDim(big->shape()), " (", largest / mib,
      " MiB): make an embedding table that large is_distributed=true, so that its rows "
      "live on the servers only");
}

}  // namespace

std::vector<int64_t> SliceRows(const std::vector<int64_t>& shape, int nservers,
                               int64_t min_block_size) {
  KEEL_ENFORCE(nservers >= 1 && min_block_size >= 1, "SliceRows: nservers=", nservers,
               ", min_block_size=", min_block_size);
  int64_t numel = 1;
  for (int64_t d : shape) {
    KEEL_ENFORCE(d >= 0, "SliceRows: dims ", DDim(shape), " are not all known");
    numel *= d;
  }
  const int64_t width = shape.size() >= 2 ? numel / std::max<int64_t>(shape[0], 1) : 1;
  if (numel == 0 || width == 0) return {shape.empty() ? 1 : shape[0]};
  int64_t split = nservers;
  const int64_t most = std::max<int64_t>(numel / min_block_size, 1);
  split = std::min(split, most);
  int64_t block = (numel + split - 1) / split;
  if (block % width != 0) block += width - block % width;  // whole rows
  split = (numel + block - 1) / block;
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < split; ++i) rows.push_back(std::min(block, numel - i * block) / width);
  return rows;
}

PsPlan PlanParameterServer(const Program& main, int nservers, int64_t min_block_size) {
  KEEL_ENFORCE(main.num_blocks() == 1,
               "parameter-server transpiler: the main program has sub-blocks (gradient merge, "
               "control flow), which it does not split (not built)");
  const Block& b = main.global_block();
  PsPlan plan;
  std::map<std::string, size_t> index;
  std::set<std::string> lr;
  for (size_t i = 0; i < b.num_ops(); ++i) {
    const OpDesc& op = *b.op(i);
    if (!IsOptimize(op)) continue;
    const std::vector<std::string> rv = RoleVar(op);
    if (rv.empty()) {
      plan.lr_ops.push_back(i);
      for (const std::string& a : Args(op)) {
        const VarDesc* v = b.FindVar(a);
        if (v && v->persistable()) lr.insert(a);
      }
      continue;
    }
    KEEL_ENFORCE(rv.size() == 2, "parameter-server transpiler: optimize op ", op.type(),
                 " acts on ", rv.size() / 2,
                 " parameters together; only per-parameter updates are built (refusing, e.g., "
                 "gradient clipping by global norm and AMP's loss scaling)");
    auto [it, fresh] = index.emplace(rv[0], plan.params.size());
    if (fresh) {
      PsPlan::Param p;
      p.name = rv[0];
      p.grad = rv[1];
      const VarDesc* v = b.MustFindVar(p.name);
      p.shape = v->shape();
      const VarDesc* g = b.FindVar(p.grad);
      p.sparse = g != nullptr && g->row_sparse();
      plan.params.push_back(p);
    }
    plan.params[it->second].ops.push_back(i);
    for (const std::string& a : op.Input("LearningRate")) lr.insert(a);
  }
  KEEL_ENFORCE(!plan.params.empty(),
               "parameter-server transpiler: the main program updates no parameter (run "
               "minimize first)");
  std::set<std::string> grads;
  for (const auto& p : plan.params) grads.insert(p.grad);
  for (size_t i : plan.lr_ops)
    for (const std::string& a : b.op(i)->InputArgumentNames())
      KEEL_ENFORCE(!grads.count(a), "parameter-server transpiler: optimize op ", b.op(i)->type(),
                   " reads gradient ", a, " but updates no parameter (not built)");
  plan.lr_vars.assign(lr.begin(), lr.end());
  for (PsPlan::Param& p : plan.params) {
    std::set<std::string> state;
    for (size_t i : p.ops)
      for (const std::string& a : Args(*b.op(i))) {
        const VarDesc* v = b.FindVar(a);
        if (v && v->persistable() && a != p.name && !lr.count(a)) state.insert(a);
      }
    p.state.assign(state.begin(), state.end());
    for (const std::string& s : p.state)
      for (const PsPlan::Param& q : plan.params)
        KEEL_ENFORCE(&q == &p || std::find(q.state.begin(), q.state.end(), s) == q.state.end(),
                     "parameter-server transpiler: ", s, " is state of both ", q.name, " and ",
                     p.name);
    p.distributed = IsDistributedTable(b, p);
    if (p.distributed) {
      for (int k = 0; k < nservers; ++k) {
        PsPlan::Block blk;
        blk.param = blk.name = p.name;
        blk.grad = blk.grad_name = p.grad;
        blk.index = k;
        blk.rows = -1;
        blk.server = k;
        p.blocks.push_back(static_cast<int>(plan.blocks.size()));
        plan.blocks.push_back(blk);
      }
      continue;
    }
    const std::vector<int64_t> rows = SliceRows(p.shape, nservers, min_block_size);
    int64_t row0 = 0;
    for (size_t k = 0; k < rows.size(); ++k) {
      PsPlan::Block blk;
      blk.param = p.name;
      blk.grad = p.grad;
      blk.index = static_cast<int>(k);
      blk.name = rows.size() == 1 ? p.name : StrCat(p.name, ".block", k);
      blk.grad_name = rows.size() == 1 ? p.grad : StrCat(p.grad, ".block", k);
      blk.rows = rows[k];
      blk.row0 = row0;
      row0 += rows[k];
      blk.server = static_cast<int>(plan.blocks.size()) % nservers;
      p.blocks.push_back(static_cast<int>(plan.blocks.size()));
      plan.blocks.push_back(blk);
    }
  }
  return plan;
}

std::vector<PsStateBlock> PsServerState(const PsPlan& plan, const Program& main, int server) {
  const Block& b = main.global_block();
  std::vector<PsStateBlock> out;
  for (const std::string& n : plan.lr_vars)
    if (b.MustFindVar(n)->persistable()) out.push_back({n, n, 0, -1, b.MustFindVar(n)->shape()});
  for (const PsPlan::Param& p : plan.params) {
    // A distributed table: every server holds a shard, with its own copy of the table's state
    // that is not row-shaped (Adam's beta powers); the row-shaped state goes with the shard's
    // rows (listen_and_serv's TableVars).
    if (p.distributed) {
      for (const std::string& s : p.state) {
        const std::vector<int64_t>& shape = b.MustFindVar(s)->shape();
        if (shape == p.shape) continue;
        for (int k : p.blocks)
          if (plan.blocks[k].server == server) out.push_back({s, s, 0, -1, shape});
      }
      continue;
    }
    for (const std::string& s : p.state) {
      const std::vector<int64_t>& shape = b.MustFindVar(s)->shape();
      const bool rows = p.split() && shape == p.shape;
      for (int k : p.blocks) {
        const PsPlan::Block& blk = plan.blocks[k];
        if (blk.server != server) continue;
        const std::string name = p.split() ? StrCat(s, ".block", blk.index) : s;
        if (rows) {
          out.push_back({name, s, blk.row0, blk.rows, WithRows(p.shape, blk.rows)});
        } else {
          out.push_back({name, s, 0, -1, shape});
        }
      }
    }
  }
  return out;
}

void ParameterServerPass::Apply(Program& main, Program& startup) const {
  KEEL_ENFORCE(options_.nservers >= 1 && options_.ntrainers >= 1,
               "parameter-server transpiler: needs at least one server and one trainer, got ",
               options_.nservers, " and ", options_.ntrainers);
  KEEL_ENFORCE(options_.server_index >= -1 && options_.server_index < options_.nservers,
               "parameter-server transpiler: server_index ", options_.server_index,
               " outside [-1, ", options_.nservers, ")");
  KEEL_ENFORCE(options_.mode != PsMode::kGeo || options_.geo_k >= 1,
               "parameter-server transpiler: GEO needs geo_k >= 1, got ", options_.geo_k);
  const PsPlan plan = PlanParameterServer(main, options_.nservers, options_.min_block_size);
  for (const PsPlan::Param& p : plan.params)
    KEEL_ENFORCE(!p.distributed || options_.mode != PsMode::kGeo,
                 "parameter-server transpiler: distributed table ", p.name,
                 " (is_distributed=true) in GEO mode is not built (GEO trainers keep whole "
                 "parameters); use sync or async mode, or is_distributed=false");
  if (options_.server_index < 0 && options_.mode == PsMode::kGeo) {
    ApplyGeoTrainer(plan, main, startup);
  } else if (options_.server_index < 0) {
    ApplyTrainer(plan, main, startup);
  } else {
    ApplyServer(plan, main, startup);
  }
  if (options_.server_index < 0 && options_.worker_memory_mb > 0)
    CheckWorkerMemory(main, options_.worker_memory_mb);
}

namespace {

// Moves ops [from, end) of `b` (the receives: recv ops, fetch_barrier, concats) before the first
// earlier op that reads a var they write (the step's first use of a parameter).
void MoveReceivesToTheStart(Block& b, size_t from) {
  std::set<std::string> written;
  for (size_t i = from; i < b.num_ops(); ++i)
    for (const std::string& o : b.op(i)->OutputArgumentNames()) written.insert(o);
  size_t first = from;
  for (size_t i = 0; i < from && first == from; ++i)
    for (const std::string& in : b.op(i)->InputArgumentNames())
      if (written.count(in)) first = i;
  for (size_t i = from; i < b.num_ops(); ++i) {
    auto op = std::make_unique<OpDesc>(*b.op(i));
    b.RemoveOp(i);
    b.InsertOp(first++, std::move(op));
  }
}

}  // namespace

void ParameterServerPass::ApplyTrainer(const PsPlan& plan, Program& main, Program& startup) const {
  Block& mb = main.global_block();
  const int S = options_.nservers;
  const int mode = static_cast<int>(options_.mode);
  // Which parameters SGD updates (before their update ops leave).
  std::vector<bool> sgd(plan.params.size(), false);
  for (size_t k = 0; k < plan.params.size(); ++k) {
    sgd[k] = !plan.params[k].ops.empty();
    for (size_t i : plan.params[k].ops) sgd[k] = sgd[k] && mb.op(i)->type() == "sgd";
  }
  // The optimizer section goes to the servers, with the vars only it used.
  std::set<size_t> moved(plan.lr_ops.begin(), plan.lr_ops.end());
  for (const auto& p : plan.params) moved.insert(p.ops.begin(), p.ops.end());
  std::set<std::string> touched;
  for (auto it = moved.rbegin(); it != moved.rend(); ++it) {
    for (const std::string& a : Args(*mb.op(*it))) touched.insert(a);
    mb.RemoveOp(*it);
  }
  // A send after each gradient's last writer; inserted from the back so positions hold.
  std::vector<std::tuple<size_t, size_t>> at;  // (writer, param)
  for (size_t k = 0; k < plan.params.size(); ++k) {
    const std::string& g = plan.params[k].grad;
    size_t writer = mb.num_ops();
    for (size_t i = 0; i < mb.num_ops(); ++i)
      for (const std::string& o : mb.op(i)->OutputArgumentNames())
        if (o == g) writer = i;
    KEEL_ENFORCE(writer < mb.num_ops(), "parameter-server transpiler: nothing writes ", g);
    at.emplace_back(writer, k);
  }
  std::sort(at.rbegin(), at.rend());
  for (const auto& [writer, k] : at) {
    const PsPlan::Param& p = plan.params[k];
    BlockAttrs a = AttrsOf(plan, p);
    if (p.distributed) {
      // Row id to server id % S, under the table's slot (its first block's).
      a.sections.assign(a.sections.size(), 0);
      a.slots.assign(a.slots.size(), p.blocks[0]);
    }
    OpDesc* send = mb.InsertOp(writer + 1, "send");
    send->SetInput("X", {p.grad});
    send->SetAttr("epmap", a.epmap);
    send->SetAttr("sections", a.sections);
    send->SetAttr("slots", a.slots);
    send->SetAttr("pserver_num", S);
    send->SetAttr("mode", mode);
    send->SetAttr("send_varnames", a.grad_names);
    if (p.sparse) send->SetAttr("is_sparse", true);
    if (p.distributed) send->SetAttr("is_distributed", true);
    // Async: queued steps of an SGD parameter's gradient merge by sum (framework/ps/
    // async_communicator.h).
    if (mode == static_cast<int>(PsMode::kAsync) && sgd[k]) send->SetAttr("merge_sum", true);
    send->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kBackward));
    OpRegistry::Get("send").Complete(send);
  }
  std::vector<std::string> grads;
  for (const auto& p : plan.params) grads.push_back(p.grad);
  Append(mb, "send_barrier", {{"X", grads}}, {}, {{"pserver_num", S}});
  // Receive every parameter (main: after each step; startup: the initial values).
  const bool communicator =
      mode == static_cast<int>(PsMode::kAsync) && options_.send_queue_size > 0;
  auto receive = [&](Block& b) {
    std::vector<std::string> all;
    for (const auto& p : plan.params) {
      if (p.distributed) continue;  // its rows come with each batch (distributed_lookup_table)
      const BlockAttrs a = AttrsOf(plan, p);
      const VarDesc* pv = b.MustFindVar(p.name);
      for (size_t i = 0; p.split() && i < a.names.size(); ++i)
        Declare(b, a.names[i], *pv, WithRows(p.shape, a.sections[i]), false);
      Append(b, "recv", {}, {{"Out", a.names}},
             {{"epmap", a.epmap},
              {"sections", a.sections},
              {"slots", a.slots},
              {"shape", p.shape},
              {"pserver_num", S},
              {"mode", mode}});
      all.insert(all.end(), a.names.begin(), a.names.end());
    }
    if (!all.empty()) {
      OpDesc* fb = Append(b, "fetch_barrier", {{"X", all}}, {}, {{"pserver_num", S}});
      if (communicator && &b != &mb) {
        fb->SetAttr("send_queue_size", options_.send_queue_size);
        fb->SetAttr("max_merge_var_num", options_.max_merge_var_num);
        fb->SetAttr("max_staleness", options_.max_staleness);
      }
    }
    for (const auto& p : plan.params)
      if (p.split() && !p.distributed) {
        Append(b, "concat", {{"X", AttrsOf(plan, p).names}}, {{"Out", {p.name}}}, {{"axis", 0}});
      }
  };
  const size_t received = mb.num_ops();
  receive(mb);
  // Distributed tables: lookups fetch the batch's rows from the servers; the trainer never
  // holds the table.
  for (const auto& p : plan.params)
    if (p.distributed) {
      ReplaceDistributedLookup(mb, p, S, mode);
      mb.RemoveVar(p.name);
    }
  if (communicator) MoveReceivesToTheStart(mb, received);
  std::set<std::string> used;
  for (size_t i = 0; i < mb.num_ops(); ++i)
    for (const std::string& a : Args(*mb.op(i))) used.insert(a);
  for (const std::string& n : touched)
    if (!used.count(n) && mb.FindVar(n) && !mb.FindVar(n)->is_parameter()) mb.RemoveVar(n);

  // Startup: the parameters come from the servers; state and rate live there.
  Block& sb = startup.global_block();
  std::set<std::string> gone(plan.lr_vars.begin(), plan.lr_vars.end());
  std::set<std::string> params;
  for (const auto& p : plan.params) {
    gone.insert(p.state.begin(), p.state.end());
    params.insert(p.name);
  }
  for (size_t i = sb.num_ops(); i-- > 0;) {
    bool drop = true;
    for (const std::string& o : sb.op(i)->OutputArgumentNames())
      drop = drop && (gone.count(o) || params.count(o));
    if (drop && !sb.op(i)->OutputArgumentNames().empty()) sb.RemoveOp(i);
  }
  for (const std::string& n : gone)
    if (sb.FindVar(n)) sb.RemoveVar(n);
  for (const auto& p : plan.params)
    if (p.distributed && sb.FindVar(p.name)) sb.RemoveVar(p.name);
  receive(sb);
}

void ParameterServerPass::ApplyGeoTrainer(const PsPlan& plan, Program& main,
                                          Program& startup) const {
  const int S = options_.nservers, mode = static_cast<int>(PsMode::kGeo);
  Block& mb = main.global_block();
  Block& sb = startup.global_block();
  std::vector<std::string> params, olds;
  std::vector<int> epmap, slots, nblocks;
  std::vector<int64_t> sections;
  for (const PsPlan::Param& p : plan.params) {
    const BlockAttrs a = AttrsOf(plan, p);
    params.push_back(p.name);
    olds.push_back(StrCat(p.name, "@GEO_OLD"));
    epmap.insert(epmap.end(), a.epmap.begin(), a.epmap.end());
    slots.insert(slots.end(), a.slots.begin(), a.slots.end());
    sections.insert(sections.end(), a.sections.begin(), a.sections.end());
    nblocks.push_back(static_cast<int>(p.blocks.size()));
    for (Block* b : {&mb, &sb}) {
      const VarDesc& pv = *b->MustFindVar(p.name);
      Declare(*b, olds.back(), pv, p.shape, true)->set_is_parameter(false);
    }
  }
  Append(mb, "geo_communicate", {{"Param", params}, {"Old", olds}},
         {{"ParamOut", params}, {"OldOut", olds}},
         {{"epmap", epmap},
          {"sections", sections},
          {"slots", slots},
          {"blocks", nblocks},
          {"k_steps", options_.geo_k},
          {"trainers", options_.ntrainers},
          {"pserver_num", S},
          {"mode", mode}});
  // Startup: the parameters come from the servers (every trainer starts from the same values),
  // the rest (optimizer state, learning rate) is initialized here as in one process.
  std::set<std::string> names(params.begin(), params.end());
  for (size_t i = sb.num_ops(); i-- > 0;) {
    bool drop = true;
    for (const std::string& o : sb.op(i)->OutputArgumentNames()) drop = drop && names.count(o);
    if (drop && !sb.op(i)->OutputArgumentNames().empty()) sb.RemoveOp(i);
  }
  std::vector<std::string> all;
  for (const PsPlan::Param& p : plan.params) {
    const BlockAttrs a = AttrsOf(plan, p);
    const VarDesc* pv = sb.MustFindVar(p.name);
    for (size_t i = 0; p.split() && i < a.names.size(); ++i)
      Declare(sb, a.names[i], *pv, WithRows(p.shape, a.sections[i]), false);
    Append(sb, "recv", {}, {{"Out", a.names}},
           {{"epmap", a.epmap},
            {"sections", a.sections},
            {"slots", a.slots},
            {"shape", p.shape},
            {"pserver_num", S},
            {"mode", mode}});
    all.insert(all.end(), a.names.begin(), a.names.end());
  }
  Append(sb, "fetch_barrier", {{"X", all}}, {}, {{"pserver_num", S}});
  for (size_t k = 0; k < plan.params.size(); ++k) {
    const PsPlan::Param& p = plan.params[k];
    if (p.split())
      Append(sb, "concat", {{"X", AttrsOf(plan, p).names}}, {{"Out", {p.name}}}, {{"axis", 0}});
    Append(sb, "assign", {{"X", {p.name}}}, {{"Out", {olds[k]}}}, {});
  }
}

void ParameterServerPass::ApplyServer(const PsPlan& plan, Program& main, Program& startup) const {
  const int me = options_.server_index, W = options_.ntrainers;
  const bool async = options_.mode != PsMode::kSync;
  const bool geo = options_.mode == PsMode::kGeo;
  const std::unique_ptr<Program> orig_main = main.Clone();
  const Block& om = orig_main->global_block();
  Block& mb = main.global_block();
  mb.RemoveOps(0, mb.num_ops());
  for (VarDesc* v : mb.AllVars()) mb.RemoveVar(v->name());
  // Startup: every initializer of the single-device startup, in its order (so that each draws
  // what it draws in one process), into non-persistable vars; then this server's blocks are cut
  // from them.
  Block& sb = startup.global_block();
  for (VarDesc* v : sb.AllVars()) v->set_persistable(false);
  for (const std::string& n : plan.lr_vars) {
    if (geo) break;  // the trainers keep the learning rate
    const VarDesc& v = *om.MustFindVar(n);
    // Persistable on the server even when the schedule computes it each step (in its own
    // block): it must outlive that block until the optimize blocks have read it.
    Declare(mb, n, v, v.shape(), true);
    if (!v.persistable()) continue;
    KEEL_ENFORCE(sb.FindVar(n),
                 "parameter-server transpiler: the startup program does not "
                 "initialize ",
                 n);
    sb.FindVar(n)->set_persistable(true);
  }
  int lr_block = -1;
  if (!plan.lr_ops.empty() && !geo) {
    Block& lb = main.AppendBlock(0);
    lr_block = lb.idx();
    for (size_t i : plan.lr_ops) {
      AppendCopy(lb, *om.op(i));
      for (const std::string& a : Args(*om.op(i)))
        if (!mb.FindVar(a)) {
          const VarDesc& v = *om.MustFindVar(a);
          Declare(mb, a, v, v.shape(), v.persistable());
        }
    }
  }
  const std::set<std::string> lr(plan.lr_vars.begin(), plan.lr_vars.end());
  std::vector<std::string> xs, trainer_grads, sparse_grads;
  std::vector<int> slots, blocks, sparse_blocks;
  ServerTables tables;
  for (const PsPlan::Param& p : plan.params) {
    if (p.distributed) {
      AddServerTable(p, om, main, startup, W, async, &tables);
      continue;
    }
    std::vector<const PsPlan::Block*> mine;
    for (int k : p.blocks)
      if (plan.blocks[k].server == me) mine.push_back(&plan.blocks[k]);
    if (mine.empty()) continue;
    const VarDesc& pv = *om.MustFindVar(p.name);
    const BlockAttrs a = AttrsOf(plan, p);
    // `whole` (initialized by startup) into its blocks: split along rows when it has the
    // parameter's shape, else an assign per block of this server.
    auto cut = [&](const std::string& whole, const std::vector<std::string>& parts) {
      VarDesc* wv = sb.FindVar(whole);
      KEEL_ENFORCE(wv != nullptr,
                   "parameter-server transpiler: the startup program does not "
                   "initialize ",
                   whole);
      if (!p.split()) {
        wv->set_persistable(true);
        return;
      }
      if (wv->shape() == p.shape) {
        for (size_t i = 0; i < parts.size(); ++i) {
          const bool here = plan.blocks[p.blocks[i]].server == me;
          Declare(sb, parts[i], *wv, WithRows(p.shape, a.sections[i]), here);
        }
        std::vector<int> sections(a.sections.begin(), a.sections.end());
        Append(sb, "split", {{"X", {whole}}}, {{"Out", parts}},
               {{"sections", sections}, {"axis", 0}});
      } else {
        for (const PsPlan::Block* blk : mine) {
          Declare(sb, parts[blk->index], *wv, wv->shape(), true);
          Append(sb, "assign", {{"X", {whole}}}, {{"Out", {parts[blk->index]}}}, {});
        }
      }
    };
    cut(p.name, a.names);
    std::map<std::string, std::vector<std::string>> state_blocks;  // state -> name per block
    for (const std::string& s : geo ? std::vector<std::string>{} : p.state) {
      const VarDesc& sv = *om.MustFindVar(s);
      std::vector<std::string>& names = state_blocks[s];
      for (size_t i = 0; i < p.blocks.size(); ++i)
        names.push_back(p.split() ? StrCat(s, ".block", i) : s);
      cut(s, names);
      for (const PsPlan::Block* blk : mine) {
        const bool rows = sv.shape() == p.shape;
        Declare(mb, names[blk->index], sv, rows ? WithRows(p.shape, blk->rows) : sv.shape(), true);
      }
    }
    // Main: per block of this server, its optimize block.
    for (const PsPlan::Block* blk : mine) {
      const std::vector<int64_t> shape = WithRows(p.shape, blk->rows);
      Declare(mb, blk->name, pv, shape, true)->set_is_parameter(true);
      std::vector<std::string> copies;
      Block& ob = main.AppendBlock(0);
      if (geo) {
        // A trainer's (latest - old) / ntrainers, added as it arrives.
        const std::string delta = StrCat(blk->name, "@GEO_DELTA");
        Declare(mb, delta, pv, shape, false);
        Append(ob, "sum", {{"X", {blk->name, delta}}}, {{"Out", {blk->name}}}, {});
        xs.push_back(blk->name);
        trainer_grads.push_back(delta);
        slots.push_back(p.blocks[blk->index]);
        blocks.push_back(ob.idx());
        continue;
      }
      Declare(mb, blk->grad_name, pv, shape, false)->set_row_sparse(p.sparse);
      if (async) {
        copies.push_back(blk->grad_name);  // one trainer's gradient, applied as it is
      } else {
        for (int t = 0; t < W; ++t) {
          copies.push_back(StrCat(blk->grad_name, ".trainer_", t));
          Declare(mb, copies.back(), pv, shape, false)->set_row_sparse(p.sparse);
        }
        if (p.sparse) {
          // The trainers' rows, each summed in trainer order, then 1/W (as sum and scale).
          Append(ob, "merge_sparse_grad", {{"X", copies}}, {{"Out", {blk->grad_name}}},
                 {{"scale", 1.0f / static_cast<float>(W)}});
        } else {
          Append(ob, "sum", {{"X", copies}}, {{"Out", {blk->grad_name}}}, {});
          Append(ob, "scale", {{"X", {blk->grad_name}}}, {{"Out", {blk->grad_name}}},
                 {{"scale", 1.0f / static_cast<float>(W)}});
        }
      }
      std::map<std::string, std::string> rename = {{p.name, blk->name}, {p.grad, blk->grad_name}};
      for (const auto& [s, names] : state_blocks) rename[s] = names[blk->index];
      for (size_t i : p.ops) {
        OpDesc* c = AppendCopy(ob, *om.op(i));
        for (const std::string& arg : Args(*c)) {
          if (!rename.count(arg)) {
            const VarDesc& v = *om.MustFindVar(arg);
            if (v.persistable() || lr.count(arg)) continue;  // the learning rate
            // A temporary of the update (weight decay's): one per block.
            const std::string n = p.split() ? StrCat(arg, ".block", blk->index) : arg;
            Declare(mb, n, v, v.shape() == p.shape ? shape : v.shape(), false);
            rename[arg] = n;
          }
        }
        auto renamed = [&](const std::string& n) {
          auto it = rename.find(n);
          return it == rename.end() ? n : it->second;  // the learning rate keeps its name
        };
        for (const std::string& in : c->InputArgumentNames()) c->RenameInput(in, renamed(in));
        for (const std::string& out : c->OutputArgumentNames()) c->RenameOutput(out, renamed(out));
        c->SetAttr(kOpRoleVarAttr, std::vector<std::string>{blk->name, blk->grad_name});
      }
      if (p.sparse) sparse_blocks.push_back(static_cast<int>(xs.size()));
      xs.push_back(blk->name);
      std::vector<std::string>& into = p.sparse ? sparse_grads : trainer_grads;
      into.insert(into.end(), copies.begin(), copies.end());
      slots.push_back(p.blocks[blk->index]);
      blocks.push_back(ob.idx());
    }
  }
  KEEL_ENFORCE(!xs.empty(), "parameter-server transpiler: server ", me, " of ", options_.nservers,
               " holds no parameter block (the model has ", plan.blocks.size(),
               " blocks); use at most that many servers");
  std::vector<std::string> state;
  for (const PsStateBlock& e : PsServerState(plan, *orig_main, me)) state.push_back(e.name);
  if (geo) state = xs;  // a GEO server holds its parameter blocks only
  KEEL_ENFORCE(geo || !state.empty(),
               "parameter-server transpiler: the optimizer has no learning-rate var");
  OpDesc* serv = mb.AppendOp("listen_and_serv");
  serv->SetInput("X", xs);
  serv->SetInput("State", state);
  // Unused lists hold @EMPTY@ (the op's slots are all required).
  auto list = [](std::vector<std::string> v) {
    return v.empty() ? std::vector<std::string>{kEmptyVarName} : v;
  };
  serv->SetOutput("Grads", list(trainer_grads));
  std::vector<std::string> row_grads = sparse_grads, table_vars;
  row_grads.insert(row_grads.end(), tables.grads.begin(), tables.grads.end());
  serv->SetOutput("RowGrads", list(row_grads));
  for (size_t k = 0, at = 0; k < tables.names.size(); ++k) {
    table_vars.push_back(tables.names[k]);
    table_vars.push_back(tables.ids[k]);
    for (int j = 0; j < tables.state_counts[k]; ++j) table_vars.push_back(tables.state[at++]);
  }
  serv->SetOutput("TableVars", list(table_vars));
  if (!sparse_blocks.empty()) serv->SetAttr("sparse_blocks", sparse_blocks);
  if (!row_grads.empty()) serv->SetAttr("row_sparse", true);
  if (!tables.names.empty()) {
    serv->SetAttr("table_slots", tables.slots);
    serv->SetAttr("table_blocks", tables.blocks);
    serv->SetAttr("table_heights", tables.heights);
    serv->SetAttr("table_widths", tables.widths);
    serv->SetAttr("table_state_counts", tables.state_counts);
    serv->SetAttr("table_state_values", tables.state_values);
    serv->SetAttr("table_dists", tables.dists);
    serv->SetAttr("table_as", tables.as);
    serv->SetAttr("table_bs", tables.bs);
    serv->SetAttr("table_seeds", tables.seeds);
  }
  serv->SetAttr("slots", slots);
  serv->SetAttr("optimize_blocks", blocks);
  serv->SetAttr("lr_decay_block_id", lr_block);
  serv->SetAttr("Fanin", W);
  serv->SetAttr("pserver_num", options_.nservers);
  serv->SetAttr("server_index", me);
  serv->SetAttr("mode", static_cast<int>(options_.mode));
  serv->SetAttr(kOpRoleAttr, kOptimize);
  OpRegistry::Get("listen_and_serv").Complete(serv);
}

}  // namespace transpiler
}  // namespace keel
