// PruneForInference: the forward slice of block 0 that computes `targets` from `feeds`.
//
// Requires: feeds and targets are vars of block 0. Guarantees: the returned clone keeps, in their
// original order, exactly the forward ops (op_role without backward/optimize bits) some target
// transitively depends on, not looking past feeds; block 0 keeps only vars those ops use plus the
// feeds and targets; every op with an `is_test` attribute, in every block, has it true (batch norm
// normalizes with its moving statistics, dropout passes through), as Program::clone_for_test
// sets it. Leaves alone: the input program, and which ops and vars other blocks hold.
#include "framework/io/prune.h"

#include <set>
#include <string>
#include <variant>
#include <vector>

#include "framework/error.h"

namespace keel {
namespace {

// Ops without the attr are forward; the loss flag (256) marks a forward op that computes the loss.
bool IsForwardOp(const OpDesc& op) {
  auto it = op.attrs().find(kOpRoleAttr);
  if (it == op.attrs().end()) return true;
  const int* i = std::get_if<int>(&it->second);
  const int64_t* l = std::get_if<int64_t>(&it->second);
  KEEL_ENFORCE(i || l, "op ", op.type(), ": attribute '", kOpRoleAttr, "' is ",
               AttrTypeName(it->second), ", expected int");
  const int64_t role = i ? *i : *l;
  return (role & ~static_cast<int64_t>(OpRole::kLoss)) == static_cast<int64_t>(OpRole::kForward);
}

// Every var argument of `op` and of the ops in the blocks it references (control flow bodies).
void CollectArgs(const Program& program, const OpDesc& op, bool inputs_only,
                 std::set<std::string>* out) {
  for (const auto& n : op.InputArgumentNames()) out->insert(n);
  if (!inputs_only)
    for (const auto& n : op.OutputArgumentNames()) out->insert(n);
  for (const auto& kv : op.attrs()) {
    if (const BlockRef* b = std::get_if<BlockRef>(&kv.second)) {
      // A body reads outer vars through its inputs and writes outer vars through its outputs; both
      // count as uses of the outer var.
      for (const auto& sub : program.block(b->idx).ops()) CollectArgs(program, *sub, false, out);
    }
  }
}

// Adds to `missing` each var of block 0 that `op` (or an op of its sub-blocks) reads before
// anything in `available` provides it; then makes the op's outputs available.
void CheckReads(const Program& program, const OpDesc& op, std::set<std::string>* available,
                std::set<std::string>* missing) {
  const Block& outer = program.global_block();
  for (const auto& n : op.InputArgumentNames())
    if (n != kEmptyVarName && !available->count(n) && outer.HasVar(n)) missing->insert(n);
  for (const auto& kv : op.attrs())
    if (const BlockRef* b = std::get_if<BlockRef>(&kv.second))
      for (const auto& sub : program.block(b->idx).ops())
        CheckReads(program, *sub, available, missing);
  for (const auto& n : op.OutputArgumentNames()) available->insert(n);
}

std::string QuotedList(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return s.empty() ? "none" : s;
}

}  // namespace

std::unique_ptr<Program> PruneForInference(const Program& program,
                                           const std::vector<std::string>& feeds,
                                           const std::vector<std::string>& targets) {
  std::unique_ptr<Program> pruned = program.Clone();
  Block& block = pruned->global_block();
  KEEL_ENFORCE(!targets.empty(), "PruneForInference: no targets given");
  for (const auto& f : feeds)
    KEEL_ENFORCE(block.HasVar(f), "PruneForInference: feed var '", f,
                 "' is not defined in block 0");
  for (const auto& t : targets)
    KEEL_ENFORCE(block.HasVar(t), "PruneForInference: target var '", t,
                 "' is not defined in block 0");

  const std::set<std::string> feed_set(feeds.begin(), feeds.end());
  std::set<std::string> needed;  // vars some kept op (or a target) reads; never a feed
  for (const auto& t : targets)
    if (!feed_set.count(t)) needed.insert(t);

  // Walk backwards: an op is kept when it is forward and writes a needed var; its inputs become
  // needed. Like Paddle's prune, a var stays needed after its producer is found, so every earlier
  // writer of it (in-place updates) is kept too.
  std::vector<bool> keep(block.num_ops(), false);
  for (size_t i = block.num_ops(); i-- > 0;) {
    const OpDesc& op = *block.op(i);
    if (!IsForwardOp(op)) continue;
    bool writes_needed = false;
    for (const auto& out : op.OutputArgumentNames()) writes_needed |= needed.count(out) > 0;
    if (!writes_needed) continue;
    keep[i] = true;
    std::set<std::string> reads;
    CollectArgs(*pruned, op, /*inputs_only=*/true, &reads);
    for (const auto& r : reads)
      if (!feed_set.count(r) && r != kEmptyVarName) needed.insert(r);
  }
  for (size_t i = block.num_ops(); i-- > 0;)
    if (!keep[i]) block.RemoveOp(i);

  // The slice must run on the feeds and the persistables alone: a var it reads that neither
  // provides nor a kept op computes first (a data var left out of the feeds, a var only a
  // backward op writes) would fail at predict time; refuse it now.
  std::set<std::string> available(feeds.begin(), feeds.end()), missing;
  for (VarDesc* v : block.AllVars())
    if (v->persistable()) available.insert(v->name());
  for (const auto& op : block.ops()) CheckReads(*pruned, *op, &available, &missing);
  for (const auto& t : targets)
    if (!available.count(t)) missing.insert(t);
  KEEL_ENFORCE(missing.empty(), "the targets ", QuotedList(targets), " need ",
               QuotedList({missing.begin(), missing.end()}),
               ", which is neither a feed nor a persistable nor computed from them by a forward "
               "op (feeds: ",
               QuotedList(feeds), "); add it to the feeds");

  std::set<std::string> used(feeds.begin(), feeds.end());
  used.insert(targets.begin(), targets.end());
  for (const auto& op : block.ops()) CollectArgs(*pruned, *op, /*inputs_only=*/false, &used);
  for (VarDesc* v : block.AllVars()) {
    const std::string name = v->name();  // a copy: RemoveVar destroys *v
    if (!used.count(name)) block.RemoveVar(name);
  }
  for (int b = 0; b < pruned->num_blocks(); ++b)
    for (auto& op : pruned->block(b).ops())
      if (op->HasAttr("is_test")) op->SetAttr("is_test", true);
  return pruned;
}

}  // namespace keel
