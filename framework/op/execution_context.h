// ExecutionContext: an op's inputs and outputs resolved to Variables once, when the executor
// builds its plan; kernels read them here on every run without name lookups in scopes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "framework/ir/program.h"
#include "framework/op/shape_inference.h"
#include "framework/runtime/scope.h"

namespace keel {

class ExecutionContext {
 public:
  struct Slot {
    std::string name;
    std::vector<Variable*> vars;  // nullptr for @EMPTY@ arguments
    // Outputs: each var's declared dtype (its VarDesc's), where the executor knows it; empty
    // otherwise (a context a test or a merged kernel builds).
    std::vector<DType> dtypes;
  };

  ExecutionContext(const OpDesc* op, const Place& place) : op_(op), place_(place) {}

  const OpDesc& op() const { return *op_; }
  const Place& place() const { return place_; }
  uint64_t seed() const { return seed_; }
  void set_seed(uint64_t s) { seed_ = s; }
  // How many runs of the program came before this one (the executor's RunCount): random ops
  // derive each run's stream from (seed, run index), so a run's draws depend only on its index
  // and a resumed executor (Executor::SetRunCount) draws what the uninterrupted one would have.
  int64_t run_index() const { return run_index_ ? *run_index_ : 0; }
  void set_run_index_source(const int64_t* runs) { run_index_ = runs; }
  // CUDA graphs: device memory holding the run index, which a captured step's random kernels
  // read when they run (a replay's kernel arguments are those of the capture); null otherwise.
  const int64_t* device_run_index() const { return device_run_index_; }
  void set_device_run_index(const int64_t* p) { device_run_index_ = p; }
  // Runs block `idx` of the op's program in the same scopes (control-flow ops); set by the
  // executor.
  void RunBlock(int idx) const {
    KEEL_ENFORCE(run_block_ != nullptr, "op ", op_->type(), ": this executor cannot run blocks");
    run_block_(idx);
  }
  void set_block_runner(std::function<void(int)> f) { run_block_ = std::move(f); }
  // Output `slot` may take its input's buffer instead of a copy (OpTraits::may_share): the
  // executor allows it where neither var can change while the other is read.
  bool MayShare(const std::string& slot) const {
    for (const std::string& s : shareable_)
      if (s == slot) return true;
    return false;
  }
  void AllowSharing(std::string slot) { shareable_.push_back(std::move(slot)); }

  void AddInput(std::string slot, std::vector<Variable*> vars) {
    ins_.push_back(Slot{std::move(slot), std::move(vars), {}});
  }
  void AddOutput(std::string slot, std::vector<Variable*> vars, std::vector<DType> dtypes = {}) {
    outs_.push_back(Slot{std::move(slot), std::move(vars), std::move(dtypes)});
  }
  const std::vector<Slot>& input_slots() const { return ins_; }
  const std::vector<Slot>& output_slots() const { return outs_; }

  int NumInputs(const std::string& slot) const { return Count(ins_, slot); }
  bool HasInput(const std::string& slot) const { return InputOrNull(slot) != nullptr; }
  // The input tensor; a keel::Error when absent or not initialized.
  const Tensor& Input(const std::string& slot, int i = 0) const;
  const Tensor* InputOrNull(const std::string& slot, int i = 0) const;
  std::vector<const Tensor*> MultiInput(const std::string& slot) const;
  // The output tensor; a keel::Error when the slot is absent.
  Tensor* Output(const std::string& slot, int i = 0) const;
  // nullptr when the slot is absent or its argument is @EMPTY@ (a gradient nobody needs).
  Tensor* OutputOrNull(const std::string& slot, int i = 0) const;
  std::vector<Tensor*> MultiOutput(const std::string& slot) const;
  // The variables themselves, for what a tensor does not carry (a row-sparse value's rows);
  // nullptr when absent.
  const Variable* InputVar(const std::string& slot, int i = 0) const {
    return VarAt(ins_, slot, i);
  }
  Variable* OutputVar(const std::string& slot, int i = 0) const { return VarAt(outs_, slot, i); }
  // The dtype the program declares for output `slot`'s i-th var; `otherwise` where the context
  // was built without declared dtypes.
  DType DeclaredOutputDType(const std::string& slot, int i, DType otherwise) const {
    const Slot* s = Find(outs_, slot);
    return s && i < static_cast<int>(s->dtypes.size()) ? s->dtypes[i] : otherwise;
  }

  template <typename T>
  const T& Attr(const std::string& name) const {
    return op_->Attr<T>(name);
  }

 private:
  static const Slot* Find(const std::vector<Slot>& v, const std::string& slot) {
    for (auto& s : v)
      if (s.name == slot) return &s;
    return nullptr;
  }
  static Variable* VarAt(const std::vector<Slot>& v, const std::string& slot, int i) {
    const Slot* s = Find(v, slot);
    return s && i < static_cast<int>(s->vars.size()) ? s->vars[i] : nullptr;
  }
  static int Count(const std::vector<Slot>& v, const std::string& slot) {
    const Slot* s = Find(v, slot);
    return s ? static_cast<int>(s->vars.size()) : 0;
  }
  const OpDesc* op_;
  Place place_;
  uint64_t seed_ = 0;
  const int64_t* run_index_ = nullptr;
  const int64_t* device_run_index_ = nullptr;
  std::vector<Slot> ins_, outs_;
  std::function<void(int)> run_block_;
  std::vector<std::string> shareable_;
};

// Runs shape functions over live tensors: outputs are resized before the kernel runs.
class RuntimeInferShapeContext : public InferShapeContext {
 public:
  explicit RuntimeInferShapeContext(const ExecutionContext& ctx) : ctx_(ctx) {}
  const OpDesc& op() const override { return ctx_.op(); }
  bool IsRuntime() const override { return true; }
  // A row-sparse input has the dims of the dense tensor it stands for, as at build time.
  DDim GetInputDim(const std::string& slot, int i) const override {
    DDim d = ctx_.Input(slot, i).dims();
    const Variable* v = ctx_.InputVar(slot, i);
    if (v != nullptr && v->is_row_sparse() && d.size() >= 1) d[0] = v->height();
    return d;
  }
  DType GetInputDType(const std::string& slot, int i) const override {
    return ctx_.Input(slot, i).dtype();
  }
  void SetOutputDim(const std::string& slot, const DDim& dims, int i) override {
    if (Tensor* t = ctx_.OutputOrNull(slot, i)) t->Resize(dims);
  }
  void SetOutputDType(const std::string& slot, DType dtype, int i) override {
    if (Tensor* t = ctx_.OutputOrNull(slot, i))
      t->set_dtype(NarrowedDType(op(), slot, ctx_.DeclaredOutputDType(slot, i, dtype), dtype));
  }

 private:
  const ExecutionContext& ctx_;
};

}  // namespace keel
