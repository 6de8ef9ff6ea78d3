#include "framework/runtime/scope.h"

#include <algorithm>

namespace keel {

Variable* Scope::Var(const std::string& name) {
  auto& slot = vars_[name];
  if (!slot) slot = std::make_unique<Variable>();
  return slot.get();
}

Variable* Scope::FindLocalVar(const std::string& name) const {
  auto it = vars_.find(name);
  return it == vars_.end() ? nullptr : it->second.get();
}

Variable* Scope::FindVar(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent_)
    if (Variable* v = s->FindLocalVar(name)) return v;
  return nullptr;
}

std::vector<std::string> Scope::LocalVarNames() const {
  std::vector<std::string> names;
  names.reserve(vars_.size());
  for (auto& kv : vars_) names.push_back(kv.first);
  std::sort(names.begin(), names.end());
  return names;
}

Scope& Scope::NewScope() {
  kids_.push_back(std::make_unique<Scope>());
  kids_.back()->parent_ = this;
  return *kids_.back();
}

}  // namespace keel
