#include "fleet/model_parallel_checkpoint.h"

#include <cstring>
#include <utility>
#include <vector>

#include "fleet/fleet.h"
#include "fleet/topology.h"
#include "fleet/transpile.h"
#include "framework/dsl/tensor_parallel.h"
#include "framework/error.h"
#include "framework/io/prune.h"
#include "framework/op/op_registry.h"
#include "transpiler/pipeline_pass.h"

namespace keel {
namespace fleet {

namespace {

// Where the persistables of one model-parallel program live.
struct Layout {
  // The program before the model-parallel passes, with whole shapes: what a checkpoint holds.
  std::unique_ptr<Program> whole;
  // Pipeline: each persistable of `whole` -> the stage that holds it for the checkpoint (the
  // first stage whose program keeps it); without a pipeline every persistable is stage 0's.
  std::map<std::string, int> stage;
  // Persistables of `whole` that no stage keeps (no op of any stage uses them): not saved.
  std::set<std::string> unheld;
  // Tensor parallel: each sharded persistable -> its split axis; this rank's part is tp_rank of
  // tp_degree.
  std::map<std::string, int> split_axis;
  int tp_degree = 1, tp_rank = 0;
  // Where part t of stage s lives for the checkpoint: holders[s][t], the rank at (dp 0, pp s,
  // tp t).
  std::vector<std::vector<int>> holders;
  int Holder(int s, int t) const { return holders[s][t]; }
  int StageOf(const std::string& name) const {
    auto it = stage.find(name);
    return it == stage.end() ? 0 : it->second;
  }
};

std::map<uint64_t, Layout>& Layouts() {
  static auto* m = new std::map<uint64_t, Layout>;
  return *m;
}

const Layout* Find(const Program& main) {
  auto it = Layouts().find(main.id());
  return it == Layouts().end() ? nullptr : &it->second;
}

std::vector<std::string> Persistables(const Program& p, const std::set<std::string>& skip) {
  std::vector<std::string> names;
  for (const VarDesc* v : p.global_block().AllVars())
    if (v->persistable() && !skip.count(v->name())) names.push_back(v->name());
  return names;
}

// A model-parallel program whose layout minimize did not record (a stage or shards made by hand):
// which rank holds which part is unknown, so no checkpoint of it can be complete.
void RefuseUnknownLayout(const Program& p) {
  for (int b = 0; b < p.num_blocks(); ++b)
    for (const auto& op : p.block(b).ops())
      KEEL_ENFORCE(!OpRegistry::Traits(op->type()).shards_model,
                   "checkpoint: the program is model-parallel (op ", op->type(),
                   ", DistributedStrategy.pipeline or .tensor_parallel) but fleet's "
                   "distributed_optimizer(...).minimize did not make it, so where each rank's "
                   "part belongs is unknown: a checkpoint of it would hold this rank's part only");
}

// Bytes of the dims before `axis` (outer count) and of one slice from `axis` on, for `dims`.
void SplitSizes(const DDim& dims, int axis, size_t elem, int64_t* outer, size_t* inner_bytes) {
  *outer = 1;
  for (int i = 0; i < axis; ++i) *outer *= dims[i];
  int64_t inner = 1;
  for (int i = axis; i < dims.size(); ++i) inner *= dims[i];
  *inner_bytes = static_cast<size_t>(inner) * elem;
}

// Joins `parts` (equal shapes, on the CPU) along `axis`.
Tensor Join(const std::vector<Tensor>& parts, int axis) {
  DDim full = parts[0].dims();
  full[axis] *= static_cast<int64_t>(parts.size());
  Tensor out(parts[0].dtype(), full, CPUPlace());
  int64_t outer = 0;
  size_t chunk = 0;
  SplitSizes(parts[0].dims(), axis, SizeOf(parts[0].dtype()), &outer, &chunk);
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t o = 0; o < outer; ++o)
    for (const Tensor& p : parts) {
      std::memcpy(dst, static_cast<const char*>(p.raw_data()) + o * chunk, chunk);
      dst += chunk;
    }
  return out;
}

// Part `part` of `parts` equal parts of `whole` (on the CPU) along `axis`.
Tensor PartOf(const Tensor& whole, int axis, int part, int parts, const std::string& name) {
  DDim dims = whole.dims();
  KEEL_ENFORCE(axis < dims.size() && dims[axis] % parts == 0, "checkpoint: '", name, "' of shape ",
               dims.str(), " does not split into ", parts, " tensor-parallel parts along dim ",
               axis);
  dims[axis] /= parts;
  Tensor out(whole.dtype(), dims, CPUPlace());
  int64_t outer = 0;
  size_t chunk = 0;
  SplitSizes(dims, axis, SizeOf(whole.dtype()), &outer, &chunk);
  const char* src = static_cast<const char*>(whole.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + o * chunk, src + (o * parts + part) * chunk, chunk);
  return out;
}

Tensor OnCpu(const Scope& scope, const std::string& name, int rank) {
  const Variable* v = scope.FindVar(name);
  KEEL_ENFORCE(v != nullptr && v->tensor().initialized(), "checkpoint: rank ", rank, " holds no '",
               name, "' (run the startup program first)");
  return v->tensor().Clone(CPUPlace());
}

void RecordPipeline(Layout& l, const Program& whole_startup, const DistributedStrategy& strategy,
                    const Role& role, const Topology& topo) {
  for (int s = 0; s < topo.pp_degree(); ++s) {
    std::unique_ptr<Program> m = l.whole->Clone(), st = whole_startup.Clone();
    transpiler::PipelineOptions o = PipelineOptionsFor(strategy, role);
    o.stage = s;
    transpiler::PipelinePass(o).Apply(*m, *st);
    for (const VarDesc* v : m->global_block().AllVars())
      if (v->persistable() && l.whole->global_block().FindVar(v->name()) &&
          !l.stage.count(v->name()))
        l.stage[v->name()] = s;
  }
  for (const std::string& n : Persistables(*l.whole, {}))
    if (!l.stage.count(n)) l.unheld.insert(n);
}

void RecordTensorParallel(Layout& l, const Program& whole_startup, const Role& role,
                          const Topology& topo) {
  l.tp_rank = topo.Coord(role.rank).tp;
  Block& wb = l.whole->global_block();
  // The DSL's sharded parameters: startup cuts NAME from NAME@TP_FULL with c_split.
  std::map<std::string, DDim> full;
  const std::string suffix = kTpFullSuffix;
  for (const auto& op : whole_startup.global_block().ops()) {
    if (op->type() != "c_split" || op->Input("X").size() != 1) continue;
    const std::string& in = op->Input("X")[0];
    if (in.size() <= suffix.size() || in.compare(in.size() - suffix.size(), suffix.size(), suffix))
      continue;
    const std::string name = in.substr(0, in.size() - suffix.size());
    if (!wb.FindVar(name)) continue;
    l.split_axis[name] = op->Attr<int>("axis");
    full[name] = whole_startup.global_block().MustFindVar(in)->dims();
  }
  // Optimizer state shaped like a sharded parameter (moments, velocities, an O2 master, and
  // under gradient merge the persistable merged gradient the update reads as Grad, the updates
  // then being in the merge step's sub-block) is sharded alike; the beta powers and the learning
  // rate are not.
  std::map<std::string, VarDesc*> state_vars;
  for (int b = 0; b < l.whole->num_blocks(); ++b) {
    Block& block = l.whole->block(b);
    for (const auto& op : block.ops()) {
      const std::vector<std::string>& param = op->Input("Param");
      if (param.size() != 1 || !l.split_axis.count(param[0])) continue;
      const DDim shard = block.FindVarRecursive(param[0])->dims();
      std::vector<std::string> state;
      for (const auto& [slot, args] : op->inputs())
        if (slot != "Param" && slot != "LearningRate" && slot.find("Pow") == std::string::npos)
          state.insert(state.end(), args.begin(), args.end());
      for (const std::string& v : state) {
        VarDesc* d = block.FindVarRecursive(v);
        if (d == nullptr || !d->persistable() || d->dims() != shard) continue;
        l.split_axis[v] = l.split_axis[param[0]];
        full[v] = full[param[0]];
        state_vars[v] = d;
      }
    }
  }
  for (const auto& [name, dims] : full) {
    auto it = state_vars.find(name);
    (it != state_vars.end() ? it->second : wb.MustFindVar(name))->set_dims(dims);
  }
}

}  // namespace

void RecordModelParallelLayout(const Program& main, std::unique_ptr<Program> whole_main,
                               const Program& whole_startup, const DistributedStrategy& strategy,
                               const Role& role) {
  const Topology topo = TopologyFor(strategy, role);
  if (topo.pp_degree() == 1 && topo.tp_degree() == 1) return;
  Layout l;
  l.whole = std::move(whole_main);
  l.tp_degree = topo.tp_degree();
  l.holders.assign(static_cast<size_t>(topo.pp_degree()), {});
  for (int s = 0; s < topo.pp_degree(); ++s)
    for (int t = 0; t < l.tp_degree; ++t) l.holders[s].push_back(topo.Rank({0, s, t}));
  if (topo.pp_degree() > 1) RecordPipeline(l, whole_startup, strategy, role, topo);
  if (topo.tp_degree() > 1) RecordTensorParallel(l, whole_startup, role, topo);
  Layouts()[main.id()] = std::move(l);
}

void ForgetModelParallelLayouts() { Layouts().clear(); }

bool IsModelParallel(const Program& main) { return Find(main) != nullptr; }

const Program& WholeProgram(const Program& main) {
  const Layout* l = Find(main);
  return l ? *l->whole : main;
}

std::unique_ptr<Program> OneProcessInferenceProgram(const Program& whole,
                                                    const std::vector<std::string>& feeds,
                                                    const std::vector<std::string>& targets) {
  std::unique_ptr<Program> p = PruneForInference(whole, feeds, targets);
  Block& b = p->global_block();
  for (size_t i = 0; i < b.num_ops(); ++i) {
    const OpTraits& traits = OpRegistry::Traits(b.op(i)->type());
    if (traits.shards_model) {
      KEEL_ENFORCE(!traits.one_process_form.empty(), "save_inference_model: op ", b.op(i)->type(),
                   " of the model-parallel program has no one-process form");
      const OpDesc::VarMap ins = b.op(i)->inputs(), outs = b.op(i)->outputs();
      b.RemoveOp(i);
      OpDesc* one = b.InsertOp(i, traits.one_process_form);
      for (const auto& [slot, args] : ins) one->SetInput(slot, args);
      for (const auto& [slot, args] : outs) one->SetOutput(slot, args);
    }
    InferShapeAtBuild(b.op(i), &b);
  }
  return p;
}

CheckpointOnRankZero::CheckpointOnRankZero(Executor& exe, const Program& main)
    : sharded_(std::make_unique<ShardedStateOnRankZero>(exe, main)),
      program_(&main),
      scope_(&exe.scope()),
      skip_(pass_made_vars(main)) {
  const Layout* l = Find(main);
  if (l == nullptr) {
    RefuseUnknownLayout(main);
    return;
  }
  const int rank = role().rank;
  program_ = l->whole.get();
  skip_ = pass_made_vars(*l->whole);
  skip_.insert(l->unheld.begin(), l->unheld.end());
  if (rank == 0) scope_ = &gathered_;
  const Block& wb = l->whole->global_block();
  for (const std::string& name : Persistables(*l->whole, skip_)) {
    const int s = l->StageOf(name);
    auto split = l->split_axis.find(name);
    Tensor got;
    if (split != l->split_axis.end()) {
      // Tensor parallel: the parts of a sharded persistable, from its stage's tensor-parallel
      // group, joined along its axis.
      std::vector<Tensor> parts;
      DDim part_dims = wb.MustFindVar(name)->dims();
      part_dims[split->second] /= l->tp_degree;
      for (int t = 0; t < l->tp_degree; ++t) {
        const int from = l->Holder(s, t);
        Tensor p = rank == from ? OnCpu(exe.scope(), name, rank)
                                : Tensor(wb.MustFindVar(name)->dtype(), part_dims, CPUPlace());
        if (from != 0)
          internal::EagerBroadcast(&p, from,
                                   "fleet: gathering the tensor-parallel shards to rank 0 for a "
                                   "checkpoint ('" +
                                       name + "')");
        parts.push_back(std::move(p));
      }
      if (rank == 0) got = Join(parts, split->second);
    } else if (s != 0) {
      // Pipeline: another stage's persistable, from its holder.
      const VarDesc* d = wb.MustFindVar(name);
      const int from = l->Holder(s, 0);
      got =
          rank == from ? OnCpu(exe.scope(), name, rank) : Tensor(d->dtype(), d->dims(), CPUPlace());
      internal::EagerBroadcast(&got, from,
                               "fleet: gathering the pipeline stages' persistables to rank 0 "
                               "for a checkpoint ('" +
                                   name + "')");
    } else if (rank == 0) {
      // Rank 0's own (its stage's; a replicated parameter): shared, not copied.
      const Variable* v = exe.scope().FindVar(name);
      KEEL_ENFORCE(v != nullptr && v->tensor().initialized(), "checkpoint: rank 0 holds no '", name,
                   "' (run the startup program first)");
      got.ShareDataWith(v->tensor());
    }
    if (rank == 0) *gathered_.Var(name)->mutable_tensor() = std::move(got);
  }
}

CheckpointOnRankZero::~CheckpointOnRankZero() = default;

void LoadThisRanksPart(Executor& exe, const Program& main,
                       const std::function<void(Scope&, const Place&, const Program&,
                                                const std::set<std::string>&)>& load) {
  const Layout* l = Find(main);
  if (l == nullptr) RefuseUnknownLayout(main);
  if (l == nullptr || l->split_axis.empty()) {
    // A pipeline stage's program names the persistables it holds: it loads those (the other
    // stages' are skipped, not reported as unknown).
    std::set<std::string> skip = pass_made_vars(main);
    if (l != nullptr)
      for (const std::string& name : Persistables(*l->whole, {}))
        if (!main.global_block().FindVar(name)) skip.insert(name);
    load(exe.scope(), exe.place(), main, skip);
    return;
  }
  // Tensor parallel: the whole tensors, then this rank's parts.
  Scope whole;
  load(whole, CPUPlace(), *l->whole, pass_made_vars(*l->whole));
  for (const std::string& name : Persistables(main, pass_made_vars(main))) {
    const Variable* v = whole.FindVar(name);
    KEEL_ENFORCE(v != nullptr && v->tensor().initialized(), "checkpoint: no '", name,
                 "' was loaded for this rank's program");
    auto split = l->split_axis.find(name);
    Tensor mine = split == l->split_axis.end()
                      ? v->tensor()
                      : PartOf(v->tensor(), split->second, l->tp_rank, l->tp_degree, name);
    *exe.scope().Var(name)->mutable_tensor() = mine.Clone(exe.place());
  }
}

}  // namespace fleet
}  // namespace keel
