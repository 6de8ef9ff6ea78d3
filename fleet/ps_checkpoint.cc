#include "fleet/ps_checkpoint.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "executor/executor_io.h"
#include "fleet/fleet.h"
#include "framework/base/strings.h"
#include "framework/ps/async_communicator.h"
#include "framework/ps/ps_transport.h"
#include "framework/ps/sparse_shard.h"
#include "transpiler/ps_pass.h"

namespace keel {
namespace fleet {

namespace {

bool IsGeoTrainer(const Program& program) {
  const Block& b = program.global_block();
  for (size_t i = 0; i < b.num_ops(); ++i)
    if (b.op(i)->type() == "geo_communicate") return true;
  return false;
}

// The server's listen_and_serv (its mode; its rules for the distributed tables' rows).
const OpDesc& ServeOp(const Program& program) {
  const Block& b = program.global_block();
  for (size_t i = 0; i < b.num_ops(); ++i)
    if (b.op(i)->type() == "listen_and_serv") return *b.op(i);
  KEEL_THROW("fleet::run_server: the server's program has no listen_and_serv");
}

bool IsGeoServer(const Program& program) {
  return ServeOp(program).Attr<int>("mode") == static_cast<int>(transpiler::PsMode::kGeo);
}

// A GEO server's state list (its listen_and_serv State, in X's order): its parameter blocks.
std::vector<transpiler::PsStateBlock> GeoServerBlocks(const transpiler::PsPlan& plan,
                                                      const Program& original, int server) {
  std::vector<transpiler::PsStateBlock> out;
  const Block& ob = original.global_block();
  for (const transpiler::PsPlan::Param& p : plan.params)
    for (int k : p.blocks) {
      const transpiler::PsPlan::Block& blk = plan.blocks[k];
      if (blk.server != server || p.distributed) continue;
      std::vector<int64_t> dims = ob.MustFindVar(p.name)->shape();
      if (!p.split()) {
        out.push_back({blk.name, p.name, 0, -1, dims});
        continue;
      }
      dims[0] = blk.rows;
      out.push_back({blk.name, p.name, blk.row0, blk.rows, dims});
    }
  return out;
}

// What server `server` holds besides (sync, async) or as (GEO) its parameter blocks, in the
// order it answers a checkpoint request.
std::vector<transpiler::PsStateBlock> ServerState(const transpiler::PsPlan& plan,
                                                  const Program& original, int server, bool geo) {
  return geo ? GeoServerBlocks(plan, original, server)
             : transpiler::PsServerState(plan, original, server);
}

// The parameter blocks a sync or async server holds (its listen_and_serv X).
std::vector<transpiler::PsStateBlock> ServerParams(const transpiler::PsPlan& plan,
                                                   const Program& original, int server) {
  return GeoServerBlocks(plan, original, server);
}

const Program& Original(const Program& program, const char* api) {
  const Program* original = ps_single_device_program(program);
  KEEL_ENFORCE(original != nullptr && ps_plan(program) != nullptr, api,
               ": the program is not a parameter-server program that "
               "fleet::distributed_optimizer(...).minimize made");
  return *original;
}

// A distributed table's vars in a checkpoint: the table, then its row-shaped optimizer state in
// the order the server's listen_and_serv lists them (TableVars; transpiler/ps_tables.cc).
std::vector<std::string> TableVars(const transpiler::PsPlan::Param& p, const Program& original) {
  std::vector<std::string> vars = {p.name};
  for (const std::string& s : p.state)
    if (original.global_block().MustFindVar(s)->shape() == p.shape) vars.push_back(s);
  return vars;
}

// Receives server s's shards of the distributed tables (listen_and_serv's PostShards, from State
// slot `first` on) and adds their rows to `rows` (per var: ids and values, unsorted yet).
void PullShards(ps::Transport& t, const transpiler::PsPlan& plan, const Program& original, int s,
                int first, int64_t step, RowsByVar* rows,
                std::map<std::string, std::vector<Tensor>>* parts) {
  int at = first;
  for (const transpiler::PsPlan::Param& p : plan.params) {
    if (!p.distributed) continue;
    const std::vector<std::string> vars = TableVars(p, original);
    const std::string what = StrCat("checkpoint: the rows of ", p.name, " from ", t.PeerName(s));
    std::vector<int64_t> meta(ps::ShardHeader::Words(vars.size() - 1));
    auto head = t.PostRecv({s}, ps::Slot(ps::Kind::kState, at++, step), meta.data(),
                           meta.size() * sizeof(int64_t), what);
    t.Wait(*head);
    const ps::ShardHeader header = ps::ShardHeader::Decode(meta);
    const int64_t n = header.rows;
    KEEL_ENFORCE(n >= 0 && n <= p.shape[0], what, ": ", n, " rows announced for a table of ",
                 p.shape[0]);
    const DType dtype = original.global_block().MustFindVar(p.name)->dtype();
    std::vector<int64_t> ids(static_cast<size_t>(n));
    std::vector<Tensor> values(vars.size());
    std::vector<std::unique_ptr<ps::Transport::Transfer>> pending;
    pending.push_back(t.PostRecv({s}, ps::Slot(ps::Kind::kState, at++, step), ids.data(),
                                 ids.size() * sizeof(int64_t), what));
    for (Tensor& v : values) {
      void* data = v.Alloc(dtype, DDim({n, p.shape[1]}));
      pending.push_back(
          t.PostRecv({s}, ps::Slot(ps::Kind::kState, at++, step), data, v.nbytes(), what));
    }
    for (auto& x : pending) t.Wait(*x);
    for (size_t j = 0; j < vars.size(); ++j) {
      StoredRows& r = (*rows)[vars[j]];
      r.init = j == 0 ? header.rule : ConstantRows(header.state_init[j - 1]);
      r.ids.insert(r.ids.end(), ids.begin(), ids.end());
      (*parts)[vars[j]].push_back(values[j]);
    }
  }
}

// Each var's rows sorted by id (the parts are the servers' shards, in creation order).
void SortRows(RowsByVar* rows, std::map<std::string, std::vector<Tensor>>* parts) {
  for (auto& entry : *rows) {
    // (Not a structured binding: clang 14 cannot capture one in the lambda below.)
    StoredRows& r = entry.second;
    const std::vector<Tensor>& got = (*parts)[entry.first];
    const DType dtype = got[0].dtype();
    const int64_t width = got[0].dims()[1];
    const size_t row_bytes = SizeOf(dtype) * static_cast<size_t>(width);
    std::vector<const char*> row_at;  // each id's row, in r.ids' order
    for (const Tensor& x : got)
      for (int64_t k = 0; k < x.dims()[0]; ++k)
        row_at.push_back(static_cast<const char*>(x.raw_data()) + k * row_bytes);
    std::vector<size_t> order(r.ids.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r.ids[a] < r.ids[b]; });
    const int64_t n = static_cast<int64_t>(order.size());
    std::vector<int64_t> ids(order.size());
    char* out = static_cast<char*>(r.values.Alloc(dtype, DDim({n, width})));
    for (size_t k = 0; k < order.size(); ++k) {
      ids[k] = r.ids[order[k]];
      std::memcpy(out + k * row_bytes, row_at[order[k]], row_bytes);
    }
    r.ids = std::move(ids);
  }
}

// The rows of distributed table p that this server (of `nservers`) owns, as `stored` (the
// checkpoint's, per TableVars) holds them, into the server's shard variables: the table,
// "<table>@IDS" and the row-shaped state. From a whole tensor (a one-process checkpoint) only the
// rows that differ from their initial values (`inits`: the table's rule, each state var's constant)
// are taken: the others are what the shard would create anyway.
void PutShard(Scope& scope, const transpiler::PsPlan::Param& p,
              const std::vector<std::string>& vars, const std::vector<RowInitRule>& inits,
              RowsByVar& stored, int me, int nservers, const std::string& dirname) {
  const StoredRows& table = stored.at(p.name);
  for (size_t j = 0; j < vars.size(); ++j) {
    const StoredRows& r = stored.at(vars[j]);
    KEEL_ENFORCE(r.whole == table.whole && r.ids == table.ids, "server ", me, ": ", dirname,
                 " holds ", vars[j], " and the distributed table ", p.name,
                 " by different rows; they must have the same ones");
    KEEL_ENFORCE(r.whole || r.init == inits[j], "server ", me, ": ", dirname, " holds ", vars[j],
                 " (of distributed table ", p.name, ") by rows that start as '",
                 RowInitText(r.init), "', but this program's start as '", RowInitText(inits[j]),
                 "'; resume with the initializer the checkpoint was trained with");
  }
  const int64_t D = p.shape[1];
  const DType dtype = table.values.dtype();
  const size_t row_bytes = SizeOf(dtype) * static_cast<size_t>(D);
  std::vector<size_t> keep;
  std::vector<char> init(row_bytes);
  for (size_t k = 0; k < table.ids.size(); ++k) {
    const int64_t id = table.ids[k];
    if (id % nservers != me) continue;
    bool differs = !table.whole;
    for (size_t j = 0; j < vars.size() && !differs; ++j) {
      if (dtype == DType::kFloat32) {
        RowInit(inits[j], id, D, reinterpret_cast<float*>(init.data()));
      } else {
        RowInit(inits[j], id, D, reinterpret_cast<double*>(init.data()));
      }
      const char* row =
          static_cast<const char*>(stored.at(vars[j]).values.raw_data()) + k * row_bytes;
      differs = std::memcmp(row, init.data(), row_bytes) != 0;
    }
    if (differs) keep.push_back(k);
  }
  const int64_t n = static_cast<int64_t>(keep.size());
  Tensor* ids = scope.Var(p.name + "@IDS")->mutable_tensor();
  int64_t* ip = static_cast<int64_t*>(ids->Alloc(DType::kInt64, DDim({n})));
  for (int64_t i = 0; i < n; ++i) ip[i] = table.ids[keep[i]];
  for (const std::string& v : vars) {
    Tensor* to = scope.Var(v)->mutable_tensor();
    char* out = static_cast<char*>(to->Alloc(dtype, DDim({n, D})));
    const char* src = static_cast<const char*>(stored.at(v).values.raw_data());
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out + i * row_bytes, src + keep[i] * row_bytes, row_bytes);
  }
}

}  // namespace

