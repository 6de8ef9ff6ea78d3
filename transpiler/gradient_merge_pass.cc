#include "transpiler/gradient_merge_pass.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "framework/error.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/tensor.h"
#include "transpiler/tensor_parallel_pass.h"

namespace keel {
namespace transpiler {

namespace {

constexpr int kBackward = static_cast<int>(OpRole::kBackward);
constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);
constexpr int kForward = static_cast<int>(OpRole::kForward);

// k, filled every run (not persistable: a checkpoint does not pin the k it was taken with).
const char kKVar[] = "@GRADIENT_MERGE_K@";

int Role(const OpDesc& op) { return op.HasAttr(kOpRoleAttr) ? op.Attr<int>(kOpRoleAttr) : 0; }

using Slots = std::map<std::string, std::vector<std::string>>;

// Inserts `type` at `at` in `block` with the given slots and attrs (role included), checked at
// build.
OpDesc* Insert(Block& block, size_t at, const std::string& type, const Slots& ins,
               const Slots& outs, std::map<std::string, Attribute> attrs, int role) {
  OpDesc* op = block.InsertOp(at, type);
  for (auto& kv : ins) op->SetInput(kv.first, kv.second);
  for (auto& kv : outs) op->SetOutput(kv.first, kv.second);
  for (auto& kv : attrs) op->SetAttr(kv.first, kv.second);
  op->SetAttr(kOpRoleAttr, role);
  InferShapeAtBuild(op, &block);
  return op;
}

OpDesc* Append(Block& block, const std::string& type, const Slots& ins, const Slots& outs,
               std::map<std::string, Attribute> attrs, int role) {
  return Insert(block, block.num_ops(), type, ins, outs, std::move(attrs), role);
}

VarDesc* Declare(Block& block, const std::string& name, DType dtype, std::vector<int64_t> shape,
                 bool persistable) {
  KEEL_ENFORCE(block.FindVar(name) == nullptr,
               "gradient_merge: the program already has a var named '", name,
               "' (transpiled twice?)");
  VarDesc* v = block.Var(name);
  v->set_dtype(dtype);
  v->set_shape(shape);
  v->set_persistable(persistable);
  v->set_stop_gradient(true);
  return v;
}

std::map<std::string, Attribute> Int64Fill(float value) {
  return {{"shape", std::vector<int64_t>{1}},
          {"value", value},
          {"dtype", static_cast<int>(DType::kInt64)}};
}

// A schedule's rate, now computed on merge steps only, stays readable on every run: persistable
// (it survives scope drops and holds the latest step's rate), and set by startup to the rate of
// step 0, the first optimizer step's.
void KeepLearningRateBetweenSteps(const OpDesc& schedule, Block& mb, Block& sb) {
  const std::string& lr = schedule.Output("LearningRate")[0];
  VarDesc* v = mb.MustFindVar(lr);
  v->set_persistable(true);
  Declare(sb, lr, v->dtype(), v->shape(), true);
  const std::string step0 = lr + "@GRADIENT_MERGE_STEP0";
  Declare(sb, step0, DType::kFloat32, {1}, false);
  Append(sb, "fill_constant", {}, {{"Out", {step0}}},
         {{"shape", std::vector<int64_t>{1}},
          {"value", 0.0f},
          {"dtype", static_cast<int>(DType::kFloat32)}},
         kForward);
  OpDesc* first = sb.AppendOp("lr_schedule");
  *first = schedule;
  first->SetInput("Step", {step0});
  first->SetAttr(kOpRoleAttr, kForward);
  InferShapeAtBuild(first, &sb);
}

}  // namespace

void GradientMergePass::Apply(Program& main, Program& startup) const {
  const int k = options_.k_steps;
  KEEL_ENFORCE(k >= 1, "gradient_merge: k_steps must be >= 1, got ", k);
  KEEL_ENFORCE(main.num_blocks() == 1, "gradient_merge: the main program already has ",
               main.num_blocks() - 1,
               " sub-block(s); gradient merge rewrites the program minimize made, before any "
               "pass that adds blocks (LocalSGD) and before the data-parallel pass");
  Block& mb = main.global_block();
  std::vector<size_t> moved;
  std::set<std::string> read_by_optimizer;
  for (size_t i = 0; i < mb.num_ops(); ++i) {
    const OpDesc& op = *mb.op(i);
    const OpSchema* schema = OpRegistry::Find(op.type());
    // The model's own tensor-parallel collectives run every micro-step, as the model does.
    const bool tensor_parallel =
        op.HasAttr("ring_id") && op.Attr<int>("ring_id") == kTensorParallelRingId;
    KEEL_ENFORCE(schema == nullptr || !schema->traits().on_ring || tensor_parallel,
                 "gradient_merge: op #", i, " ", op.type(),
                 " is a collective: the program is already data-parallel; gradient merge runs "
                 "before GradAllReducePass, which then all-reduces the merged gradients once per ",
                 "merge step");
    if (Role(op) != kOptimize) continue;
    moved.push_back(i);
    for (const std::string& in : op.InputArgumentNames()) read_by_optimizer.insert(in);
  }
  KEEL_ENFORCE(!moved.empty(),
               "gradient_merge: the main program has no optimizer ops; call minimize (or "
               "apply_gradients) before gradient merge");

  // The parameter gradients the optimizer reads, in the order backward produces them.
  std::vector<std::pair<std::string, std::string>> grads;  // (param, grad)
  std::set<std::string> seen;
  for (size_t i = 0; i < mb.num_ops(); ++i) {
    const OpDesc& op = *mb.op(i);
    if (Role(op) != kBackward || !op.HasAttr(kOpRoleVarAttr)) continue;
    const auto& pairs = op.Attr<std::vector<std::string>>(kOpRoleVarAttr);
    KEEL_ENFORCE(pairs.size() % 2 == 0, "gradient_merge: op #", i, " ", op.type(),
                 " has an odd op_role_var list");
    for (size_t p = 0; p < pairs.size(); p += 2)
      if (read_by_optimizer.count(pairs[p + 1]) && seen.insert(pairs[p + 1]).second)
        grads.emplace_back(pairs[p], pairs[p + 1]);
  }
  KEEL_ENFORCE(!grads.empty(),
               "gradient_merge: no optimizer op reads a parameter gradient that backward marks "
               "(op_role_var); call minimize before gradient merge");
  auto merged = [](const std::string& g) { return g + kGradientMergeSuffix; };

  // ---- state: a zeroed buffer per gradient and the counter, in main and startup.
  Block& sb = startup.global_block();
  for (const auto& [param, g] : grads) {
    const VarDesc* gv = mb.MustFindVar(g);
    KEEL_ENFORCE(gv->dtype() == DType::kFloat32 || gv->dtype() == DType::kFloat64,
                 "gradient_merge: gradient '", g, "' of '", param, "' is ", DTypeName(gv->dtype()),
                 "; merged gradients are float32 or float64");
    KEEL_ENFORCE(gv->dims().known(), "gradient_merge: gradient '", g, "' has shape ",
                 gv->dims().str(), "; a merge buffer needs a known shape");
    for (Block* b : {&mb, &sb}) Declare(*b, merged(g), gv->dtype(), gv->shape(), true);
    Append(sb, "fill_constant", {}, {{"Out", {merged(g)}}},
           {{"shape", gv->shape()}, {"value", 0.0f}, {"dtype", static_cast<int>(gv->dtype())}},
           kForward);
  }
  const std::string step = kGradientMergeStepVar, cond = kGradientMergeCondVar;
  for (Block* b : {&mb, &sb}) Declare(*b, step, DType::kInt64, {1}, true);
  Append(sb, "fill_constant", {}, {{"Out", {step}}}, Int64Fill(0), kForward);
  Declare(mb, kKVar, DType::kInt64, {1}, false);
  Declare(mb, cond, DType::kBool, {1}, false);

  // ---- the optimizer section moves to a sub-block, reading the merged gradients.
  const size_t at = moved.front();
  std::vector<std::unique_ptr<OpDesc>> section;
  for (size_t i : moved) section.push_back(std::make_unique<OpDesc>(*mb.op(i)));
  for (size_t n = moved.size(); n-- > 0;) mb.RemoveOp(moved[n]);
  Block& sub = main.AppendBlock(0);
  if (options_.avg)
    for (const auto& pg : grads)
      Append(sub, "scale", {{"X", {merged(pg.second)}}}, {{"Out", {merged(pg.second)}}},
             {{"scale", static_cast<float>(1.0 / k)}}, kOptimize);
  for (auto& op : section) {
    if (op->type() == "lr_schedule") KeepLearningRateBetweenSteps(*op, mb, sb);
    for (const auto& pg : grads) {
      op->RenameInput(pg.second, merged(pg.second));
      op->RenameOutput(pg.second, merged(pg.second));
    }
    if (op->HasAttr(kOpRoleVarAttr)) {
      auto vars = op->Attr<std::vector<std::string>>(kOpRoleVarAttr);
      for (std::string& v : vars)
        if (seen.count(v)) v = merged(v);
      op->SetAttr(kOpRoleVarAttr, vars);
    }
    sub.InsertOp(sub.num_ops(), std::move(op));
  }
  for (const auto& pg : grads)
    Append(sub, "fill_zeros_like", {{"X", {merged(pg.second)}}}, {{"Out", {merged(pg.second)}}}, {},
           kOptimize);
  Append(sub, "fill_constant", {}, {{"Out", {step}}}, Int64Fill(0), kOptimize);

  // ---- block 0: accumulate, count, decide, and maybe step.
  size_t pos = at;
  for (const auto& pg : grads)
    Insert(mb, pos++, "sum", {{"X", {merged(pg.second), pg.second}}},
           {{"Out", {merged(pg.second)}}}, {}, kBackward);
  Insert(mb, pos++, "increment", {{"X", {step}}}, {{"Out", {step}}}, {{"step", 1.0f}}, kOptimize);
  Insert(mb, pos++, "fill_constant", {}, {{"Out", {kKVar}}}, Int64Fill(static_cast<float>(k)),
         kOptimize);
  Insert(mb, pos++, "greater_equal", {{"X", {step}}, {"Y", {kKVar}}}, {{"Out", {cond}}}, {},
         kOptimize);
  std::vector<std::string> role_var;
  for (const auto& pg : grads) role_var.insert(role_var.end(), {pg.first, merged(pg.second)});
  Insert(mb, pos, "conditional_block", {{"Cond", {cond}}}, {},
         {{"sub_block", BlockRef{sub.idx()}}, {kOpRoleVarAttr, role_var}}, kOptimize);
}

std::optional<GradientMergeInfo> FindGradientMerge(const Program& main) {
  const Block& b = main.global_block();
  for (size_t i = 0; i < b.num_ops(); ++i) {
    const OpDesc& op = *b.op(i);
    if (op.type() != "conditional_block" ||
        op.Input("Cond") != std::vector<std::string>{kGradientMergeCondVar})
      continue;
    GradientMergeInfo info;
    info.op = i;
    info.block = op.Attr<BlockRef>("sub_block").idx;
    const auto& vars = op.HasAttr(kOpRoleVarAttr)
                           ? op.Attr<std::vector<std::string>>(kOpRoleVarAttr)
                           : std::vector<std::string>{};
    KEEL_ENFORCE(vars.size() % 2 == 0, "gradient merge's conditional_block (op #", i,
                 ") has an odd op_role_var list");
    for (size_t p = 0; p < vars.size(); p += 2) info.merged.emplace_back(vars[p], vars[p + 1]);
    return info;
  }
  return std::nullopt;
}

int64_t GradientMergeRunsAccumulated(const Scope& scope) {
  const Variable* v = scope.FindVar(kGradientMergeStepVar);
  if (v == nullptr || !v->tensor().initialized()) return 0;
  return v->tensor().Clone(CPUPlace()).data<int64_t>()[0];
}

}  // namespace transpiler
}  // namespace keel
