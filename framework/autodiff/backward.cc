#include "framework/autodiff/backward.h"

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "framework/op/op_registry.h"

namespace keel {

namespace {

bool IsFloat(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}

const std::string kGradSuffix = "@GRAD";

// "x@GRAD" -> "x"; "" when name is not a gradient name.
std::string ForwardName(const std::string& grad) {
  if (grad.size() <= kGradSuffix.size() ||
      grad.compare(grad.size() - kGradSuffix.size(), kGradSuffix.size(), kGradSuffix) != 0)
    return "";
  return grad.substr(0, grad.size() - kGradSuffix.size());
}

void SetRole(OpDesc* op, OpRole role) { op->SetAttr(kOpRoleAttr, static_cast<int>(role)); }

// Recompute's plan: the segment of each forward op and, per recomputed segment, the ops to run
// again (in forward order).
struct RecomputePlan {
  std::vector<int> segment_of;             // per forward op index <= loss_op
  int last_segment = 0;                    // not recomputed
  std::map<int, std::vector<int>> replay;  // segment -> forward ops to run again
  std::set<std::string> kept;              // checkpoints: never renamed
};

RecomputePlan PlanRecompute(const Block& block, int loss_op, const std::vector<int>& relevant,
                            const std::vector<std::string>& checkpoints) {
  RecomputePlan plan;
  std::set<int> ends;  // ops that write a checkpoint (their last writer before the loss)
  for (const std::string& c : checkpoints) {
    int writer = -1;
    for (int i = 0; i <= loss_op; ++i)
      for (const std::string& out : block.op(i)->OutputArgumentNames())
        if (out == c) writer = i;
    KEEL_ENFORCE(writer >= 0, "recompute: checkpoint '", c,
                 "' is not written by a forward op before the loss");
    ends.insert(writer);
    plan.kept.insert(c);
  }
  plan.segment_of.assign(loss_op + 1, 0);
  int seg = 0;
  for (int i = 0; i <= loss_op; ++i) {
    plan.segment_of[i] = seg;
    if (ends.count(i)) ++seg;
  }
  plan.last_segment = seg;
  // Per segment: the relevant ops and, within the segment, the producers of what they read.
  std::map<int, std::set<int>> wanted;
  for (int i : relevant)
    if (plan.segment_of[i] != plan.last_segment) wanted[plan.segment_of[i]].insert(i);
  for (auto& [s, ops] : wanted) {
    for (int i = loss_op; i >= 0; --i) {
      if (plan.segment_of[i] != s || !ops.count(i)) continue;
      for (const std::string& in : block.op(i)->InputArgumentNames())
        for (int j = i - 1; j >= 0 && plan.segment_of[j] == s; --j) {
          const auto outs = block.op(j)->OutputArgumentNames();
          if (std::find(outs.begin(), outs.end(), in) != outs.end()) {
            ops.insert(j);
            break;
          }
        }
    }
    for (int i : ops) {
      const OpDesc& op = *block.op(i);
      bool all_kept = true;
      for (const std::string& out : op.OutputArgumentNames())
        all_kept = all_kept && (plan.kept.count(out) || out == kEmptyVarName);
      if (all_kept) continue;
      KEEL_ENFORCE(op.type() == "dropout" || !OpRegistry::Get(op.type()).FindAttr("seed"),
                   "recompute: op ", i, " (", op.type(),
                   ") draws random numbers and lies in a recomputed segment; its replay would "
                   "draw others. Make one of its outputs a checkpoint");
      plan.replay[s].push_back(i);
    }
  }
  return plan;
}

}  // namespace

std::vector<ParamGrad> append_backward(Program& program, const std::string& loss,
                                       const std::set<std::string>& no_grad_set,
                                       const std::vector<std::string>& checkpoints) {
  Block& block = program.global_block();
  VarDesc* loss_var = block.FindVar(loss);
  KEEL_ENFORCE(loss_var != nullptr, "append_backward: loss '", loss,
               "' is not a variable of the program");
  KEEL_ENFORCE(IsFloat(loss_var->dtype()), "append_backward: loss '", loss, "' has dtype ",
               DTypeName(loss_var->dtype()), "; a loss must be floating point");
  DDim loss_dims = loss_var->dims();
  KEEL_ENFORCE(loss_dims.numel() == 1, "append_backward: loss '", loss, "' has shape ",
               loss_dims.str(), "; it must hold one element (apply layers::mean first)");

  int loss_op = -1;
  for (size_t i = 0; i < block.num_ops(); ++i)
    for (auto& out : block.op(i)->OutputArgumentNames())
      if (out == loss) loss_op = static_cast<int>(i);
  KEEL_ENFORCE(loss_op >= 0, "append_backward: no op writes the loss '", loss, "'");

  // Forward: which vars carry a gradient (depend on a trainable leaf).
  std::set<std::string> written;
  std::set<std::string> needs_grad;
  auto blocked = [&](const std::string& name) {
    const VarDesc* v = block.FindVarRecursive(name);
    return !v || v->stop_gradient() || no_grad_set.count(name) || !IsFloat(v->dtype());
  };
  for (int i = 0; i <= loss_op; ++i) {
    OpDesc* op = block.op(i);
    bool any = false;
    for (auto& in : op->InputArgumentNames()) {
      if (!written.count(in) && !blocked(in)) {
        const VarDesc* v = block.FindVarRecursive(in);
        if (v->is_parameter() || !v->persistable()) needs_grad.insert(in);
      }
      any = any || needs_grad.count(in);
    }
    for (auto& out : op->OutputArgumentNames()) {
      written.insert(out);
      if (any && !blocked(out)) needs_grad.insert(out);
    }
  }
  KEEL_ENFORCE(needs_grad.count(loss), "append_backward: loss '", loss,
               "' does not depend on any trainable parameter");

  // Backward reachability: ops whose outputs lead to the loss.
  std::set<std::string> leads{loss};
  std::vector<int> relevant;
  for (int i = loss_op; i >= 0; --i) {
    OpDesc* op = block.op(i);
    bool hit = false;
    for (auto& out : op->OutputArgumentNames()) hit = hit || leads.count(out);
    if (!hit) continue;
    bool any_in = false;
    for (auto& in : op->InputArgumentNames()) any_in = any_in || needs_grad.count(in);
    if (!any_in) continue;
    for (auto& in : op->InputArgumentNames())
      if (needs_grad.count(in)) leads.insert(in);
    relevant.push_back(i);
  }

  auto declare_grad = [&](const std::string& grad, const std::string& fwd) {
    VarDesc* f = block.MustFindVar(fwd);
    VarDesc* g = block.Var(grad);
    g->set_dtype(f->dtype());
    g->set_shape(f->shape());
  };

  const size_t first_grad_op = block.num_ops();
  std::string loss_grad = GradVarName(loss);
  OpDesc* fill = block.AppendOp("fill_constant");
  fill->SetOutput("Out", {loss_grad});
  fill->SetAttr("shape", loss_dims.vec());
  fill->SetAttr("value", 1.0f);
  fill->SetAttr("dtype", static_cast<int>(loss_var->dtype()));
  fill->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kBackward) | static_cast<int>(OpRole::kLoss));
  declare_grad(loss_grad, loss);
  InferShapeAtBuild(fill, &block);

  std::set<std::string> produced{loss_grad};
  const bool recompute = !checkpoints.empty();
  RecomputePlan plan;
  if (recompute) plan = PlanRecompute(block, loss_op, relevant, checkpoints);
  std::map<std::string, std::string> renamed;  // forward var -> its recomputed copy
  int replayed_segment = plan.last_segment;
  auto rename = [&](const std::string& v) {
    auto it = renamed.find(v);
    return it == renamed.end() ? v : it->second;
  };
  // Runs segment `s`'s ops again, writing "<var>@RECOMPUTE".
  auto replay = [&](int s) {
    std::set<std::string> crossing;
    for (int i : plan.replay[s]) {
      auto copy = std::make_unique<OpDesc>(*block.op(i));
      for (const auto& [slot, args] : block.op(i)->inputs()) {
        std::vector<std::string> a = args;
        for (std::string& v : a) v = rename(v);
        copy->SetInput(slot, a);
      }
      if (copy->type() == "dropout") {
        // The forward's mask, not a new draw (dropout_grad reads that mask too).
        copy->SetInput("ReplayMask", block.op(i)->Output("Mask"));
        copy->SetOutput("Mask", {kEmptyVarName});
      }
      for (const auto& [slot, args] : copy->outputs()) {
        std::vector<std::string> a = args;
        for (std::string& v : a) {
          if (v == kEmptyVarName || plan.kept.count(v)) continue;
          const std::string r = v + "@RECOMPUTE";
          const VarDesc* f = block.MustFindVar(v);
          VarDesc* c = block.Var(r);
          c->set_dtype(f->dtype());
          c->set_shape(f->shape());
          c->set_stop_gradient(true);
          renamed[v] = r;
          v = r;
        }
        copy->SetOutput(slot, a);
      }
      copy->RemoveAttr(kOpRoleVarAttr);
      SetRole(copy.get(), OpRole::kBackward);
      OpDesc* added = block.InsertOp(block.num_ops(), std::move(copy));
      InferShapeAtBuild(added, &block);
    }
    // Activations of this segment that a later segment reads stay alive from forward on.
    for (int j = 0; j <= loss_op; ++j) {
      if (plan.segment_of[j] <= s) continue;
      for (const std::string& in : block.op(j)->InputArgumentNames()) {
        const VarDesc* v = block.FindVarRecursive(in);
        if (renamed.count(in) && !plan.kept.count(in) && v && !v->persistable())
          crossing.insert(in);
      }
    }
    for (const std::string& v : crossing)
      LOG(INFO) << "recompute: '" << v << "' of segment " << s
                << " is read by a later segment, so it stays alive until backward (make it a "
                   "checkpoint to say so)";
  };
  for (int i : relevant) {
    if (recompute && plan.segment_of[i] != plan.last_segment) {
      while (replayed_segment > plan.segment_of[i]) {
        --replayed_segment;
        if (plan.replay.count(replayed_segment)) replay(replayed_segment);
      }
    }
    const OpDesc& fwd = *block.op(i);
    const OpSchema& schema = OpRegistry::Get(fwd.type());
    KEEL_ENFORCE(schema.has_grad(), "append_backward: op ", fwd.type(),
                 " has no gradient, but its inputs need one; mark them stop_gradient");
    for (auto& g : schema.grad_maker()(fwd)) {
      bool any_out = false;
      for (auto& kv : g->outputs()) {
        std::vector<std::string> args = kv.second;
        for (auto& a : args) {
          std::string f = ForwardName(a);
          if (!f.empty() && !needs_grad.count(f)) a = kEmptyVarName;
          any_out = any_out || a != kEmptyVarName;
        }
        g->SetOutput(kv.first, args);
      }
      if (!any_out) continue;
      if (recompute && plan.segment_of[i] != plan.last_segment) {
        // Forward vars the grad op reads: their recomputed copies.
        for (const auto& [slot, args] : g->inputs()) {
          std::vector<std::string> a = args;
          for (std::string& v : a)
            if (ForwardName(v).empty()) v = rename(v);
          g->SetInput(slot, a);
        }
      }
      // A grad input nobody produced (an output whose gradient never flows): zeros.
      for (auto& kv : g->inputs())
        for (auto& a : kv.second) {
          std::string f = ForwardName(a);
          if (f.empty() || produced.count(a)) continue;
          OpDesc* z = block.AppendOp("fill_zeros_like");
          z->SetInput("X", {rename(f)});
          z->SetOutput("Out", {a});
          SetRole(z, OpRole::kBackward);
          declare_grad(a, f);
          InferShapeAtBuild(z, &block);
          produced.insert(a);
        }
      SetRole(g.get(), OpRole::kBackward);
      for (auto& out : g->OutputArgumentNames()) {
        if (out == kEmptyVarName) continue;
        std::string f = ForwardName(out);
        if (!f.empty()) declare_grad(out, f);
        produced.insert(out);
      }
      // An is_sparse embedding's gradient holds only the rows its ids touch.
      const OpSchema& gs = OpRegistry::Get(g->type());
      for (const auto& [slot, args] : g->outputs())
        if (gs.WritesRowSparse(*g, slot))
          for (const auto& a : args)
            if (a != kEmptyVarName) block.MustFindVar(a)->set_row_sparse(true);
      OpDesc* added = block.InsertOp(block.num_ops(), std::move(g));
      InferShapeAtBuild(added, &block);
    }
  }

  // A gradient written by several grad ops: each writes a renamed copy, and a `sum` right after
  // the last writer adds them. Writers all precede readers, since backward runs in reverse order.
  struct Write {
    size_t op;
    std::string slot;
    size_t pos;
  };
  std::map<std::string, std::vector<Write>> writers;
  for (size_t i = first_grad_op; i < block.num_ops(); ++i)
    for (auto& [slot, args] : block.op(i)->outputs())
      for (size_t p = 0; p < args.size(); ++p)
        if (args[p] != kEmptyVarName && !ForwardName(args[p]).empty())
          writers[args[p]].push_back(Write{i, slot, p});
  struct PendingSum {
    size_t after;  // index of the last writer
    std::string target;
    std::vector<std::string> parts;
  };
  std::vector<PendingSum> sums;
  for (auto& [grad, writes] : writers) {
    if (writes.size() < 2) continue;
    PendingSum s{writes.back().op, grad, {}};
    for (size_t k = 0; k < writes.size(); ++k) {
      std::string part = grad + "@RENAME@" + std::to_string(k);
      OpDesc* op = block.op(writes[k].op);
      std::vector<std::string> args = op->Output(writes[k].slot);
      args[writes[k].pos] = part;
      op->SetOutput(writes[k].slot, args);
      declare_grad(part, ForwardName(grad));
      block.MustFindVar(part)->set_row_sparse(block.MustFindVar(grad)->row_sparse());
      s.parts.push_back(part);
    }
    sums.push_back(std::move(s));
  }
  // Insert from the back so earlier indices stay valid.
  std::sort(sums.begin(), sums.end(),
            [](const PendingSum& a, const PendingSum& b) { return a.after > b.after; });
  for (auto& s : sums) {
    OpDesc* sum = block.InsertOp(s.after + 1, "sum");
    sum->SetInput("X", s.parts);
    sum->SetOutput("Out", {s.target});
    if (block.MustFindVar(s.target)->row_sparse()) sum->SetAttr("row_sparse", true);
    SetRole(sum, OpRole::kBackward);
    InferShapeAtBuild(sum, &block);
  }

  // Parameters in creation order, with the op that last writes each gradient tagged.
  std::vector<ParamGrad> result;
  for (VarDesc* v : block.AllVars()) {
    if (!v->is_parameter() || !needs_grad.count(v->name())) continue;
    std::string grad = GradVarName(v->name());
    if (!produced.count(grad)) continue;
    for (size_t i = block.num_ops(); i-- > first_grad_op;) {
      OpDesc* op = block.op(i);
      auto outs = op->OutputArgumentNames();
      if (std::find(outs.begin(), outs.end(), grad) == outs.end()) continue;
      std::vector<std::string> role_var;
      if (op->HasAttr(kOpRoleVarAttr))
        role_var = op->Attr<std::vector<std::string>>(kOpRoleVarAttr);
      role_var.push_back(v->name());
      role_var.push_back(grad);
      op->SetAttr(kOpRoleVarAttr, role_var);
      break;
    }
    result.emplace_back(v->name(), grad);
  }
  return result;
}

}  // namespace keel
