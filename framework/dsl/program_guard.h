// The DSL's building state: the (main, startup) programs that layer calls append to, and Var, a
// handle on a variable of the main program.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "framework/ir/program.h"

namespace keel {

// A variable of a program's block, as the DSL hands it around.
class Var {
 public:
  Var() = default;
  Var(Block* block, std::string name) : block_(block), name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  operator const std::string&() const { return name_; }  // so {cost} works as a fetch list
  Block* block() const { return block_; }
  VarDesc* desc() const;
  DDim shape() const { return desc()->dims(); }
  DType dtype() const { return desc()->dtype(); }
  bool valid() const { return block_ != nullptr; }
  // Blocks gradients from flowing through this var.
  Var& set_stop_gradient(bool s) {
    desc()->set_stop_gradient(s);
    return *this;
  }

 private:
  Block* block_ = nullptr;
  std::string name_;
};

// While alive, layer calls append to `main` and initializers to `startup`. Guards nest.
class ProgramGuard {
 public:
  ProgramGuard(Program& main, Program& startup);
  ~ProgramGuard();
  ProgramGuard(const ProgramGuard&) = delete;
  ProgramGuard& operator=(const ProgramGuard&) = delete;
};

Program& default_main_program();
Program& default_startup_program();

// Marks `v` a recompute checkpoint of its program (Paddle's recompute_configs.checkpoints, set
// where the model is written): an optimizer with recompute on keeps it from forward to backward
// and recomputes what lies between checkpoints (framework/autodiff/backward.h).
void recompute_checkpoint(Var v);
// The vars marked in `program`, in marking order.
std::vector<std::string> RecomputeCheckpoints(const Program& program);

// Appends an op of `type` to `block`, fills default attrs, checks it against the schema and runs
// build-time shape inference, which sets the output vars' shapes and dtypes. Output vars that do
// not exist yet are created (non-persistable).
OpDesc* AppendOp(Block& block, const std::string& type, const OpDesc::VarMap& inputs,
                 const OpDesc::VarMap& outputs, const std::map<std::string, Attribute>& attrs = {});

// A fresh temporary var in the current main program, named "<prefix>.tmp_N".
Var CreateTmpVar(const std::string& prefix, DType dtype = DType::kFloat32);

}  // namespace keel
