#include "framework/op/op_registry.h"

#include <glog/logging.h>

#include <algorithm>
#include <mutex>

#include "framework/base/strings.h"
#include "framework/ir/op_device.h"
#include "framework/op/execution_context.h"
#include "framework/op/host_fallback_kernel.h"
#include "framework/runtime/cuda_backend.h"

namespace keel {

namespace {

struct Registry {
  std::map<std::string, std::unique_ptr<OpSchema>> schemas;
  std::map<std::string, std::map<KernelKey, KernelFactory>> kernels;
};

Registry& Reg() {
  static Registry* r = new Registry;  // never destroyed: used from static initializers
  return *r;
}

std::string SlotsDebug(const OpDesc::VarMap& m) {
  std::string s;
  for (auto& kv : m) {
    if (!s.empty()) s += ", ";
    s += kv.first + "=" +
         (kv.second.size() == 1 ? kv.second[0] : "[" + StrJoin(kv.second, ", ") + "]");
  }
  return s;
}

// The grad vars of `args`, in order.
std::vector<std::string> GradArgs(const std::vector<std::string>& args) {
  std::vector<std::string> grads;
  for (auto& a : args) grads.push_back(GradVarName(a));
  return grads;
}

// A grad maker's result: the one grad op `g`, given the forward op's attrs.
std::vector<std::unique_ptr<OpDesc>> OneGradOp(std::unique_ptr<OpDesc> g, const OpDesc& fwd) {
  for (auto& kv : fwd.attrs()) g->SetAttr(kv.first, kv.second);
  std::vector<std::unique_ptr<OpDesc>> r;
  r.push_back(std::move(g));
  return r;
}

class CompileTimeInferShapeContext : public InferShapeContext {
 public:
  CompileTimeInferShapeContext(const OpDesc& op, Block* block) : op_(op), block_(block) {}
  const OpDesc& op() const override { return op_; }
  bool IsRuntime() const override { return false; }
  DDim GetInputDim(const std::string& slot, int i) const override { return In(slot, i)->dims(); }
  DType GetInputDType(const std::string& slot, int i) const override {
    return In(slot, i)->dtype();
  }
  void SetOutputDim(const std::string& slot, const DDim& dims, int i) override {
    if (VarDesc* v = Out(slot, i)) v->set_dims(dims);
  }
  void SetOutputDType(const std::string& slot, DType dtype, int i) override {
    if (VarDesc* v = Out(slot, i)) v->set_dtype(NarrowedDType(op_, slot, v->dtype(), dtype));
  }

