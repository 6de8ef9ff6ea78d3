#include "transpiler/pipeline_pass.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "framework/ir/op_device.h"
#include "framework/op/op_registry.h"
#include "transpiler/overflow_flag.h"
#include "transpiler/tensor_parallel_pass.h"

namespace keel {
namespace transpiler {

namespace {

constexpr int kBackward = static_cast<int>(OpRole::kBackward);
constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);
constexpr int kLoss = static_cast<int>(OpRole::kLoss);

// AMP's overflow check (loss scaling): one per program, over every gradient.
constexpr const char* kOverflowCheck = "check_finite_and_unscale";

// The model's own collectives, which a stage keeps and runs per micro-batch: the tensor-parallel
// ones (each stage's group runs them) and sync batch norm's (each stage's data-parallel
// replicas normalize each micro-batch together).
bool ModelsOwnCollective(const OpDesc& op) {
  if (op.type() == "sync_batch_norm" || op.type() == "sync_batch_norm_grad") return true;
  return op.HasAttr("ring_id") && op.Attr<int>("ring_id") == kTensorParallelRingId;
}

int Role(const OpDesc& op) { return op.HasAttr(kOpRoleAttr) ? op.Attr<int>(kOpRoleAttr) : 0; }

// "x@GRAD@RENAME@1" -> "x"; "" for a var that is no gradient.
std::string ForwardOf(const std::string& v) {
  const size_t p = v.find("@GRAD");
  return p == std::string::npos ? std::string() : v.substr(0, p);
}

std::string Describe(const OpDesc& op) {
  const std::vector<std::string> outs = op.OutputArgumentNames();
  return StrCat("op ", op.type(), outs.empty() ? "" : StrCat(" (writing ", outs[0], ")"));
}

std::string StageList(const std::set<int>& s) {
  std::string out;
  for (int x : s) out += StrCat(out.empty() ? "" : ", ", x);
  return out;
}

// One var's trip from the stage that writes it (at op `at`) to the farthest stage that reads it,
// through every stage between.
struct Transfer {
  size_t at;
  std::string var;
  std::vector<int> chain;  // stages, writer first
  int role;
};

}  // namespace

int ParsePipelineStage(const std::string& op_device) {
  const std::string prefix = "stage:";
  if (op_device.rfind(prefix, 0) != 0 || op_device.size() == prefix.size() ||
      op_device.size() > prefix.size() + 6)
    return -1;
  for (size_t i = prefix.size(); i < op_device.size(); ++i)
    if (op_device[i] < '0' || op_device[i] > '9') return -1;
  return std::atoi(op_device.c_str() + prefix.size());
}

std::vector<std::string> PipelineAccumulators(const Block& main) {
  std::vector<std::string> accs;
  const std::string suffix = kPipelineAccSuffix;
  for (const auto& op : main.ops()) {
    if (op->type() != "sum" || op->Output("Out").empty()) continue;
    const std::string& out = op->Output("Out")[0];
    if (out.size() > suffix.size() &&
        out.compare(out.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        op->Input("X").front() == out)
      accs.push_back(out);
  }
  return accs;
}

void PipelinePass::Apply(Program& main, Program& startup) const {
  const PipelineOptions& o = options_;
  const int S = o.degree;
  KEEL_ENFORCE(S >= 2, "pipeline: degree ", S, " must be >= 2");
  KEEL_ENFORCE(o.stage >= 0 && o.stage < S, "pipeline: stage ", o.stage, " outside [0, ", S, ")");
  KEEL_ENFORCE(o.micro_batches >= 1, "pipeline: micro_batches ", o.micro_batches, " must be >= 1");
  KEEL_ENFORCE(main.num_blocks() == 1,
               "pipeline: the main program has sub-blocks (control flow, gradient merge), which "
               "the stage cut does not handle");
  Block& b = main.global_block();
  const size_t n = b.num_ops();
  auto persistable = [&](const std::string& v) {
    const VarDesc* d = b.FindVar(v);
    return d != nullptr && d->persistable();
  };

  // 1. Every op's stages. `home`: where a var lives.
  std::vector<std::set<int>> where(n);
  std::map<std::string, int> home;
  std::set<int> marked;
  for (size_t i = 0; i < n; ++i) {
    const OpDesc& op = *b.op(i);
    KEEL_ENFORCE(!OpRegistry::Traits(op.type()).on_ring || ModelsOwnCollective(op),
                 "pipeline: ", Describe(op),
                 " is a collective; the pipeline pass runs before the data-parallel passes");
    if (Role(op) & (kBackward | kOptimize)) continue;
    KEEL_ENFORCE(op.HasAttr(kOpDeviceAttr), "pipeline: forward ", Describe(op),
                 " is outside every stage: build every forward op inside a PipelineStageGuard");
    const std::string& mark = op.Attr<std::string>(kOpDeviceAttr);
    const int s = ParsePipelineStage(mark);
    KEEL_ENFORCE(s >= 0 && s < S, "pipeline: ", Describe(op), " is marked '", mark,
                 "', outside the stages 0..", S - 1,
                 " of DistributedStrategy.pipeline_configs.pp_degree=", S);
    where[i] = {s};
    marked.insert(s);
    for (const std::string& in : op.InputArgumentNames()) {
      const VarDesc* v = b.FindVar(in);
      if (v == nullptr) continue;
      auto it = home.find(in);
      if (it == home.end()) {
        home[in] = s;  // a parameter or data var lives where it is first read
      } else if (v->is_parameter()) {
        KEEL_ENFORCE(it->second == s, "pipeline: parameter '", in, "' is read by stages ",
                     it->second, " and ", s, " (", Describe(op),
                     "); a parameter must belong to one stage (shared weights are not built)");
      } else if (!v->persistable()) {
        KEEL_ENFORCE(it->second <= s, "pipeline: '", in, "' is made on stage ", it->second,
                     " but read by ", Describe(op), " on the earlier stage ", s,
                     ": stages must follow the forward order");
      }
    }
    for (const std::string& out : op.OutputArgumentNames())
      if (out != kEmptyVarName) home[out] = s;
  }
  KEEL_ENFORCE(static_cast<int>(marked.size()) == S, "pipeline: the model's ops are marked with ",
               "stages {", StageList(marked), "}, but DistributedStrategy.pipeline_configs.",
               "pp_degree=", S, " needs every stage 0..", S - 1, " to hold ops");
  for (size_t i = 0; i < n; ++i) {
    const OpDesc& op = *b.op(i);
    if (!(Role(op) & kBackward) || (Role(op) & kOptimize)) continue;
    int s =
        op.HasAttr(kOpDeviceAttr) ? ParsePipelineStage(op.Attr<std::string>(kOpDeviceAttr)) : -1;
    for (const std::string& out : op.OutputArgumentNames()) {
      if (s >= 0) break;
      auto it = home.find(ForwardOf(out));
      if (it != home.end()) s = it->second;
    }
    if (s < 0) {
      for (const std::string& in : op.InputArgumentNames()) {
        auto it = home.find(in);
        if (it != home.end()) s = std::max(s, it->second);
      }
    }
    KEEL_ENFORCE(s >= 0 && s < S, "pipeline: cannot place backward ", Describe(op), " on a stage");
    where[i] = {s};
    for (const std::string& out : op.OutputArgumentNames())
      if (out != kEmptyVarName && !home.count(out)) home[out] = s;
  }
  // Optimizer ops, last first: an op without a Param runs on every stage that reads its outputs.
  std::map<std::string, std::set<int>> read_later;
  for (size_t i = n; i-- > 0;) {
    const OpDesc& op = *b.op(i);
    if (!(Role(op) & kOptimize)) {
      for (const std::string& in : op.InputArgumentNames())
        read_later[in].insert(where[i].begin(), where[i].end());
      continue;
    }
    if (op.HasInput("Param")) {
      const std::string& p = op.Input("Param")[0];
      auto it = home.find(p);
      KEEL_ENFORCE(it != home.end(), "pipeline: ", Describe(op), " updates '", p,
                   "', which no forward op reads");
      where[i] = {it->second};
    } else {
      for (const std::string& out : op.OutputArgumentNames()) {
        auto it = read_later.find(out);
        if (it != read_later.end()) where[i].insert(it->second.begin(), it->second.end());
      }
      if (where[i].empty())
        for (int s = 0; s < S; ++s) where[i].insert(s);
    }
    for (const std::string& in : op.InputArgumentNames())
      read_later[in].insert(where[i].begin(), where[i].end());
  }

  // 2. Transfers: a non-persistable var written on one stage and read on others before its next
  //    write travels along the chain of stages from the writer to the farthest reader.
  std::vector<Transfer> transfers;
  {
    std::map<std::string, size_t> last_write;                         // var -> op
    std::map<std::pair<size_t, std::string>, std::set<int>> readers;  // (op, var) -> stages
    for (size_t i = 0; i < n; ++i) {
      const OpDesc& op = *b.op(i);
      // The overflow check runs on every stage over that stage's gradients (step 3).
      const bool per_stage = op.type() == kOverflowCheck;
      for (const std::string& in : op.InputArgumentNames()) {
        auto w = last_write.find(in);
        if (w == last_write.end() || persistable(in)) continue;
        if (per_stage && in != op.Input("Scale")[0]) continue;
        for (int t : where[i]) {
          if (where[w->second].count(t)) continue;
          KEEL_ENFORCE(where[w->second].size() == 1 && !(Role(op) & kOptimize),
                       "pipeline: ", Describe(op), " on stages {", StageList(where[i]), "} reads '",
                       in, "' of stage(s) {", StageList(where[w->second]),
                       "}: an optimizer op over several stages' values (a global-norm clip) is "
                       "not built");
          readers[{w->second, in}].insert(t);
        }
      }
      for (const std::string& out : op.OutputArgumentNames())
        if (out != kEmptyVarName) last_write[out] = i;
    }
    for (const auto& [key, dests] : readers) {
      const int from = *where[key.first].begin();
      const int lo = *dests.begin(), hi = *dests.rbegin();
      KEEL_ENFORCE(lo > from || hi < from, "pipeline: '", key.second, "' of stage ", from,
                   " is read by the stages {", StageList(dests),
                   "}, before and after it: a var must flow one way");
      Transfer t{key.first, key.second, {}, Role(*b.op(key.first)) & ~kLoss};
      for (int s = from; s != (lo > from ? hi : lo); s += lo > from ? 1 : -1) t.chain.push_back(s);
      t.chain.push_back(lo > from ? hi : lo);
      transfers.push_back(std::move(t));
    }
    std::stable_sort(transfers.begin(), transfers.end(),
                     [](const Transfer& a, const Transfer& c) { return a.at < c.at; });
  }
  std::map<std::string, int> tags;
  for (const Transfer& t : transfers) tags.emplace(t.var, static_cast<int>(tags.size()));

  // 3. This stage's ops, with its sends and receives at the writers' positions.
  const int me = o.stage;
  std::vector<std::unique_ptr<OpDesc>> kept;
  size_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    if (where[i].count(me)) kept.push_back(std::make_unique<OpDesc>(*b.op(i)));
    for (; next < transfers.size() && transfers[next].at == i; ++next) {
      const Transfer& t = transfers[next];
      auto pos = std::find(t.chain.begin(), t.chain.end(), me);
      if (pos == t.chain.end()) continue;
      const VarDesc& v = *b.MustFindVar(t.var);
      if (pos != t.chain.begin()) {
        auto r = std::make_unique<OpDesc>("recv_v2");
        r->SetOutput("Out", {t.var});
        std::vector<int64_t> shape = v.shape();
        if (!shape.empty() && shape[0] < 0 && o.micro_batch_size > 0) shape[0] = o.micro_batch_size;
        r->SetAttr("ring_id", kPipelineRingId);
        r->SetAttr("peer", *(pos - 1));
        r->SetAttr("tag", tags.at(t.var));
        r->SetAttr("out_shape", shape);
        r->SetAttr("dtype", static_cast<int>(v.dtype()));
        r->SetAttr(kOpRoleAttr, t.role);
        kept.push_back(std::move(r));
      }
      if (pos + 1 != t.chain.end()) {
        auto s = std::make_unique<OpDesc>("send_v2");
        s->SetInput("X", {t.var});
        s->SetAttr("ring_id", kPipelineRingId);
        s->SetAttr("peer", *(pos + 1));
        s->SetAttr("tag", tags.at(t.var));
        s->SetAttr(kOpRoleAttr, t.role);
        kept.push_back(std::move(s));
      }
    }
  }
  b.RemoveOps(0, n);
  for (auto& op : kept) {
    OpDesc* added = b.InsertOp(b.num_ops(), std::move(op));
    if (added->type() == "send_v2" || added->type() == "recv_v2") InferShapeAtBuild(added, &b);
  }
  // AMP's overflow check sees this stage's gradients; its flag is the maximum over the stages,
  // so that every stage skips the same steps and moves the loss scale alike.
  for (size_t i = 0; i < b.num_ops(); ++i) {
    OpDesc* op = b.op(i);
    if (op->type() != kOverflowCheck) continue;
    std::vector<std::string> own;
    for (const std::string& g : op->Input("X"))
      if (home.count(g) && home.at(g) == me) own.push_back(g);
    const std::string found = op->Output("FoundInfinite")[0];
    const int role = Role(*op);
    if (own.empty()) {
      b.RemoveOp(i);
      i = InsertOverflowFlagMax(b, i, found, kPipelineRingId, role, /*local_false=*/true) - 1;
      continue;
    }
    op->SetInput("X", own);
    op->SetOutput("Out", own);
    InferShapeAtBuild(op, &b);
    i = InsertOverflowFlagMax(b, i + 1, found, kPipelineRingId, role) - 1;
  }

  // 4. The loss gradient: each micro-batch's mean loss counts 1/M of the mini-batch's.
  for (size_t i = 0; i < b.num_ops(); ++i) {
    OpDesc* op = b.op(i);
    if (Role(*op) != (kBackward | kLoss) || op->type() != "fill_constant") continue;
    op->SetAttr("value", op->Attr<float>("value") / static_cast<float>(o.micro_batches));
  }

  // 5. Gradient accumulators: summed every micro-batch, read by the optimizer, zeroed after it.
  std::vector<std::string> grads;  // this stage's, in optimizer order
  size_t first_opt = b.num_ops();
  for (size_t i = 0; i < b.num_ops(); ++i) {
    const OpDesc& op = *b.op(i);
    if (!(Role(op) & kOptimize)) continue;
    first_opt = std::min(first_opt, i);
    if (op.HasInput("Grad") &&
        std::find(grads.begin(), grads.end(), op.Input("Grad")[0]) == grads.end())
      grads.push_back(op.Input("Grad")[0]);
  }
  Block& sb = startup.global_block();
  for (const std::string& g : grads) {
    const VarDesc& gv = *b.MustFindVar(g);
    const std::string acc = g + kPipelineAccSuffix;
    VarDesc* a = b.Var(acc);
    a->set_dtype(gv.dtype());
    a->set_shape(gv.shape());
    a->set_persistable(true);
    KEEL_ENFORCE(
        std::all_of(gv.shape().begin(), gv.shape().end(), [](int64_t d) { return d >= 0; }),
        "pipeline: gradient '", g,
        "' has an unknown dim, so its accumulator cannot be "
        "allocated in startup");
    size_t last = first_opt;
    for (size_t i = 0; i < first_opt; ++i) {
      const auto outs = b.op(i)->OutputArgumentNames();
      if (std::find(outs.begin(), outs.end(), g) != outs.end()) last = i;
    }
    KEEL_ENFORCE(last < first_opt, "pipeline: no backward op of stage ", me, " writes '", g,
                 "', which its optimizer reads");
    OpDesc* sum = b.InsertOp(last + 1, "sum");
    sum->SetInput("X", {acc, g});
    sum->SetOutput("Out", {acc});
    sum->SetAttr(kOpRoleAttr, kBackward);
    InferShapeAtBuild(sum, &b);
    ++first_opt;
    for (size_t i = first_opt; i < b.num_ops(); ++i) {
      OpDesc* op = b.op(i);
      if (!(Role(*op) & kOptimize)) continue;
      op->RenameInput(g, acc);
      op->RenameOutput(g, acc);
      if (op->HasAttr(kOpRoleVarAttr)) {
        std::vector<std::string> rv = op->Attr<std::vector<std::string>>(kOpRoleVarAttr);
        std::replace(rv.begin(), rv.end(), g, acc);
        op->SetAttr(kOpRoleVarAttr, rv);
      }
    }
    OpDesc* zero = b.AppendOp("fill_zeros_like");
    zero->SetInput("X", {acc});
    zero->SetOutput("Out", {acc});
    zero->SetAttr(kOpRoleAttr, kOptimize);
    InferShapeAtBuild(zero, &b);
  }

  // 6. Vars no kept op uses leave main; startup keeps what makes the vars main reads.
  std::set<std::string> used;
  for (const auto& op : b.ops()) {
    for (const std::string& v : op->InputArgumentNames()) used.insert(v);
    for (const std::string& v : op->OutputArgumentNames()) used.insert(v);
  }
  for (VarDesc* v : b.AllVars())
    if (!used.count(v->name())) b.RemoveVar(v->name());
  std::set<std::string> need = used;
  for (size_t i = sb.num_ops(); i-- > 0;) {
    const OpDesc& op = *sb.op(i);
    bool keep = false;
    for (const std::string& v : op.OutputArgumentNames()) keep = keep || need.count(v);
    if (!keep && op.InputArgumentNames().empty()) {
      // Another stage's initializer stays where it is, writing a temporary that the executor
      // frees at once: the initializers of this stage keep their positions, and so (with a
      // program random seed) the draws of the whole program.
      OpDesc* other = sb.op(i);
      for (const std::string& v : other->OutputArgumentNames()) {
        if (v == kEmptyVarName) continue;
        const VarDesc* d = sb.FindVar(v);
        VarDesc* t = sb.Var(v + kPipelineOtherStageSuffix);
        if (d != nullptr) {
          t->set_dtype(d->dtype());
          t->set_shape(d->shape());
        }
        other->RenameOutput(v, t->name());
      }
      continue;
    }
    if (!keep) {
      sb.RemoveOp(i);
      continue;
    }
    for (const std::string& v : op.InputArgumentNames()) need.insert(v);
  }
  std::set<std::string> startup_used;
  for (const auto& op : sb.ops()) {
    for (const std::string& v : op->InputArgumentNames()) startup_used.insert(v);
    for (const std::string& v : op->OutputArgumentNames()) startup_used.insert(v);
  }
  for (VarDesc* v : sb.AllVars())
    if (!startup_used.count(v->name())) sb.RemoveVar(v->name());
  for (const std::string& g : grads) {
    const VarDesc& a = *b.MustFindVar(g + kPipelineAccSuffix);
    VarDesc* sv = sb.Var(a.name());
    sv->set_dtype(a.dtype());
    sv->set_shape(a.shape());
    sv->set_persistable(true);
    OpDesc* fill = sb.AppendOp("fill_constant");
    fill->SetOutput("Out", {a.name()});
    fill->SetAttr("shape", a.shape());
    fill->SetAttr("value", 0.0f);
    fill->SetAttr("dtype", static_cast<int>(a.dtype()));
    InferShapeAtBuild(fill, &sb);
  }
  OpDesc* init = sb.AppendOp("c_comm_init");
  init->SetAttr("ring_id", kPipelineRingId);
  init->SetAttr("nranks", S);
  init->SetAttr("rank", me);
  init->SetAttr("device_id", o.device);
  init->SetAttr("group", o.group);
  // On GPUs the transfers go through host memory, buffered as on CPU rings: NCCL's send and
  // receive meet inside the streams, where a 1F1B schedule's crossing sends can wait on each other.
  if (o.device >= 0) init->SetAttr("host_staged", true);
  init->SetAttr(kOpRoleAttr, 0);
  InferShapeAtBuild(init, &sb);
  main.Touch();
  startup.Touch();
}

}  // namespace transpiler
}  // namespace keel
