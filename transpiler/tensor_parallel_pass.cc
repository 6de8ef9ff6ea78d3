#include "transpiler/tensor_parallel_pass.h"

#include <set>

#include "framework/op/op_registry.h"
#include "transpiler/amp_pass.h"
#include "transpiler/overflow_flag.h"

namespace keel {
namespace transpiler {

namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void CheckDegree(const Program& p, const char* which, int degree) {
  for (int b = 0; b < p.num_blocks(); ++b)
    for (const auto& op : p.block(b).ops()) {
      if (op->type() != "c_split" && op->type() != "c_concat") continue;
      const int n = op->Attr<int>("nranks");
      KEEL_ENFORCE(n == degree, "tensor_parallel: op ", op->type(), " of '", op->Input("X")[0],
                   "' in the ", which, " program has nranks=", n,
                   " but tensor_parallel_degree=", degree,
                   " (build the model inside a TensorParallelGuard of the strategy's degree)");
      KEEL_ENFORCE(op->Attr<int>("ring_id") == kTensorParallelRingId, "tensor_parallel: op ",
                   op->type(), " of '", op->Input("X")[0], "' in the ", which,
                   " program is on ring ", op->Attr<int>("ring_id"),
                   ", not the tensor-parallel ring ", kTensorParallelRingId);
    }
}

}  // namespace

void TensorParallelPass::Apply(Program& main, Program& startup) const {
  const TensorParallelOptions& o = options_;
  KEEL_ENFORCE(o.degree >= 2, "tensor_parallel: degree ", o.degree, " must be >= 2");
  CheckDegree(main, "main", o.degree);
  CheckDegree(startup, "startup", o.degree);
  for (int b = 0; b < main.num_blocks(); ++b)
    for (const auto& op : main.block(b).ops())
      if (op->type() == "c_identity" || op->type() == "mp_allreduce_sum")
        KEEL_ENFORCE(op->Attr<int>("ring_id") == kTensorParallelRingId, "tensor_parallel: op ",
                     op->type(), " of '", op->Input("X")[0], "' is on ring ",
                     op->Attr<int>("ring_id"), ", not the tensor-parallel ring ",
                     kTensorParallelRingId);
  Block& sb = startup.global_block();
  // Sharded: what startup's c_split of a full value writes (under AMP O2 the parameter's
  // float32 master, which startup then casts into the parameter).
  std::set<std::string> sharded;
  const std::string master_suffix = AmpMasterName("");
  for (const auto& op : sb.ops())
    if (op->type() == "c_split" && EndsWith(op->Input("X")[0], "@TP_FULL")) {
      const std::string& out = op->Output("Out")[0];
      sharded.insert(out);
      if (EndsWith(out, master_suffix))
        sharded.insert(out.substr(0, out.size() - master_suffix.size()));
    }
  const int fwd = static_cast<int>(OpRole::kForward);
  OpDesc* init = sb.AppendOp("c_comm_init");
  init->SetAttr("ring_id", kTensorParallelRingId);
  init->SetAttr("nranks", o.degree);
  init->SetAttr("rank", o.rank);
  init->SetAttr("device_id", o.device);
  init->SetAttr("group", o.group);
  init->SetAttr(kOpRoleAttr, fwd);
  InferShapeAtBuild(init, &sb);
  std::string last;
  for (VarDesc* v : main.global_block().AllVars()) {
    if (!v->is_parameter() || sharded.count(v->name())) continue;
    KEEL_ENFORCE(sb.FindVar(v->name()) != nullptr, "tensor_parallel: parameter '", v->name(),
                 "' is not initialized by the startup program");
    // AMP O2: the float32 master first, then the 16-bit parameter.
    const std::string master = AmpMasterName(v->name());
    for (const std::string& name : {master, v->name()}) {
      if (name == master && sb.FindVar(master) == nullptr) continue;
      OpDesc* bc = sb.AppendOp("c_broadcast");
      bc->SetInput("X", {name});
      bc->SetOutput("Out", {name});
      bc->SetAttr("ring_id", kTensorParallelRingId);
      bc->SetAttr("root", 0);
      bc->SetAttr(kOpRoleAttr, fwd);
      InferShapeAtBuild(bc, &sb);
    }
    last = v->name();
  }
  // AMP's loss scaling: the ranks of a group check different shards of the sharded parameters'
  // gradients, so the overflow flag is the maximum over the group (every rank skips alike).
  // (Under gradient merge the check is in the merge step's sub-block.)
  for (int b = 0; b < main.num_blocks(); ++b) {
    Block& mb = main.block(b);
    for (size_t i = 0; i < mb.num_ops(); ++i) {
      const OpDesc& op = *mb.op(i);
      if (op.type() != "check_finite_and_unscale") continue;
      const int role = op.HasAttr(kOpRoleAttr) ? op.Attr<int>(kOpRoleAttr) : 0;
      i = InsertOverflowFlagMax(mb, i + 1, op.Output("FoundInfinite")[0], kTensorParallelRingId,
                                role) -
          1;
    }
  }
  if (!last.empty()) {
    OpDesc* sync = sb.AppendOp("c_sync_comm_stream");
    sync->SetInput("X", {last});
    sync->SetOutput("Out", {last});
    sync->SetAttr("ring_id", kTensorParallelRingId);
    sync->SetAttr(kOpRoleAttr, fwd);
    InferShapeAtBuild(sync, &sb);
  }
}

}  // namespace transpiler
}  // namespace keel
