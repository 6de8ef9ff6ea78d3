#include "transpiler/local_sgd_pass.h"

#include <algorithm>
#include <set>
#include <vector>

#include "framework/error.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/tensor.h"
#include "transpiler/grad_allreduce_pass.h"
#include "transpiler/gradient_merge_pass.h"

namespace keel {
namespace transpiler {

namespace {

// The schedule's counters and constants (int64 [1], persistable), set up by Apply and read back
// on resume.
const char kStepVar[] = "@LOCAL_SGD_STEP@";
const char kSinceVar[] = "@LOCAL_SGD_SINCE@";
const char kWarmupVar[] = "@LOCAL_SGD_WARMUP@";
const char kKVar[] = "@LOCAL_SGD_K@";

constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);
constexpr int kForward = static_cast<int>(OpRole::kForward);

int Role(const OpDesc& op) { return op.HasAttr(kOpRoleAttr) ? op.Attr<int>(kOpRoleAttr) : 0; }

// Appends `type` to `block` with the given slots and attrs (role included), checked at build.
OpDesc* Add(Block& block, const std::string& type,
            const std::map<std::string, std::vector<std::string>>& ins,
            const std::map<std::string, std::vector<std::string>>& outs,
            std::map<std::string, Attribute> attrs, int role) {
  OpDesc* op = block.AppendOp(type);
  for (auto& kv : ins) op->SetInput(kv.first, kv.second);
  for (auto& kv : outs) op->SetOutput(kv.first, kv.second);
  for (auto& kv : attrs) op->SetAttr(kv.first, kv.second);
  op->SetAttr(kOpRoleAttr, role);
  InferShapeAtBuild(op, &block);
  return op;
}

VarDesc* Declare(Block& block, const std::string& name, DType dtype, std::vector<int64_t> shape,
                 bool persistable) {
  KEEL_ENFORCE(block.FindVar(name) == nullptr, "local_sgd: the program already has a var named '",
               name, "' (transpiled twice?)");
  VarDesc* v = block.Var(name);
  v->set_dtype(dtype);
  v->set_shape(shape);
  v->set_persistable(persistable);
  v->set_stop_gradient(true);
  return v;
}

}  // namespace

void LocalSGDPass::Apply(Program& main, Program& startup) const {
  const int nrings = options_.rings.nrings;
  KEEL_ENFORCE(nrings >= 1, "local_sgd: nccl_comm_num must be >= 1, got ", nrings);
  KEEL_ENFORCE(options_.steps >= 1, "local_sgd: local_sgd_steps must be >= 1, got ",
               options_.steps);
  KEEL_ENFORCE(options_.warmup_steps >= 0, "local_sgd: local_sgd_warmup_steps must be >= 0, got ",
               options_.warmup_steps);
  KEEL_ENFORCE(!FindGradientMerge(main),
               "local_sgd: the program merges gradients (gradient merge): LocalSGD steps each "
               "rank alone and averages parameters, which does not combine with a merge step's "
               "all-reduce of the merged gradients");
  Block& mb = main.global_block();
  bool has_optimizer = false;
  for (size_t i = 0; i < mb.num_ops(); ++i) has_optimizer |= Role(*mb.op(i)) == kOptimize;
  KEEL_ENFORCE(has_optimizer,
               "local_sgd: the main program has no optimizer ops; call minimize "
               "before transpiling");

  AppendRingsAndParamBroadcast(main, startup, options_.rings);

  // ---- the state: snapshots and counters, declared in both programs, set by startup.
  Block& sb = startup.global_block();
  std::vector<std::string> params;
  for (VarDesc* v : mb.AllVars())
    if (v->is_parameter()) params.push_back(v->name());
  KEEL_ENFORCE(!params.empty(), "local_sgd: the main program has no parameters");
  auto snapshot = [](const std::string& p) { return p + "@LOCAL_SGD_SNAPSHOT"; };
  for (const std::string& p : params) {
    const VarDesc* pv = mb.MustFindVar(p);
    for (Block* b : {&mb, &sb}) Declare(*b, snapshot(p), pv->dtype(), pv->shape(), true);
    Add(sb, "assign", {{"X", {p}}}, {{"Out", {snapshot(p)}}}, {}, kForward);
  }
  const std::string step = kStepVar, since = kSinceVar, warmup = kWarmupVar, k = kKVar;
  const std::vector<std::pair<std::string, int64_t>> counters = {
      {step, 0}, {since, 0}, {warmup, options_.warmup_steps}, {k, options_.steps}};
  for (const auto& [name, value] : counters) {
    for (Block* b : {&mb, &sb}) Declare(*b, name, DType::kInt64, {1}, true);
    Add(sb, "fill_constant", {}, {{"Out", {name}}},
        {{"shape", std::vector<int64_t>{1}},
         {"value", static_cast<float>(value)},
         {"dtype", static_cast<int>(DType::kInt64)}},
        kForward);
  }

  // ---- main: count, decide, and maybe average.
  const std::string in_warmup = "@LOCAL_SGD_IN_WARMUP@", due = "@LOCAL_SGD_DUE@",
                    sync = "@LOCAL_SGD_SYNC@";
  for (const std::string& c : {in_warmup, due, sync}) Declare(mb, c, DType::kBool, {1}, false);
  Add(mb, "increment", {{"X", {step}}}, {{"Out", {step}}}, {{"step", 1.0f}}, kOptimize);
  Add(mb, "increment", {{"X", {since}}}, {{"Out", {since}}}, {{"step", 1.0f}}, kOptimize);
  Add(mb, "less_equal", {{"X", {step}}, {"Y", {warmup}}}, {{"Out", {in_warmup}}}, {}, kOptimize);
  Add(mb, "greater_equal", {{"X", {since}}, {"Y", {k}}}, {{"Out", {due}}}, {}, kOptimize);
  Add(mb, "logical_or", {{"X", {in_warmup}}, {"Y", {due}}}, {{"Out", {sync}}}, {}, kOptimize);

  Block& avg = main.AppendBlock(0);
  std::set<int> rings;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& p = params[i];
    const int ring = static_cast<int>(i) % nrings;
    rings.insert(ring);
    Add(avg, "elementwise_sub", {{"X", {snapshot(p)}}, {"Y", {p}}}, {{"Out", {p}}}, {}, kOptimize);
    Add(avg, "c_sync_calc_stream", {{"X", {p}}}, {{"Out", {p}}}, {{"ring_id", ring}}, kOptimize);
    Add(avg, "c_allreduce_sum", {{"X", {p}}}, {{"Out", {p}}}, {{"ring_id", ring}}, kOptimize);
  }
  for (int ring : rings)
    Add(avg, "c_sync_comm_stream", {{"X", {params.back()}}}, {{"Out", {params.back()}}},
        {{"ring_id", ring}}, kOptimize);
  for (const std::string& p : params) {
    Add(avg, "scale", {{"X", {p}}}, {{"Out", {p}}},
        {{"scale", 1.0f / static_cast<float>(options_.rings.nranks)}}, kOptimize);
    Add(avg, "elementwise_sub", {{"X", {snapshot(p)}}, {"Y", {p}}}, {{"Out", {p}}}, {}, kOptimize);
    Add(avg, "assign", {{"X", {p}}}, {{"Out", {snapshot(p)}}}, {}, kOptimize);
  }
  Add(avg, "fill_constant", {}, {{"Out", {since}}},
      {{"shape", std::vector<int64_t>{1}},
       {"value", 0.0f},
       {"dtype", static_cast<int>(DType::kInt64)}},
      kOptimize);
  Add(mb, "conditional_block", {{"Cond", {sync}}}, {}, {{"sub_block", BlockRef{avg.idx()}}},
      kOptimize);
}

