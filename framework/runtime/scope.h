// Scope: name -> Variable, with a parent chain. Persistables live in the global scope; each
// executor keeps a child scope for temporaries.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "framework/runtime/tensor.h"

namespace keel {

// A named slot in a scope. Holds a Tensor; a row-sparse variable (the gradient of an is_sparse
// embedding, VarDesc::row_sparse) also holds the row indices of its tensor's rows: the tensor is
// [n, D] and stands for the [height, D] dense tensor that is zero outside rows(), which are
// sorted and distinct.
class Variable {
 public:
  const Tensor& tensor() const { return tensor_; }
  Tensor* mutable_tensor() { return &tensor_; }

  bool is_row_sparse() const { return height_ >= 0; }
  int64_t height() const { return height_; }
  const std::vector<int64_t>& rows() const { return rows_; }
  // The writer of a row-sparse value sets its rows and the dense height with the tensor.
  void SetRows(int64_t height, std::vector<int64_t> rows) {
    height_ = height;
    rows_ = std::move(rows);
  }
  void SetDense() {
    height_ = -1;
    rows_.clear();
  }

 private:
  Tensor tensor_;
  int64_t height_ = -1;
  std::vector<int64_t> rows_;
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
