#include "transpiler/sharding_pass.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "framework/op/op_registry.h"
#include "transpiler/flat_buffer.h"
#include "transpiler/grad_allreduce_pass.h"
#include "transpiler/overflow_flag.h"
#include "transpiler/pipeline_pass.h"

namespace keel {
namespace transpiler {

namespace {

constexpr int kBackward = static_cast<int>(OpRole::kBackward);
constexpr int kOptimize = static_cast<int>(OpRole::kOptimize);
constexpr int kLoss = static_cast<int>(OpRole::kLoss);

int Role(const OpDesc& op) { return op.HasAttr(kOpRoleAttr) ? op.Attr<int>(kOpRoleAttr) : 0; }

// The parameter an optimizer-section op belongs to (op_role_var = [param, grad]), or "" for an op
// of several parameters (global-norm clipping, a merged update) or of none.
std::string UpdatedParam(const OpDesc& op) {
  if (!(Role(op) & kOptimize) || !op.HasAttr(kOpRoleVarAttr)) return "";
  const auto pairs = op.Attr<std::vector<std::string>>(kOpRoleVarAttr);
  return pairs.size() == 2 ? pairs[0] : "";
}

OpDesc* InsertOp(Block& b, size_t at, const std::string& type, const std::string& x,
                 const std::string& out, int role, std::map<std::string, Attribute> attrs = {}) {
  OpDesc* op = b.InsertOp(at, type);
  op->SetInput("X", {x});
  op->SetOutput("Out", {out});
  op->SetAttr("ring_id", 0);
  op->SetAttr(kOpRoleAttr, role);
  for (auto& kv : attrs) op->SetAttr(kv.first, kv.second);
  InferShapeAtBuild(op, &b);
  return op;
}

// Declares `name` as a [n] var of `dtype` in `b`.
void Declare(Block& b, const std::string& name, DType dtype, int64_t n) {
  VarDesc* v = b.Var(name);
  v->set_dtype(dtype);
  v->set_shape({n});
}

// `op`'s list slot `slot` keeping only the names in `keep`.
std::vector<std::string> Kept(const std::vector<std::string>& names,
                              const std::set<std::string>& keep) {
  std::vector<std::string> out;
  for (const std::string& n : names)
    if (keep.count(n)) out.push_back(n);
  return out;
}

// The optimizer-section ops that look at every gradient, made to see this rank's own and to agree
// with plain data parallelism through one collective each (Paddle's sharding leaves the overflow
// flag rank-local; here it cannot): check_finite_and_unscale checks and unscales the owned
// gradients, and its FoundInfinite is all-reduced (max, as int32) so that every rank skips the
// same steps and scales the loss alike; clip_by_global_norm becomes a norm of the owned
// gradients, an all-gather of the ranks' norms and a clip of the owned gradients by the norm of
// all of them (the other ranks' norms enter the sum of squares as one more input).
void ReduceAcrossOwners(Block& mb, size_t from, const std::set<std::string>& owned_grads, int rank,
                        int nranks) {
  for (size_t i = from; i < mb.num_ops(); ++i) {
    OpDesc* op = mb.op(i);
    if (op->type() == "check_finite_and_unscale") {
      const std::vector<std::string> own = Kept(op->Input("X"), owned_grads);
      op->SetInput("X", own);
      op->SetOutput("Out", own);
      InferShapeAtBuild(op, &mb);
      i = InsertOverflowFlagMax(mb, i + 1, op->Output("FoundInfinite")[0], /*ring_id=*/0,
                                Role(*op)) -
          1;
    } else if (op->type() == "clip_by_global_norm") {
      const std::vector<std::string> own = Kept(op->Input("X"), owned_grads);
      const DType dtype = mb.MustFindVar(op->Input("X")[0])->dtype();
      const float clip = op->Attr<float>("clip_norm");
      const int role = Role(*op);
      const std::vector<std::string> global = op->Output("GlobalNorm");
      mb.RemoveOp(i);
      const std::string local = "@SHARDING_NORM@LOCAL", all = "@SHARDING_NORM@ALL",
                        others = "@SHARDING_NORM@OTHERS";
      Declare(mb, local, dtype, 1);
      Declare(mb, all, dtype, nranks);
      Declare(mb, others, dtype, nranks - 1);
      Declare(mb, others + "@CLIPPED", dtype, nranks - 1);
      size_t at = i;
      if (own.empty()) {
        OpDesc* zero = mb.InsertOp(at++, "fill_constant");
        zero->SetOutput("Out", {local});
        zero->SetAttr("shape", std::vector<int64_t>{1});
        zero->SetAttr("dtype", static_cast<int>(dtype));
        zero->SetAttr("value", 0.0f);
        zero->SetAttr(kOpRoleAttr, role);
        InferShapeAtBuild(zero, &mb);
      } else {
        // The norm of the owned gradients; a clip norm no norm reaches leaves them as they are.
        OpDesc* norm = mb.InsertOp(at++, "clip_by_global_norm");
        norm->SetInput("X", own);
        norm->SetOutput("Out", own);
        norm->SetOutput("GlobalNorm", {local});
        norm->SetAttr("clip_norm", std::numeric_limits<float>::max());
        norm->SetAttr(kOpRoleAttr, role);
        InferShapeAtBuild(norm, &mb);
      }
      InsertOp(mb, at++, "c_sync_calc_stream", local, local, role);
      InsertOp(mb, at++, "c_allgather", local, all, role, {{"nranks", nranks}});
      InsertOp(mb, at++, "c_sync_comm_stream", all, all, role);
      std::vector<std::string> parts, rest;
      for (int r = 0; r < nranks; ++r) {
        parts.push_back(all + "@" + std::to_string(r));
        Declare(mb, parts.back(), dtype, 1);
        if (r != rank) rest.push_back(parts.back());
      }
      OpDesc* split = mb.InsertOp(at++, "split");
      split->SetInput("X", {all});
      split->SetOutput("Out", parts);
      split->SetAttr("num", nranks);
      split->SetAttr("axis", 0);
      split->SetAttr(kOpRoleAttr, role);
      InferShapeAtBuild(split, &mb);
      OpDesc* concat = mb.InsertOp(at++, "concat");
      concat->SetInput("X", rest);
      concat->SetOutput("Out", {others});
      concat->SetAttr("axis", 0);
      concat->SetAttr(kOpRoleAttr, role);
      InferShapeAtBuild(concat, &mb);
      std::vector<std::string> xs = {others}, outs = {others + "@CLIPPED"};
      xs.insert(xs.end(), own.begin(), own.end());
      outs.insert(outs.end(), own.begin(), own.end());
      OpDesc* clip_op = mb.InsertOp(at, "clip_by_global_norm");
      clip_op->SetInput("X", xs);
      clip_op->SetOutput("Out", outs);
      if (!global.empty()) clip_op->SetOutput("GlobalNorm", global);
      clip_op->SetAttr("clip_norm", clip);
      clip_op->SetAttr(kOpRoleAttr, role);
      InferShapeAtBuild(clip_op, &mb);
      i = at;
    }
  }
}

// From op `from` on, no op but one of type `exempt` may read a gradient this rank does not own
// (it holds only its own share of the sum); `where` says where in the error.
void RefuseReadsOfOthersGradients(const Block& mb, size_t from,
                                  const std::set<std::string>& not_owned, int rank,
                                  const char* where, const std::string& exempt = "") {
  for (size_t i = from; i < mb.num_ops(); ++i) {
    const OpDesc& op = *mb.op(i);
    if (!exempt.empty() && op.type() == exempt) continue;
    for (const std::string& n : op.InputArgumentNames())
      KEEL_ENFORCE(!not_owned.count(n), "sharding: op ", op.type(), " reads '", n, "' ", where,
                   ", but under sharding rank ", rank,
                   " holds only the summed gradients of its own parameters");
  }
}

// A pipeline stage's accumulators reduce-scattered to their owners at `at` (op_role Optimize):
// each flattened ("<acc>@FLAT") and laid out by owner with each owner's run padded to the slice
// length ("@SHARDING_PAD@r", zeros), concatenated into "@SHARDING_GRAD@", one c_reducescatter
// into this rank's slice "@SHARDING_GRAD@SHARD", split and reshaped back into the owned
// accumulators. The accumulators are persistable and summed into every micro-batch, so they are
// copied rather than made slices of the buffer. Returns the index after.
size_t ReduceScatterAccumulators(Block& mb, size_t at, const ShardingPlan& plan, int rank,
                                 DType dtype) {
  const int nranks = static_cast<int>(plan.load.size());
  const std::string fused = "@SHARDING_GRAD@", shard = "@SHARDING_GRAD@SHARD";
  for (const std::string& n : {fused, shard})
    KEEL_ENFORCE(mb.FindVar(n) == nullptr, "sharding: the program already has a var named '", n,
                 "' (transpiled twice?)");
  std::vector<std::string> pieces, mine;  // the buffer's pieces; this rank's, in its slice
  std::vector<int> mine_sizes;
  for (int r = 0; r < nranks; ++r) {
    for (const ShardingPlan::Param& p : plan.params) {
      if (p.owner != r) continue;
      at = InsertFlatten(mb, at, p.grad, kOptimize);
      pieces.push_back(FlatName(p.grad));
      if (r == rank) {
        mine.push_back(pieces.back());
        mine_sizes.push_back(static_cast<int>(p.numel));
      }
    }
    const int64_t gap = plan.slice - plan.load[r];
    if (gap == 0) continue;
    const std::string pad = "@SHARDING_PAD@" + std::to_string(r);
    Declare(mb, pad, dtype, gap);
    OpDesc* zeros = mb.InsertOp(at++, "fill_constant");
    zeros->SetOutput("Out", {pad});
    zeros->SetAttr("shape", std::vector<int64_t>{gap});
    zeros->SetAttr("dtype", static_cast<int>(dtype));
    zeros->SetAttr("value", 0.0f);
    zeros->SetAttr(kOpRoleAttr, kOptimize);
    InferShapeAtBuild(zeros, &mb);
    pieces.push_back(pad);
    if (r == rank) {
      mine.push_back(pad);
      mine_sizes.push_back(static_cast<int>(gap));
    }
  }
  at = InsertConcatFlat(mb, at, pieces, fused, kOptimize);
  Declare(mb, shard, dtype, plan.slice);
  InsertOp(mb, at++, "c_sync_calc_stream", fused, fused, kOptimize);
  InsertOp(mb, at++, "c_reducescatter", fused, shard, kOptimize, {{"nranks", nranks}});
  InsertOp(mb, at++, "c_sync_comm_stream", shard, shard, kOptimize);
  if (plan.load[rank] == 0) return at;  // this rank owns nothing
  at = InsertSplitFlat(mb, at, shard, mine, mine_sizes, kOptimize);
  for (const ShardingPlan::Param& p : plan.params)
    if (p.owner == rank) at = InsertUnflatten(mb, at, p.grad, kOptimize);
  return at;
}

}  // namespace

std::map<std::string, int> ShardingPlan::StateOwners() const {
  std::map<std::string, int> owners;
  for (const Param& p : params)
    for (const std::string& s : p.state) owners[s] = p.owner;
  return owners;
}

ShardingPlan PlanSharding(const Program& main, int nranks) {
  KEEL_ENFORCE(nranks >= 1, "sharding: ", nranks, " ranks");
  const Block& mb = main.global_block();
  // Which ops use each var: the parameter whose update op it is, or "" for any other op.
  std::map<std::string, std::set<std::string>> users;
  std::map<std::string, std::string> grad_of;  // from backward's op_role_var
  std::set<std::string> updated;
  for (int b = 0; b < main.num_blocks(); ++b)
    for (const auto& op : main.block(b).ops()) {
      const std::string param = b == 0 ? UpdatedParam(*op) : "";
      if (!param.empty()) updated.insert(param);
      if (b == 0 && Role(*op) == kBackward && op->HasAttr(kOpRoleVarAttr)) {
        const auto pairs = op->Attr<std::vector<std::string>>(kOpRoleVarAttr);
        for (size_t k = 0; k + 1 < pairs.size(); k += 2) grad_of[pairs[k]] = pairs[k + 1];
      }
      for (const auto& names : {op->InputArgumentNames(), op->OutputArgumentNames()})
        for (const std::string& n : names) users[n].insert(param);
    }
  ShardingPlan plan;
  int64_t total = 0;
  for (VarDesc* v : mb.AllVars()) {
    if (!v->is_parameter() || !updated.count(v->name())) continue;
    KEEL_ENFORCE(grad_of.count(v->name()), "sharding: parameter '", v->name(),
                 "' is updated but no backward op names its gradient (op_role_var)");
    ShardingPlan::Param p;
    p.name = v->name();
    p.grad = grad_of[p.name];
    // A pipeline stage's updates read the gradient's accumulator (transpiler/pipeline_pass.h).
    if (mb.FindVar(p.grad + kPipelineAccSuffix) != nullptr) p.grad += kPipelineAccSuffix;
    const VarDesc* g = mb.MustFindVar(p.grad);
    KEEL_ENFORCE(g->dims().known(), "sharding: gradient '", p.grad, "' has shape ", g->dims().str(),
                 "; only gradients of known shape can be laid out by owner");
    p.numel = g->dims().numel();
    total += p.numel;
    plan.params.push_back(std::move(p));
  }
  // State: persistable vars, not parameters, that only this parameter's update ops use.
  for (ShardingPlan::Param& p : plan.params)
    for (VarDesc* v : mb.AllVars()) {
      if (!v->persistable() || v->is_parameter()) continue;
      const auto it = users.find(v->name());
      if (it != users.end() && it->second.size() == 1 && *it->second.begin() == p.name)
        p.state.push_back(v->name());
    }
  // Contiguous runs balanced by elements: a parameter goes to the rank whose share of the total
  // holds its middle element.
  plan.load.assign(nranks, 0);
  int64_t before = 0;
  for (ShardingPlan::Param& p : plan.params) {
    const double middle = static_cast<double>(before) + static_cast<double>(p.numel) / 2;
    p.owner = std::min(nranks - 1, static_cast<int>(middle * nranks / static_cast<double>(total)));
    plan.load[p.owner] += p.numel;
    before += p.numel;
  }
  plan.slice = plan.load.empty() ? 0 : *std::max_element(plan.load.begin(), plan.load.end());
  return plan;
}

void ShardingPass::Apply(Program& main, Program& startup) const {
  const RingOptions& ro = options_.rings;
  const int nranks = ro.nranks, rank = ro.rank;
  KEEL_ENFORCE(ro.nrings == 1, "sharding: runs on one ring, got nccl_comm_num=", ro.nrings);
  KEEL_ENFORCE(rank >= 0 && rank < nranks, "sharding: rank ", rank, " of ", nranks);
  const ShardingPlan plan = PlanSharding(main, nranks);
  KEEL_ENFORCE(!plan.params.empty(),
               "sharding: the main program updates no parameter; call minimize before "
               "transpiling");
  Block& mb = main.global_block();
  Block& sb = startup.global_block();

  std::set<std::string> owned, not_owned_grads, removed_state;
  DType dtype = mb.MustFindVar(plan.params[0].grad)->dtype();
  for (const ShardingPlan::Param& p : plan.params) {
    const DType t = mb.MustFindVar(p.grad)->dtype();
    KEEL_ENFORCE(t == dtype, "sharding: gradient '", p.grad, "' is ", DTypeName(t), ", '",
                 plan.params[0].grad, "' is ", DTypeName(dtype),
                 "; the gradients go into one buffer of one dtype");
    if (p.owner == rank) {
      owned.insert(p.name);
    } else {
      not_owned_grads.insert(p.grad);
      removed_state.insert(p.state.begin(), p.state.end());
    }
  }

  // ---- startup: rings and the parameters from rank 0; no state for others' parameters.
  AppendRingsAndParamBroadcast(main, startup, ro);
  for (size_t i = sb.num_ops(); i-- > 0;) {
    const auto outs = sb.op(i)->OutputArgumentNames();
    const bool only_removed = !outs.empty() && std::all_of(outs.begin(), outs.end(), [&](auto& n) {
      return removed_state.count(n) > 0;
    });
    if (only_removed) sb.RemoveOp(i);
  }
  for (const std::string& s : removed_state)
    if (sb.FindVar(s)) sb.RemoveVar(s);

  // ---- main: remove the updates of parameters this rank does not own.
  for (size_t i = mb.num_ops(); i-- > 0;) {
    const std::string p = UpdatedParam(*mb.op(i));
    if (!p.empty() && !owned.count(p)) mb.RemoveOp(i);
  }

  // Scale the loss gradient by 1/N where it is filled, as plain data parallelism does.
  size_t loss_grad = mb.num_ops();
  for (size_t i = 0; i < mb.num_ops(); ++i)
    if (Role(*mb.op(i)) == (kBackward | kLoss)) {
      loss_grad = i;
      break;
    }
  // A pipeline stage before the last has none: the last stage's scaled loss gradient reaches it
  // through the transfers.
  const bool pipeline = !PipelineAccumulators(mb).empty();
  KEEL_ENFORCE(
      loss_grad < mb.num_ops() || pipeline,
      "sharding: the main program has no loss-gradient op; call minimize (append_backward) "
      "before transpiling");
  if (loss_grad < mb.num_ops()) {
    const std::string& g = mb.op(loss_grad)->Output("Out")[0];
    OpDesc* s = mb.InsertOp(loss_grad + 1, "scale");
    s->SetInput("X", {g});
    s->SetOutput("Out", {g});
    s->SetAttr("scale", 1.0f / static_cast<float>(nranks));
    s->SetAttr(kOpRoleAttr, kBackward | kLoss);
    InferShapeAtBuild(s, &mb);
  }

  std::set<std::string> owned_grads;
  for (const ShardingPlan::Param& p : plan.params)
    if (p.owner == rank) owned_grads.insert(p.grad);
  if (pipeline) {
    // A pipeline stage: its accumulators hold the mini-batch's gradients once every micro-batch
    // has run, so the reduce-scatter to owners is the optimizer section's first work.
    size_t at = 0;
    while (at < mb.num_ops() && !(Role(*mb.op(at)) & kOptimize)) ++at;
    at = ReduceScatterAccumulators(mb, at, plan, rank, dtype);
    ReduceAcrossOwners(mb, at, owned_grads, rank, nranks);
    // Every stage zeroes all its accumulators: those ops may read the others' too.
    RefuseReadsOfOthersGradients(mb, at, not_owned_grads, rank, "in the optimizer section",
                                 "fill_zeros_like");
  } else {
    // The last writer of any parameter gradient: the reduce-scatter goes right after it.
    size_t last_writer = 0;
    for (size_t i = 0; i < mb.num_ops(); ++i) {
      const OpDesc& op = *mb.op(i);
      if (Role(op) == kBackward && op.HasAttr(kOpRoleVarAttr)) last_writer = i;
    }
    ReduceAcrossOwners(mb, last_writer + 1, owned_grads, rank, nranks);
    RefuseReadsOfOthersGradients(mb, last_writer + 1, not_owned_grads, rank, "after backward");

    // The fused buffer, laid out by owner, each owner's run padded to the slice length.
    const std::string fused = "@SHARDING_GRAD@", shard = "@SHARDING_GRAD@SHARD";
    std::vector<std::string> names;
    std::vector<int64_t> numels;
    std::vector<int> section;  // this rank's split of its slice
    std::vector<std::string> parts;
    for (int r = 0; r < nranks; ++r) {
      for (const ShardingPlan::Param& p : plan.params) {
        if (p.owner != r) continue;
        names.push_back(p.grad);
        numels.push_back(p.numel);
        if (r == rank) {
          section.push_back(static_cast<int>(p.numel));
          parts.push_back(p.grad + "@SHARDING");
        }
      }
      const int64_t gap = plan.slice - plan.load[r];
      if (gap == 0) continue;
      const std::string pad = "@SHARDING_PAD@" + std::to_string(r);
      VarDesc* v = mb.Var(pad);
      v->set_dtype(dtype);
      v->set_shape({gap});
      names.push_back(pad);
      numels.push_back(gap);
      if (r == rank) {
        section.push_back(static_cast<int>(gap));
        parts.push_back(pad);
      }
    }
    for (const std::string& n : {fused, shard})
      KEEL_ENFORCE(mb.FindVar(n) == nullptr, "sharding: the program already has a var named '", n,
                   "' (transpiled twice?)");
    mb.Var(fused)->set_dtype(dtype);
    mb.Var(fused)->set_shape({plan.slice * nranks});
    mb.Var(shard)->set_dtype(dtype);
    mb.Var(shard)->set_shape({plan.slice});

    // After the last gradient: reduce-scatter, then this rank's gradients out of its slice.
    size_t at = last_writer + 1;
    InsertOp(mb, at++, "c_sync_calc_stream", fused, fused, kBackward);
    InsertOp(mb, at++, "c_reducescatter", fused, shard, kBackward, {{"nranks", nranks}});
    InsertOp(mb, at++, "c_sync_comm_stream", shard, shard, kBackward);
    if (!owned.empty()) {
      for (size_t k = 0; k < parts.size(); ++k) {
        VarDesc* v = mb.Var(parts[k]);
        v->set_dtype(dtype);
        v->set_shape({section[k]});
      }
      OpDesc* split = mb.InsertOp(at++, "split");
      split->SetInput("X", {shard});
      split->SetOutput("Out", parts);
      split->SetAttr("sections", section);
      split->SetAttr("axis", 0);
      split->SetAttr(kOpRoleAttr, kBackward);
      InferShapeAtBuild(split, &mb);
      for (const ShardingPlan::Param& p : plan.params) {
        if (p.owner != rank) continue;
        const VarDesc* g = mb.MustFindVar(p.grad);
        std::vector<int> dims(g->shape().begin(), g->shape().end());
        OpDesc* reshape = mb.InsertOp(at++, "reshape");
        reshape->SetInput("X", {p.grad + "@SHARDING"});
        reshape->SetOutput("Out", {p.grad});
        reshape->SetAttr("shape", dims);
        reshape->SetAttr(kOpRoleAttr, kBackward);
        InferShapeAtBuild(reshape, &mb);
      }
    }

    // Before the first backward op: the gradients become slices of the fused buffer.
    size_t first = 0;
    while (first < mb.num_ops() && !(Role(*mb.op(first)) & kBackward)) ++first;
    OpDesc* co = mb.InsertOp(first, "coalesce_tensor");
    co->SetInput("Input", names);
    co->SetOutput("Output", names);
    co->SetOutput("FusedOutput", {fused});
    co->SetAttr("numels", numels);
    co->SetAttr("dtype", static_cast<int>(dtype));
    co->SetAttr("copy_data", false);
    co->SetAttr(kOpRoleAttr, kBackward);
    InferShapeAtBuild(co, &mb);
  }

  // At the end: every parameter from its owner.
  for (const ShardingPlan::Param& p : plan.params)
    InsertOp(mb, mb.num_ops(), "c_broadcast", p.name, p.name, kOptimize, {{"root", p.owner}});
  InsertOp(mb, mb.num_ops(), "c_sync_comm_stream", plan.params.back().name, plan.params.back().name,
           kOptimize);
}

}  // namespace transpiler
}  // namespace keel
