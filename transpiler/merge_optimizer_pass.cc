#include "transpiler/merge_optimizer_pass.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace keel {
namespace transpiler {
namespace {

bool IsMergeable(const std::string& type) {
  return type == "sgd" || type == "momentum" || type == "adam" || type == "adamw";
}

// What must agree for two ops to merge: type, attrs but op_role_var, LearningRate, Param dtype.
std::string MergeKey(const OpDesc& op, const Block& block) {
  std::string key = op.type() + "|" + op.Input("LearningRate")[0] + "|" +
                    DTypeName(block.MustFindVar(op.Input("Param")[0])->dtype());
  if (op.HasInput("SkipUpdate") && !op.Input("SkipUpdate").empty())
    key += "|skip=" + op.Input("SkipUpdate")[0];
  for (const auto& [name, value] : op.attrs())
    if (name != kOpRoleVarAttr) key += "|" + name + "=" + AttrToString(value);
  return key;
}

std::set<std::string> Args(const OpDesc::VarMap& m) {
  std::set<std::string> s;
  for (const auto& [slot, args] : m) s.insert(args.begin(), args.end());
  return s;
}

bool Intersects(const std::set<std::string>& a, const std::set<std::string>& b) {
  for (const std::string& x : a)
    if (b.count(x)) return true;
  return false;
}

// Whether moving the ops at `pos` (ascending) to the last of them keeps every op's inputs.
bool CanMergeAt(const Block& block, const std::vector<size_t>& pos) {
  std::set<size_t> members(pos.begin(), pos.end());
  std::set<std::string> earlier_in, earlier_out;  // of the members before the current op
  for (size_t q = pos.front(); q < pos.back(); ++q) {
    const OpDesc& op = *block.op(q);
    if (members.count(q)) {
      const std::set<std::string> in = Args(op.inputs()), out = Args(op.outputs());
      earlier_in.insert(in.begin(), in.end());
      earlier_out.insert(out.begin(), out.end());
      continue;
    }
    const std::set<std::string> in = Args(op.inputs()), out = Args(op.outputs());
    if (Intersects(in, earlier_out) || Intersects(out, earlier_out) || Intersects(out, earlier_in))
      return false;
  }
  return true;
}

// One merged op from the ops at `pos` (same type and attrs).
std::unique_ptr<OpDesc> Merged(const Block& block, const std::vector<size_t>& pos) {
  const OpDesc& first = *block.op(pos.front());
  auto m = std::make_unique<OpDesc>("merged_" + first.type());
  for (const auto& [slot, args] : first.inputs()) {
    if (slot == "LearningRate" || slot == "SkipUpdate") {  // shared by the group
      m->SetInput(slot, args);
      continue;
    }
    std::vector<std::string> list;
    for (size_t p : pos) list.push_back(block.op(p)->Input(slot)[0]);
    m->SetInput(slot, list);
  }
  for (const auto& [slot, args] : first.outputs()) {
    std::vector<std::string> list;
    for (size_t p : pos) list.push_back(block.op(p)->Output(slot)[0]);
    m->SetOutput(slot, list);
  }
  std::vector<std::string> role_var;
  for (const auto& [name, value] : first.attrs())
    if (name != kOpRoleVarAttr) m->SetAttr(name, value);
  for (size_t p : pos) {
    const OpDesc& op = *block.op(p);
    if (!op.HasAttr(kOpRoleVarAttr)) continue;
    for (const std::string& v : op.Attr<std::vector<std::string>>(kOpRoleVarAttr))
      role_var.push_back(v);
  }
  m->SetAttr(kOpRoleVarAttr, role_var);
  return m;
}

}  // namespace

void MergeOptimizerOpsPass::Apply(Program& main, Program&) const {
  Block& block = main.global_block();
  // The fused groups: gradient -> group index.
  std::map<std::string, int> group_of;
  int groups = 0;
  for (const auto& op : block.ops()) {
    if (op->type() != "coalesce_tensor") continue;
    for (const std::string& g : op->Input("Input")) group_of[g] = groups;
    ++groups;
  }
  if (groups == 0) return;
  // Gradients derived from a raw one by ops that name it in their op_role_var (weight decay's
  // grad + coeff * param, into <grad>@L2DECAY): derived var -> the raw gradient.
  std::map<std::string, std::string> raw_of;
  for (const auto& op : block.ops()) {
    if (IsMergeable(op->type()) || !op->HasAttr(kOpRoleVarAttr)) continue;
    const auto& rv = op->Attr<std::vector<std::string>>(kOpRoleVarAttr);
    if (rv.size() != 2) continue;
    for (const std::string& out : op->OutputArgumentNames())
      if (out != rv[1]) raw_of[out] = rv[1];
  }
  // (group, merge key) -> positions of its optimizer ops, in program order.
  std::map<std::pair<int, std::string>, std::vector<size_t>> sets;
  for (size_t i = 0; i < block.num_ops(); ++i) {
    const OpDesc& op = *block.op(i);
    if (!IsMergeable(op.type()) || !op.HasAttr(kOpRoleVarAttr)) continue;
    // multi_precision updates (AMP O2) stay per parameter: the merged ops have no master slots.
    if (op.HasInput("MasterParam") && !op.Input("MasterParam").empty()) continue;
    // So do updates that widen a 16-bit gradient (NarrowGradsPass): the merged ops' lists hold
    // Param's dtype.
    if (block.MustFindVar(op.Input("Grad")[0])->dtype() !=
        block.MustFindVar(op.Input("Param")[0])->dtype())
      continue;
    const auto& rv = op.Attr<std::vector<std::string>>(kOpRoleVarAttr);
    if (rv.size() != 2) continue;
    auto it = group_of.find(rv[1]);
    if (it == group_of.end() && raw_of.count(rv[1])) it = group_of.find(raw_of.at(rv[1]));
    if (it == group_of.end()) continue;
    sets[{it->second, MergeKey(op, block)}].push_back(i);
  }
  // Rewrite from the last position back, so earlier positions stay valid.
  std::vector<std::vector<size_t>> todo;
  for (auto& [key, pos] : sets)
    if (pos.size() >= 2 && CanMergeAt(block, pos)) todo.push_back(pos);
  std::sort(todo.begin(), todo.end(),
            [](const std::vector<size_t>& a, const std::vector<size_t>& b) {
              return a.back() > b.back();
            });
  // Sets of different groups may interleave; apply them one at a time, recomputing positions
  // by the ops' identity.
  std::vector<std::vector<const OpDesc*>> plans;
  for (const auto& pos : todo) {
    std::vector<const OpDesc*> ops;
    for (size_t p : pos) ops.push_back(block.op(p));
    plans.push_back(ops);
  }
  for (const auto& ops : plans) {
    std::vector<size_t> pos;
    for (const OpDesc* o : ops)
      for (size_t i = 0; i < block.num_ops(); ++i)
        if (block.op(i) == o) pos.push_back(i);
    if (!CanMergeAt(block, pos)) continue;
    std::unique_ptr<OpDesc> merged = Merged(block, pos);
    const size_t at = pos.back() - (pos.size() - 1);
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) block.RemoveOp(*it);
    block.InsertOp(at, std::move(merged));
  }
}

}  // namespace transpiler
}  // namespace keel
