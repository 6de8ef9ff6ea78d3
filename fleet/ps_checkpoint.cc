#include "fleet/ps_checkpoint.h"

#include <glog/logging.h>

#include <memory>
#include <set>
#include <vector>

#include "executor/executor_io.h"
#include "fleet/fleet.h"
#include "framework/base/strings.h"
#include "framework/ps/ps_transport.h"
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

bool IsGeoServer(const Program& program) {
  const Block& b = program.global_block();
  for (size_t i = 0; i < b.num_ops(); ++i)
    if (b.op(i)->type() == "listen_and_serv")
      return b.op(i)->Attr<int>("mode") == static_cast<int>(transpiler::PsMode::kGeo);
  return false;
}

// A GEO server's state list (its listen_and_serv State, in X's order): its parameter blocks.
std::vector<transpiler::PsStateBlock> GeoServerBlocks(const transpiler::PsPlan& plan,
                                                      const Program& original, int server) {
  std::vector<transpiler::PsStateBlock> out;
  const Block& ob = original.global_block();
  for (const transpiler::PsPlan::Param& p : plan.params)
    for (int k : p.blocks) {
      const transpiler::PsPlan::Block& blk = plan.blocks[k];
      if (blk.server != server) continue;
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

// Checkpoints of is_distributed tables are not implemented: their rows exist only on the servers,
// created on first touch, and no checkpoint format holds them yet. Refused before anything is
// pulled or written, naming the table (it used to fail later, saying the table was missing from
// the trainer's scope).
void RefuseDistributedTables(const transpiler::PsPlan& plan, const char* api) {
  for (const transpiler::PsPlan::Param& p : plan.params)
    KEEL_ENFORCE(!p.distributed, api, ": '", p.name,
                 "' is an is_distributed embedding table (its rows live only on the parameter "
                 "servers, created on first touch), and checkpoints of such tables are not "
                 "supported yet; save and resume with is_sparse=true (rows on every trainer) or "
                 "train without checkpoints");
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
  RefuseDistributedTables(plan, "fleet::save_persistables");
  if (r.trainer_id() != 0) return;
  const bool geo = IsGeoTrainer(program);
  const Block& ob = original.global_block();
  ps::Transport& t = ps::Transport::Get();
  t.RequestState();
  const int64_t step = t.step() + 1;
  Scope out;
  std::set<std::string> params;
  for (const auto& p : plan.params) params.insert(p.name);
  // Sync, async: the parameters as this trainer received them after its last step. GEO: what the
  // trainer holds locally but its parameters (its optimizer state, learning rate, ...).
  for (const VarDesc* v : ob.AllVars()) {
    if (!v->persistable() || params.count(v->name()) == (geo ? 1u : 0u)) continue;
    const Variable* var = exe.scope().FindVar(v->name());
    KEEL_ENFORCE(var != nullptr && var->tensor().initialized(),
                 "fleet::save_persistables: ", v->name(),
                 " is not in the trainer's scope (run the startup program first)");
    out.Var(v->name())->mutable_tensor()->ShareDataWith(var->tensor());
  }
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
  if (state)
    keel::save_checkpoint(out, dirname, original, *state);
  else
    keel::save_persistables(out, dirname, original);
}

std::optional<TrainingState> LoadPsServerState(Executor& exe, const std::string& dirname,
                                               const Program& program) {
  const Role& r = role();
  KEEL_ENFORCE(r.is_server(), "fleet::run_server: this process is not a parameter server");
  const Program& original = Original(program, "fleet::run_server (loading a checkpoint)");
  const transpiler::PsPlan& plan = *ps_plan(program);
  RefuseDistributedTables(plan, "fleet::run_server (loading a checkpoint)");
  const bool geo = IsGeoServer(program);
  Scope whole;
  std::optional<TrainingState> st;
  try {
    st = keel::load_checkpoint(whole, CPUPlace(), dirname, original);
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
  LOG(INFO) << "server " << r.rank << ": loaded " << entries.size() << " block(s) from " << dirname
            << (st ? StrCat(" (step ", st->step, ")") : std::string());
  return st;
}

}  // namespace fleet
}  // namespace keel