 private:
  VarDesc* In(const std::string& slot, int i) const {
    const auto& args = op_.Input(slot);
    KEEL_ENFORCE(i < static_cast<int>(args.size()), "input ", slot, "[", i, "] is not set");
    return block_->MustFindVar(args[i]);
  }
  VarDesc* Out(const std::string& slot, int i) const {
    const auto& args = op_.Output(slot);
    if (i >= static_cast<int>(args.size()) || args[i] == kEmptyVarName) return nullptr;
    VarDesc* v = block_->FindVarRecursive(args[i]);
    return v ? v : block_->Var(args[i]);
  }
  const OpDesc& op_;
  Block* block_;
};

}  // namespace

// ---------------------------------------------------------------- InferShapeContext helpers

bool InferShapeContext::HasOutput(const std::string& slot, int i) const {
  const auto& args = op().Output(slot);
  return i < static_cast<int>(args.size()) && args[i] != kEmptyVarName;
}

int InferShapeContext::NumInputs(const std::string& slot) const {
  return static_cast<int>(op().Input(slot).size());
}

const std::string& InferShapeContext::InputName(const std::string& slot, int i) const {
  const auto& args = op().Input(slot);
  KEEL_ENFORCE(i < static_cast<int>(args.size()), "input ", slot, "[", i, "] is not set");
  return args[i];
}

std::vector<DDim> InferShapeContext::GetInputsDim(const std::string& slot) const {
  std::vector<DDim> r;
  for (int i = 0; i < NumInputs(slot); ++i) r.push_back(GetInputDim(slot, i));
  return r;
}

bool InferShapeContext::DimsEq(const DDim& a, const DDim& b) const {
  if (a.size() != b.size()) return false;
  for (int i = 0; i < a.size(); ++i)
    if (!DimEq(a[i], b[i])) return false;
  return true;
}

void GradShapeFromInputs(InferShapeContext& ctx) {
  for (auto& kv : ctx.op().outputs()) {
    const std::string& slot = kv.first;
    const std::string suffix = "@GRAD";
    if (slot.size() <= suffix.size() ||
        slot.compare(slot.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    std::string fwd = slot.substr(0, slot.size() - suffix.size());
    for (int i = 0; i < static_cast<int>(kv.second.size()); ++i) {
      if (kv.second[i] == kEmptyVarName) continue;
      ctx.SetOutputDim(slot, ctx.GetInputDim(fwd, i), i);
      ctx.SetOutputDType(slot, ctx.GetInputDType(fwd, i), i);
    }
  }
}

DType NarrowedDType(const OpDesc& op, const std::string& slot, DType declared, DType computed) {
  const bool half = declared == DType::kFloat16 || declared == DType::kBFloat16;
  return computed == DType::kFloat32 && half && OpRegistry::Traits(op.type()).NarrowsOutput(slot)
             ? declared
             : computed;
}

// ---------------------------------------------------------------- OpSchema

OpSchema& OpSchema::AcceptsRowSparse(const std::string& slot, const std::string& when) {
  for (auto& a : inputs_)
    if (a.name == slot) {
      a.row_sparse_ok = true;
      a.row_sparse_attr = when;
      return *this;
    }
  KEEL_THROW("op ", type_, ": AcceptsRowSparse names no input slot '", slot, "'");
}

bool OpSchema::ReadsRowSparse(const OpDesc& op, const std::string& slot) const {
  const ArgDef* a = FindInput(slot);
  return a != nullptr && a->row_sparse_ok &&
         (a->row_sparse_attr.empty() ||
          (op.HasAttr(a->row_sparse_attr) && op.Attr<bool>(a->row_sparse_attr)));
}

bool OpSchema::WritesRowSparse(const OpDesc& op, const std::string& slot) const {
  for (const auto& [s, attr] : row_sparse_outputs_)
    if (s == slot && op.HasAttr(attr) && op.Attr<bool>(attr)) return true;
  return false;
}

const ArgDef* OpSchema::FindInput(const std::string& name) const {
  for (auto& a : inputs_)
    if (a.name == name) return &a;
  return nullptr;
}
const ArgDef* OpSchema::FindOutput(const std::string& name) const {
  for (auto& a : outputs_)
    if (a.name == name) return &a;
  return nullptr;
}
const AttrDef* OpSchema::FindAttr(const std::string& name) const {
  for (auto& a : attrs_)
    if (a.name == name) return &a;
  return nullptr;
}

OpSchema& OpSchema::DefaultGrad() {
  // Each output sits next to its grad, as in the slots RegisterGrad declares.
  grad_maker_ = [grad_type = type_ + "_grad"](const OpDesc& fwd) {
    auto g = std::make_unique<OpDesc>(grad_type);
    for (auto& kv : fwd.inputs()) g->SetInput(kv.first, kv.second);
    for (auto& kv : fwd.outputs()) {
      g->SetInput(kv.first, kv.second);
      g->SetInput(GradVarName(kv.first), GradArgs(kv.second));
    }
    for (auto& kv : fwd.inputs()) g->SetOutput(GradVarName(kv.first), GradArgs(kv.second));
    return OneGradOp(std::move(g), fwd);
  };
  return *this;
}

GradOpMakerFn GradMaker(std::string grad_type, std::vector<std::string> fwd_slots,
                        std::vector<std::string> out_grads, std::vector<std::string> in_grads) {
  return [grad_type = std::move(grad_type), fwd_slots = std::move(fwd_slots),
          out_grads = std::move(out_grads), in_grads = std::move(in_grads)](const OpDesc& fwd) {
    auto g = std::make_unique<OpDesc>(grad_type);
    for (auto& s : fwd_slots) g->SetInput(s, fwd.HasInput(s) ? fwd.Input(s) : fwd.Output(s));
    for (auto& s : out_grads) g->SetInput(GradVarName(s), GradArgs(fwd.Output(s)));
    for (auto& s : in_grads) g->SetOutput(GradVarName(s), GradArgs(fwd.Input(s)));
    return OneGradOp(std::move(g), fwd);
  };
}

void OpSchema::Complete(OpDesc* op) const {
  CheckNoUnknownAttrs(*op);
  for (auto& a : attrs_) {
    if (op->HasAttr(a.name)) {
      const Attribute& v = op->GetAttr(a.name);
      KEEL_ENFORCE(v.index() == a.default_value.index(), "op ", type_, ": attribute '", a.name,
                   "' must be ", AttrTypeName(a.default_value), ", got ", AttrTypeName(v));
      if (a.check) {
        std::string err = a.check(v);
        KEEL_ENFORCE(err.empty(), "op ", type_, ": attribute ", a.name, "=", AttrToString(v), ": ",
                     err);
      }
    } else {
      KEEL_ENFORCE(!a.required, "op ", type_, ": required attribute '", a.name, "' is not set");
      op->SetAttr(a.name, a.default_value);
    }
  }
  for (auto& in : inputs_) {
    const auto& args = op->Input(in.name);
    KEEL_ENFORCE(in.dispensable || !args.empty(), "op ", type_, ": input ", in.name, " is not set");
    KEEL_ENFORCE(in.duplicable || args.size() <= 1, "op ", type_, ": input ", in.name,
                 " takes one variable, got ", args.size());
  }
  for (auto& kv : op->inputs())
    KEEL_ENFORCE(FindInput(kv.first) != nullptr, "op ", type_, " has no input slot '", kv.first,
                 "'");
  for (auto& out : outputs_) {
    const auto& args = op->Output(out.name);
    KEEL_ENFORCE(out.dispensable || !args.empty(), "op ", type_, ": output ", out.name,
                 " is not set");
  }
  for (auto& kv : op->outputs())
    KEEL_ENFORCE(FindOutput(kv.first) != nullptr, "op ", type_, " has no output slot '", kv.first,
                 "'");
}

bool IsFrameworkAttr(const std::string& name) {
  return name == kOpRoleAttr || name == kOpRoleVarAttr || name == kOpDeviceAttr;
}

void OpSchema::CheckNoUnknownAttrs(const OpDesc& op) const {
  for (auto& kv : op.attrs()) {
    if (FindAttr(kv.first) || IsFrameworkAttr(kv.first)) continue;
    std::string known;
    for (auto& a : attrs_) known += (known.empty() ? "" : ", ") + a.name;
    KEEL_THROW(
        "op ", type_, " has no attribute '", kv.first, "' (set to ", AttrToString(kv.second),
        "); keel's ", type_, " knows: ", known.empty() ? "none" : known,
        " (and op_role, op_role_var, op_device on every op). A program that relies on it would ",
        "compute something else here");
  }
}

// ---------------------------------------------------------------- OpRegistry

OpSchema& OpRegistry::Register(const std::string& type) {
  auto& slot = Reg().schemas[type];
  CHECK(!slot) << "op " << type << " registered twice";
  slot = std::make_unique<OpSchema>(type);
  return *slot;
}

OpSchema& OpRegistry::RegisterGrad(const std::string& grad_type, const std::string& fwd_type) {
  const OpSchema* fwd = Find(fwd_type);
  CHECK(fwd) << "grad op " << grad_type << " registered before its forward op " << fwd_type;
  OpSchema& g = Register(grad_type);
  for (auto& in : fwd->inputs_) g.OptionalInput(in.name, in.doc);
  for (auto& out : fwd->outputs_) {
    g.OptionalInput(out.name, out.doc);
    g.OptionalInput(GradVarName(out.name), "gradient of " + out.name);
  }
  for (auto& in : fwd->inputs_) g.OptionalOutput(GradVarName(in.name), "gradient of " + in.name);
  for (auto& ge : g.inputs_) ge.duplicable = true;
  for (auto& ge : g.outputs_) ge.duplicable = true;
  g.attrs_ = fwd->attrs_;
  g.kernel_dtype_slot_ = fwd->kernel_dtype_slot_.empty() && !fwd->inputs_.empty()
                             ? fwd->inputs_[0].name
                             : fwd->kernel_dtype_slot_;
  g.infer_shape_ = GradShapeFromInputs;
  return g;
}

void OpRegistry::RegisterKernel(const std::string& type, KernelKey key, KernelFactory f) {
  auto& slot = Reg().kernels[type][key];
  CHECK(!slot) << "kernel for " << type << " registered twice";
  slot = std::move(f);
}

const OpSchema* OpRegistry::Find(const std::string& type) {
  auto it = Reg().schemas.find(type);
  return it == Reg().schemas.end() ? nullptr : it->second.get();
}

const OpTraits& OpRegistry::Traits(const std::string& type) {
  static const OpTraits kNone;
  const OpSchema* s = Find(type);
  return s ? s->traits() : kNone;
}

std::vector<std::string> OpRegistry::OpTypes() {
  std::vector<std::string> r;
  for (auto& kv : Reg().schemas) r.push_back(kv.first);
  return r;
}

const OpSchema& OpRegistry::Get(const std::string& type) {
  const OpSchema* s = Find(type);
  KEEL_ENFORCE(s != nullptr, "unknown op type '", type,
               "' (known types: ", StrJoin(OpTypes(), ", "), ")");
  return *s;
}

bool OpRegistry::HasKernel(const std::string& type, Place::Kind place, DType dtype) {
  if (place == Place::Kind::kCUDA) GetCudaBackend();  // libkeel_cuda registers the CUDA kernels
  auto it = Reg().kernels.find(type);
  return it != Reg().kernels.end() && it->second.count(KernelKey{place, dtype});
}

std::unique_ptr<OpKernel> OpRegistry::CreateKernel(const OpDesc& op, const Place& place,
                                                   DType dtype) {
  // The CUDA kernels are libkeel_cuda's, registered as it opens: a CUDA place without the
  // backend is refused here, naming why.
  if (place.is_cuda()) CudaBackendFor(place);
  auto it = Reg().kernels.find(op.type());
  if (it != Reg().kernels.end()) {
    auto k = it->second.find(KernelKey{place.kind, dtype});
    if (k != it->second.end()) return k->second(op);
    // No CUDA kernel: the CPU kernel on host copies, when FLAGS_cuda_host_fallback allows.
    auto cpu = it->second.find(KernelKey{Place::Kind::kCPU, dtype});
    if (place.is_cuda() && cpu != it->second.end() && CudaHostFallbackAllowed())
      return MakeHostFallbackKernel(cpu->second(op), op.type());
  }
  std::vector<std::string> have;
  if (it != Reg().kernels.end())
    for (auto& kv : it->second)
      have.push_back(std::string(kv.first.place == Place::Kind::kCPU ? "CPU" : "CUDA") + "/" +
                     DTypeName(kv.first.dtype));
  KEEL_THROW("op ", op.type(), ": no kernel for ", place.is_cpu() ? "CPU" : "CUDA", "/",
             DTypeName(dtype), " (registered: ", have.empty() ? "none" : StrJoin(have, ", "), ")",
             place.is_cuda() && !CudaHostFallbackAllowed()
                 ? "; FLAGS_cuda_host_fallback=false forbids running the CPU kernel"
                 : "");
}

DType OpRegistry::KernelDType(const OpDesc& op, const Block& block) {
  const OpSchema& s = Get(op.type());
  std::string slot = s.kernel_dtype_slot();
  if (slot.empty()) {
    for (auto& in : s.inputs())
      if (!op.Input(in.name).empty()) {
        slot = in.name;
        break;
      }
  }
  if (!slot.empty() && !op.Input(slot).empty())
    return block.MustFindVar(op.Input(slot)[0])->dtype();
  if (op.HasAttr("dtype")) return static_cast<DType>(op.Attr<int>("dtype"));
  // No input and no dtype attr: the first output's declared dtype.
  for (auto& kv : op.outputs())
    for (auto& a : kv.second)
      if (a != kEmptyVarName) return block.MustFindVar(a)->dtype();
  return DType::kFloat32;
}

void InferShapeAtBuild(OpDesc* op, Block* block) {
  const OpSchema& s = OpRegistry::Get(op->type());
  s.Complete(op);
  for (auto& name : op->InputArgumentNames())
    KEEL_ENFORCE(block->FindVarRecursive(name) != nullptr, "op ", op->type(), ": input variable '",
                 name, "' is not defined");
  if (!s.infer_shape()) return;
  CompileTimeInferShapeContext ctx(*op, block);
  try {
    s.infer_shape()(ctx);
  } catch (const Error& e) {
    KEEL_THROW("op ", op->type(), " (", SlotsDebug(op->inputs()), " -> ", SlotsDebug(op->outputs()),
               "): ", e.what());
  }
}

// ---------------------------------------------------------------- ExecutionContext

const Tensor* ExecutionContext::InputOrNull(const std::string& slot, int i) const {
  const Slot* s = Find(ins_, slot);
  if (!s || i >= static_cast<int>(s->vars.size()) || !s->vars[i]) return nullptr;
  return &s->vars[i]->tensor();
}

const Tensor& ExecutionContext::Input(const std::string& slot, int i) const {
  const Tensor* t = InputOrNull(slot, i);
  KEEL_ENFORCE(t != nullptr, "input ", slot, "[", i, "] is not set");
  if (!t->initialized()) {
    const auto& args = op_->Input(slot);
    KEEL_THROW("input ", slot, " (variable '", i < static_cast<int>(args.size()) ? args[i] : "?",
               "') holds no data: feed it, or run the startup program first");
  }
  return *t;
}

std::vector<const Tensor*> ExecutionContext::MultiInput(const std::string& slot) const {
  std::vector<const Tensor*> r;
  for (int i = 0; i < NumInputs(slot); ++i) r.push_back(&Input(slot, i));
  return r;
}

Tensor* ExecutionContext::OutputOrNull(const std::string& slot, int i) const {
  const Slot* s = Find(outs_, slot);
  if (!s || i >= static_cast<int>(s->vars.size()) || !s->vars[i]) return nullptr;
  return s->vars[i]->mutable_tensor();
}

Tensor* ExecutionContext::Output(const std::string& slot, int i) const {
  Tensor* t = OutputOrNull(slot, i);
  KEEL_ENFORCE(t != nullptr, "output ", slot, "[", i, "] is not set");
  return t;
}

std::vector<Tensor*> ExecutionContext::MultiOutput(const std::string& slot) const {
  std::vector<Tensor*> r;
  int n = Count(outs_, slot);
  for (int i = 0; i < n; ++i) r.push_back(OutputOrNull(slot, i));
  return r;
}

}  // namespace keel