void SavePsCheckpoint(Executor& exe, const std::string& dirname, const Program& program,
                      const TrainingState* state) {
  const Role& r = role();
  KEEL_ENFORCE(!r.is_server(),
               "fleet::save_persistables on a parameter server: trainer 0 saves, pulling the "
               "servers' state (call it on the trainers)");
  const Program& original = Original(program, "fleet::save_persistables");
  const transpiler::PsPlan& plan = *ps_plan(program);
  if (r.trainer_id() != 0) return;
  const bool geo = IsGeoTrainer(program);
  const Block& ob = original.global_block();
  ps::Transport& t = ps::Transport::Get();
  t.RequestState();
  const int64_t step = t.step() + 1;
  Scope out;
  std::set<std::string> params, on_servers;
  for (const auto& p : plan.params) {
    params.insert(p.name);
    if (!p.distributed) continue;
    on_servers.insert(p.name);
    for (const std::string& s : p.state) on_servers.insert(s);
  }
  // Sync, async: the parameters as this trainer received them after its last step. GEO: what the
  // trainer holds locally but its parameters (its optimizer state, learning rate, ...).
  for (const VarDesc* v : ob.AllVars()) {
    if (!v->persistable() || params.count(v->name()) == (geo ? 1u : 0u) ||
        on_servers.count(v->name()))
      continue;
    const Variable* var = exe.scope().FindVar(v->name());
    KEEL_ENFORCE(var != nullptr && var->tensor().initialized(),
                 "fleet::save_persistables: ", v->name(),
                 " is not in the trainer's scope (run the startup program first)");
    out.Var(v->name())->mutable_tensor()->ShareDataWith(var->tensor());
  }
  // Asynchronous mode: the trainer's own parameters may predate its last push; the checkpoint
  // takes the blocks its communicator pulled after it (RequestState pushed what was queued).
  if (!geo && t.communicating())
    for (const transpiler::PsPlan::Param& p : plan.params) {
      if (p.distributed) continue;
      Tensor fresh;
      fresh.Resize(ob.MustFindVar(p.name)->dims());
      char* dst =
          static_cast<char*>(fresh.mutable_data(ob.MustFindVar(p.name)->dtype(), CPUPlace()));
      const size_t row =
          fresh.numel() == 0 ? 0 : fresh.nbytes() / std::max<int64_t>(fresh.dims()[0], 1);
      bool all = true;
      std::vector<char> got;
      for (int k : p.blocks) {
        const transpiler::PsPlan::Block& blk = plan.blocks[k];
        all = all && t.communicator().Latest(blk.server, k, &got);
        if (!all) break;
        const size_t at = p.split() ? static_cast<size_t>(blk.row0) * row : 0;
        KEEL_ENFORCE(at + got.size() <= fresh.nbytes(),
                     "fleet::save_persistables: the pulled block ", blk.name, " does not fit ",
                     p.name);
        std::memcpy(dst + at, got.data(), got.size());
      }
      if (all) *out.Var(p.name)->mutable_tensor() = fresh;
    }
  RowsByVar rows;
  std::map<std::string, std::vector<Tensor>> parts;
  for (int s = 0; s < r.server_num; ++s) {
    const std::vector<transpiler::PsStateBlock> entries = ServerState(plan, original, s, geo);
    std::vector<Tensor> got(entries.size());
    std::vector<std::unique_ptr<ps::Transport::Transfer>> pending;
    for (size_t i = 0; i < entries.size(); ++i) {
      const transpiler::PsStateBlock& e = entries[i];
      got[i].Resize(DDim(e.dims));
      got[i].mutable_data(ob.MustFindVar(e.var)->dtype(), CPUPlace());
      pending.push_back(t.PostRecv({s}, ps::Slot(ps::Kind::kState, static_cast<int>(i), step),
                                   got[i].raw_data(), got[i].nbytes(),
                                   StrCat("checkpoint: ", e.name, " from ", t.PeerName(s))));
    }
    for (auto& p : pending) t.Wait(*p);
    if (!geo)
      PullShards(t, plan, original, s, static_cast<int>(entries.size()), step, &rows, &parts);
    for (size_t i = 0; i < entries.size(); ++i) {
      const transpiler::PsStateBlock& e = entries[i];
      Tensor* whole = out.Var(e.var)->mutable_tensor();
      if (!whole->initialized()) {
        whole->Resize(ob.MustFindVar(e.var)->dims());
        whole->mutable_data(got[i].dtype(), CPUPlace());
      }
      if (e.rows < 0) {
        whole->CopyFrom(got[i]);
      } else {
        Tensor rows = whole->Slice(e.row0, e.row0 + e.rows);
        rows.CopyFrom(got[i]);
      }
    }
  }
  SortRows(&rows, &parts);
  if (state)
    keel::save_checkpoint(out, dirname, original, *state, {}, rows);
  else
    keel::save_persistables(out, dirname, original, {}, rows);
}