bool LocalSGDAveragedAfter(int64_t steps_done, int64_t warmup, int64_t k) {
  return steps_done <= warmup || k <= 1 || (steps_done - warmup) % k == 0;
}

namespace {
// The schedule's constants in `scope` (warm-up steps, k); false without LocalSGD's counters.
bool Schedule(const Scope& scope, int64_t* warmup, int64_t* k) {
  const Variable* w = scope.FindVar(kWarmupVar);
  const Variable* kv = scope.FindVar(kKVar);
  if (w == nullptr || kv == nullptr || !w->tensor().initialized() || !kv->tensor().initialized())
    return false;
  *warmup = w->tensor().Clone(CPUPlace()).data<int64_t>()[0];
  *k = kv->tensor().Clone(CPUPlace()).data<int64_t>()[0];
  return true;
}
}  // namespace

bool LocalSGDBetweenAverages(const Scope& scope, int64_t steps_done) {
  int64_t warmup = 0, k = 1;
  return Schedule(scope, &warmup, &k) && !LocalSGDAveragedAfter(steps_done, warmup, k);
}

void ResumeLocalSGDCounters(const Program& main, Scope& scope, int64_t steps_done) {
  Variable* step = scope.FindVar(kStepVar);
  Variable* since = scope.FindVar(kSinceVar);
  int64_t warmup = 0, k = 1;
  if (step == nullptr || since == nullptr || !Schedule(scope, &warmup, &k)) return;
  // An update op's persistable outputs besides ParamOut are its accumulators.
  const Block& b = main.global_block();
  for (const auto& op : b.ops()) {
    if (!op->HasOutput("ParamOut")) continue;
    const auto& params = op->Output("ParamOut");
    for (const auto& [slot, vars] : op->outputs())
      for (const std::string& v : vars) {
        const VarDesc* d = b.FindVar(v);
        KEEL_ENFORCE(slot == "ParamOut" || d == nullptr || !d->persistable() ||
                         std::find(params.begin(), params.end(), v) != params.end(),
                     "LocalSGD with ", op->type(), ": its ", slot, " (", v,
                     ") is each rank's own (LocalSGD averages parameters only) and the "
                     "checkpoint holds rank 0's, so no resume continues the interrupted run; "
                     "train with sgd to resume, or start again");
      }
  }
  KEEL_ENFORCE(LocalSGDAveragedAfter(steps_done, warmup, k), "LocalSGD (local_sgd_steps=", k,
               ", warm-up ", warmup, " steps): the checkpoint was taken after step ", steps_done,
               ", between two averages, so it holds rank 0's own parameters and no rank could "
               "resume as it was; resume from a checkpoint taken after the warm-up or after a "
               "multiple of ",
               k, " steps beyond it");
  // After the warm-up's last step SINCE is 0; it counts up to k and is reset by each average.
  const int64_t since_value = steps_done <= warmup ? 0 : (steps_done - warmup) % k;
  step->mutable_tensor()->CopyFrom(Tensor::FromVector<int64_t>({steps_done}, {1}));
  since->mutable_tensor()->CopyFrom(Tensor::FromVector<int64_t>({since_value}, {1}));
}

}  // namespace transpiler
}  // namespace keel
