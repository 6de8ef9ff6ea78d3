#include "framework/dsl/program_guard.h"

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "framework/dsl/pipeline.h"
#include "framework/ir/op_device.h"
#include "framework/op/op_registry.h"

namespace keel {

namespace {

struct GuardStack {
  std::vector<std::pair<Program*, Program*>> stack;
};

GuardStack& Guards() {
  static GuardStack* g = new GuardStack;
  return *g;
}

}  // namespace

VarDesc* Var::desc() const {
  KEEL_ENFORCE(block_ != nullptr, "use of an empty Var");
  return block_->MustFindVar(name_);
}

ProgramGuard::ProgramGuard(Program& main, Program& startup) {
  Guards().stack.emplace_back(&main, &startup);
}

ProgramGuard::~ProgramGuard() { Guards().stack.pop_back(); }

Program& default_main_program() {
  if (!Guards().stack.empty()) return *Guards().stack.back().first;
  static Program* p = new Program;
  return *p;
}

Program& default_startup_program() {
  if (!Guards().stack.empty()) return *Guards().stack.back().second;
  static Program* p = new Program;
  return *p;
}

OpDesc* AppendOp(Block& block, const std::string& type, const OpDesc::VarMap& inputs,
                 const OpDesc::VarMap& outputs, const std::map<std::string, Attribute>& attrs) {
  OpRegistry::Get(type);  // unknown types fail before anything is appended
  auto op = std::make_unique<OpDesc>(type);
  for (auto& kv : inputs) op->SetInput(kv.first, kv.second);
  for (auto& kv : outputs) op->SetOutput(kv.first, kv.second);
  for (auto& kv : attrs) op->SetAttr(kv.first, kv.second);
  if (!op->HasAttr(kOpRoleAttr)) op->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kForward));
  if (current_pipeline_stage() >= 0 && !op->HasAttr(kOpDeviceAttr))
    op->SetAttr(kOpDeviceAttr, PipelineStageName(current_pipeline_stage()));
  // Shape inference runs on the detached op first, so a failing op leaves the block unchanged
  // (apart from output vars it declared).
  std::vector<std::string> created;
  for (auto& name : op->OutputArgumentNames())
    if (name != kEmptyVarName && !block.FindVarRecursive(name)) {
      block.Var(name);
      created.push_back(name);
    }
  try {
    InferShapeAtBuild(op.get(), &block);
  } catch (...) {
    for (auto& name : created) block.RemoveVar(name);
    throw;
  }
  return block.InsertOp(block.num_ops(), std::move(op));
}

Var CreateTmpVar(const std::string& prefix, DType dtype) {
  Program& prog = default_main_program();
  Block& block = prog.global_block();
  std::string name = prog.UniqueName(prefix + ".tmp");
  block.Var(name)->set_dtype(dtype);
  return Var(&block, name);
}

namespace {
std::mutex& CheckpointMutex() {
  static std::mutex mu;
  return mu;
}
std::map<uint64_t, std::vector<std::string>>& CheckpointMarks() {
  static auto* marks = new std::map<uint64_t, std::vector<std::string>>;
  return *marks;
}
}  // namespace

void recompute_checkpoint(Var v) {
  KEEL_ENFORCE(v.valid(), "recompute_checkpoint: not a variable");
  std::lock_guard<std::mutex> lock(CheckpointMutex());
  std::vector<std::string>& marks = CheckpointMarks()[v.block()->program()->id()];
  if (std::find(marks.begin(), marks.end(), v.name()) == marks.end()) marks.push_back(v.name());
}

std::vector<std::string> RecomputeCheckpoints(const Program& program) {
  std::lock_guard<std::mutex> lock(CheckpointMutex());
  auto it = CheckpointMarks().find(program.id());
  return it == CheckpointMarks().end() ? std::vector<std::string>{} : it->second;
}

}  // namespace keel
