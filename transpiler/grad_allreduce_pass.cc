#include "transpiler/grad_allreduce_pass.h"

#include <set>

#include "framework/op/op_registry.h"

namespace keel {
namespace transpiler {

namespace {

int Role(const OpDesc& op) { return op.HasAttr(kOpRoleAttr) ? op.Attr<int>(kOpRoleAttr) : 0; }

constexpr int kBackward = static_cast<int>(OpRole::kBackward);
constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);
constexpr int kLoss = static_cast<int>(OpRole::kLoss);

// Inserts a collective op on `var` (X = Out = var) at `index` and runs its shape inference.
OpDesc* InsertInPlace(Block& block, size_t index, const std::string& type, const std::string& var,
                      int ring, int role, std::map<std::string, Attribute> attrs = {}) {
  OpDesc* op = block.InsertOp(index, type);
  op->SetInput("X", {var});
  op->SetOutput("Out", {var});
  op->SetAttr("ring_id", ring);
  op->SetAttr(kOpRoleAttr, role);
  for (auto& kv : attrs) op->SetAttr(kv.first, kv.second);
  InferShapeAtBuild(op, &block);
  return op;
}

}  // namespace

void GradAllReducePass::Apply(Program& main, Program& startup,
                              const fleet::DistributedStrategy& strategy,
                              const fleet::Role& role) const {
  const int nrings = strategy.nccl_comm_num;
  const int nranks = role.world_size;
  KEEL_ENFORCE(nrings >= 1, "grad_allreduce: nccl_comm_num must be >= 1, got ", nrings);
  const int device = role.selected_gpus.empty() ? -1 : role.selected_gpus[0];

  // ---- startup: rings, then every parameter from rank 0.
  Block& sb = startup.global_block();
  for (int r = 0; r < nrings; ++r) {
    OpDesc* init = sb.AppendOp("c_comm_init");
    init->SetAttr("ring_id", r);
    init->SetAttr("nranks", nranks);
    init->SetAttr("rank", role.rank);
    init->SetAttr("device_id", device);
    init->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kForward));
    InferShapeAtBuild(init, &sb);
  }
  std::string last_param;
  for (VarDesc* v : main.global_block().AllVars()) {
    if (!v->is_parameter()) continue;
    KEEL_ENFORCE(sb.FindVar(v->name()) != nullptr, "grad_allreduce: parameter '", v->name(),
                 "' is not initialized by the startup program");
    InsertInPlace(sb, sb.num_ops(), "c_broadcast", v->name(), 0,
                  static_cast<int>(OpRole::kForward), {{"root", 0}});
    last_param = v->name();
  }
  if (!last_param.empty())
    InsertInPlace(sb, sb.num_ops(), "c_sync_comm_stream", last_param, 0,
                  static_cast<int>(OpRole::kForward));

  // ---- main.
  Block& mb = main.global_block();
  // Scale the loss gradient by 1/nranks where it is filled.
  bool scaled = false;
  for (size_t i = 0; i < mb.num_ops() && !scaled; ++i) {
    const OpDesc& op = *mb.op(i);
    if (Role(op) != (kBackward | kLoss)) continue;
    const std::string& g = op.Output("Out")[0];
    OpDesc* s = mb.InsertOp(i + 1, "scale");
    s->SetInput("X", {g});
    s->SetOutput("Out", {g});
    s->SetAttr("scale", 1.0f / static_cast<float>(nranks));
    s->SetAttr(kOpRoleAttr, kBackward | kLoss);
    InferShapeAtBuild(s, &mb);
    scaled = true;
  }
  KEEL_ENFORCE(scaled, "grad_allreduce: the main program has no loss-gradient op; call "
                       "minimize (append_backward) before transpiling");

  // All-reduce each gradient right after its last writer.
  int grad_count = 0;
  std::set<int> rings_used;
  for (size_t i = 0; i < mb.num_ops(); ++i) {
    const OpDesc& op = *mb.op(i);
    if (Role(op) != kBackward || !op.HasAttr(kOpRoleVarAttr)) continue;
    const auto pairs = op.Attr<std::vector<std::string>>(kOpRoleVarAttr);
    KEEL_ENFORCE(pairs.size() % 2 == 0, "grad_allreduce: op ", op.type(),
                 " has an odd op_role_var list");
    size_t at = i + 1;
    for (size_t k = 0; k < pairs.size(); k += 2) {
      const std::string& grad = pairs[k + 1];
      int ring = grad_count++ % nrings;
      rings_used.insert(ring);
      InsertInPlace(mb, at++, "c_sync_calc_stream", grad, ring, kBackward);
      InsertInPlace(mb, at++, "c_allreduce_sum", grad, ring, kBackward);
    }
    i = at - 1;
  }

  // Wait for the rings before the first optimizer op.
  for (size_t i = 0; i < mb.num_ops(); ++i) {
    if (Role(*mb.op(i)) != kOptimize) continue;
    const auto& grad = mb.op(i)->Input("Grad");
    const std::string var = grad.empty() ? mb.op(i)->InputArgumentNames().front() : grad[0];
    for (int ring : rings_used) InsertInPlace(mb, i++, "c_sync_comm_stream", var, ring, kBackward);
    break;
  }
}

}  // namespace transpiler
}  // namespace keel
