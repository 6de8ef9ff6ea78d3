#include "executor/eager_deletion.h"

#include <algorithm>

#include "framework/runtime/scope.h"

namespace keel {

EagerDeletionPlan::EagerDeletionPlan(const std::vector<DependencyGraph::OpAccess>& ops,
                                     const std::map<std::string, Variable*>& owned,
                                     const std::map<std::string, std::string>& slice_of,
                                     const std::set<std::string>& kept) {
  for (const auto& op : ops)
    if (op.hidden_accesses) return;
  std::set<std::string> never = kept;  // fused buffers, their slices, and `kept`
  for (const auto& kv : slice_of) {
    never.insert(kv.first);
    never.insert(kv.second);
  }
  // Per name: whether its first toucher wrote it without reading it, and the ops touching it.
  struct Seen {
    bool written_first;
    std::vector<int> ops;
  };
  std::map<std::string, Seen> seen;
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    auto touch = [&](const std::string& name, bool read) {
      auto it = seen.find(name);
      if (it == seen.end()) it = seen.emplace(name, Seen{!read, {}}).first;
      if (it->second.ops.empty() || it->second.ops.back() != i) it->second.ops.push_back(i);
    };
    for (const auto& r : ops[i].reads) touch(r, true);  // an op reading what it writes reads first
    for (const auto& w : ops[i].writes) touch(w, false);
  }
  touched_by_op_.resize(ops.size());
  for (const auto& [name, s] : seen) {
    auto it = owned.find(name);
    if (it == owned.end() || !s.written_first || never.count(name)) continue;
    const int idx = static_cast<int>(vars_.size());
    vars_.push_back({name, it->second, static_cast<int>(s.ops.size())});
    for (int i : s.ops) touched_by_op_[i].push_back(idx);
  }
}

std::vector<std::string> EagerDeletionPlan::Names() const {
  std::vector<std::string> names;
  for (const auto& v : vars_) names.push_back(v.name);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> EagerDeletionPlan::FreedAfter(int op) const {
  std::vector<std::string> names;
  if (op < 0 || op >= static_cast<int>(touched_by_op_.size())) return names;
  for (int idx : touched_by_op_[op]) {
    bool last = true;
    for (size_t j = op + 1; last && j < touched_by_op_.size(); ++j)
      last = std::find(touched_by_op_[j].begin(), touched_by_op_[j].end(), idx) ==
             touched_by_op_[j].end();
    if (last) names.push_back(vars_[idx].name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

EagerDeletionRun::EagerDeletionRun(const EagerDeletionPlan& plan,
                                   const std::set<const Variable*>& keep, int64_t threshold_bytes)
    : plan_(plan),
      keep_(keep),
      threshold_(threshold_bytes),
      left_(new std::atomic<int>[plan.vars_.size()]) {
  for (size_t k = 0; k < plan.vars_.size(); ++k)
    left_[k].store(plan.vars_[k].uses, std::memory_order_relaxed);
}

void EagerDeletionRun::OpDone(int op) {
  for (int idx : plan_.touched_by_op_[op]) {
    // acq_rel: the freeing thread sees every other toucher's work on the buffer as done.
    if (left_[idx].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
    Variable* v = plan_.vars_[idx].var;
    if (!keep_.count(v)) Free(v);
  }
}

void EagerDeletionRun::Free(Variable* v) {
  Tensor* t = v->mutable_tensor();
  if (threshold_ <= 0) {
    t->clear();
    return;
  }
  std::vector<Variable*> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_.push_back(v);
    held_bytes_ += t->initialized() ? static_cast<int64_t>(t->nbytes()) : 0;
    if (held_bytes_ < threshold_) return;
    due.swap(held_);
    held_bytes_ = 0;
  }
  for (Variable* d : due) d->mutable_tensor()->clear();
}

void EagerDeletionRun::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Variable* v : held_) v->mutable_tensor()->clear();
  held_.clear();
  held_bytes_ = 0;
}

}  // namespace keel