std::optional<TrainingState> LoadPsServerState(Executor& exe, const std::string& dirname,
                                               const Program& program) {
  const Role& r = role();
  KEEL_ENFORCE(r.is_server(), "fleet::run_server: this process is not a parameter server");
  const Program& original = Original(program, "fleet::run_server (loading a checkpoint)");
  const transpiler::PsPlan& plan = *ps_plan(program);
  const bool geo = IsGeoServer(program);
  Scope whole;
  std::optional<TrainingState> st;
  RowsByVar rows;
  for (const transpiler::PsPlan::Param& p : plan.params)
    if (p.distributed)
      for (const std::string& v : TableVars(p, original)) rows[v];
  try {
    st = keel::load_checkpoint(whole, CPUPlace(), dirname, original, {}, &rows);
  } catch (const Error& e) {
    KEEL_THROW("server ", r.rank, " loading the checkpoint in ", dirname, ": ", e.what());
  }
  std::vector<transpiler::PsStateBlock> entries = ServerParams(plan, original, r.rank);
  if (!geo) {
    std::vector<transpiler::PsStateBlock> state = transpiler::PsServerState(plan, original, r.rank);
    entries.insert(entries.end(), state.begin(), state.end());
  }
  for (const transpiler::PsStateBlock& e : entries) {
    const Variable* from = whole.FindVar(e.var);
    KEEL_ENFORCE(from != nullptr && from->tensor().initialized(), "server ", r.rank, ": ", dirname,
                 " holds no ", e.var);
    Variable* to = exe.scope().FindVar(e.name);
    KEEL_ENFORCE(to != nullptr, "server ", r.rank, ": ", e.name,
                 " is not in the server's scope (run its startup program first)");
    const Tensor src = e.rows < 0 ? from->tensor() : from->tensor().Slice(e.row0, e.row0 + e.rows);
    KEEL_ENFORCE(src.dims() == DDim(e.dims), "server ", r.rank, ": ", e.name, " is ", DDim(e.dims),
                 " but the checkpoint's ", e.var, " gives ", src.dims());
    to->mutable_tensor()->CopyFrom(src);
  }
  // The distributed tables: this server's rows, with the rules its listen_and_serv creates rows by.
  if (!rows.empty()) {
    const OpDesc& serv = ServeOp(program);
    const auto& dists = serv.Attr<std::vector<int>>("table_dists");
    const auto& as = serv.Attr<std::vector<float>>("table_as");
    const auto& bs = serv.Attr<std::vector<float>>("table_bs");
    const auto& seeds = serv.Attr<std::vector<int64_t>>("table_seeds");
    const auto& values = serv.Attr<std::vector<float>>("table_state_values");
    size_t k = 0, value = 0;
    for (const transpiler::PsPlan::Param& p : plan.params) {
      if (!p.distributed) continue;
      const std::vector<std::string> vars = TableVars(p, original);
      KEEL_ENFORCE(k < dists.size() && value + vars.size() - 1 <= values.size(), "server ", r.rank,
                   ": listen_and_serv lists fewer distributed tables than the plan");
      std::vector<RowInitRule> inits(1);
      inits[0].dist = dists[k];
      inits[0].a = as[k];
      inits[0].b = bs[k];
      inits[0].seed = seeds[k];
      for (size_t j = 1; j < vars.size(); ++j) inits.push_back(ConstantRows(values[value++]));
      PutShard(exe.scope(), p, vars, inits, rows, r.rank, r.server_num, dirname);
      ++k;
    }
  }
  LOG(INFO) << "server " << r.rank << ": loaded " << entries.size() << " block(s) from " << dirname
            << (st ? StrCat(" (step ", st->step, ")") : std::string());
  return st;
}

}  // namespace fleet
}  // namespace keel
