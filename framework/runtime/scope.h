// Scope: name -> Variable, with a parent chain. Persistables live in the global scope; each
// executor keeps a child scope for temporaries.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "framework/runtime/tensor.h"

namespace keel {

// A named slot in a scope. Holds a Tensor (the only value kind so far).
class Variable {
 public:
  const Tensor& tensor() const { return tensor_; }
  Tensor* mutable_tensor() { return &tensor_; }

 private:
  Tensor tensor_;
};

class Scope {
 public:
  Scope() = default;
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  // Returns the variable named `name` in this scope, creating it here if absent.
  Variable* Var(const std::string& name);
  // Finds `name` here or in an ancestor; nullptr when absent.
  Variable* FindVar(const std::string& name) const;
  // Finds `name` in this scope only.
  Variable* FindLocalVar(const std::string& name) const;
  void EraseVar(const std::string& name) { vars_.erase(name); }
  std::vector<std::string> LocalVarNames() const;

  Scope& NewScope();
  void DropKids() { kids_.clear(); }
  const Scope* parent() const { return parent_; }

 private:
  std::unordered_map<std::string, std::unique_ptr<Variable>> vars_;
  std::vector<std::unique_ptr<Scope>> kids_;
  Scope* parent_ = nullptr;
};

}  // namespace keel
