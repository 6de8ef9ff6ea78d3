#include "transpiler/amp_pass.h"

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "framework/error.h"
#include "framework/ir/op_device.h"
#include "framework/op/op_registry.h"

namespace keel {
namespace transpiler {

const std::set<std::string>& AmpWhiteList() {
  static const std::set<std::string> s = {"mul", "matmul", "conv2d"};
  return s;
}

const std::set<std::string>& AmpBlackList() {
  static const std::set<std::string> s = {"exp",
                                          "log",
                                          "square",
                                          "mean",
                                          "reduce_mean",
                                          "reduce_sum",
                                          "sum",
                                          "softmax",
                                          "log_softmax",
                                          "cross_entropy",
                                          "softmax_with_cross_entropy",
                                          "lookup_table",
                                          "squared_l2_norm"};
  return s;
}

const std::set<std::string>& AmpGrayList() {
  static const std::set<std::string> s = {
      "elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div", "elementwise_max",
      "elementwise_min", "elementwise_pow", "batch_norm", "layer_norm", "tanh", "sigmoid", "gelu",
      "relu", "leaky_relu", "pool2d", "dropout", "top_k", "scale", "reshape", "transpose",
      "flatten", "squeeze", "unsqueeze", "concat", "split", "slice", "clip", "assign", "cast",
      "fill_constant", "uniform_random", "gaussian_random",
      // Tensor parallelism's collectives carry what their
      // producer makes (a row-parallel product is summed
      // in 16 bits, as Megatron does).
      "c_identity", "mp_allreduce_sum", "c_split", "c_concat"};
  return s;
}

std::string AmpDTypeSuffix(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
    case DType::kFloat32:
      return "fp32";
    default:
      KEEL_THROW("amp: no cast suffix for dtype ", DTypeName(dtype));
  }
}

AmpPass::AmpPass(AmpOptions options) : options_(std::move(options)) {
  KEEL_ENFORCE(options_.dtype == DType::kBFloat16 || options_.dtype == DType::kFloat16,
               "amp: dtype must be bfloat16 or float16, got ", DTypeName(options_.dtype));
  for (const std::string& t : options_.white_list)
    KEEL_ENFORCE(!options_.black_list.count(t), "amp: op type '", t,
                 "' is in both custom_white_list and custom_black_list");
  for (const auto* list : {&options_.white_list, &options_.black_list})
    for (const std::string& t : *list)
      KEEL_ENFORCE(OpRegistry::Find(t) != nullptr, "amp: custom list names op type '", t,
                   "', which keel does not have");
}

namespace {

enum class Kind { kWhite, kBlack, kGray, kOther };

bool IsFloat(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16 ||
         t == DType::kFloat64;
}

// Whether `type` (and its grad op, when it has one) has a kernel for (place, dtype).
bool CanRunLow(const std::string& type, Place::Kind place, DType dtype) {
  if (!OpRegistry::HasKernel(type, place, dtype)) return false;
  const std::string grad = type + "_grad";
  return OpRegistry::Find(grad) == nullptr || OpRegistry::HasKernel(grad, place, dtype);
}

// Logged once per (op type, dtype, place) per process.
void LogFallback(const std::string& type, DType dtype, Place::Kind place) {
  static std::mutex mu;
  static std::set<std::string> told;
  const std::string key =
      type + "/" + DTypeName(dtype) + "/" + (place == Place::Kind::kCUDA ? "CUDA" : "CPU");
  std::lock_guard<std::mutex> lock(mu);
  if (!told.insert(key).second) return;
  LOG(INFO) << "amp: op " << type << " has no " << DTypeName(dtype) << " kernel on "
            << (place == Place::Kind::kCUDA ? "CUDA" : "the CPU") << "; it runs in float32";
}

// The input slots of `op` the pass converts (batch/layer norm: X only).
bool CastsSlot(const OpDesc& op, const std::string& slot) {
  if (op.type() == "batch_norm" || op.type() == "layer_norm") return slot == "X";
  return true;
}

}  // namespace

std::string AmpMasterName(const std::string& param) { return param + ".master"; }

void AmpPass::MakeParametersLow(Program& main, Program& startup) const {
  Block& block = main.global_block();
  Block& sb = startup.global_block();
  std::map<std::string, std::vector<size_t>> readers;
  for (size_t i = 0; i < block.num_ops(); ++i)
    for (const std::string& in : block.op(i)->InputArgumentNames()) readers[in].push_back(i);
  std::map<std::string, std::string> param_of;  // cast var -> the parameter it copies
  std::vector<size_t> drop;
  o2_params_.clear();
  for (VarDesc* v : block.AllVars()) {
    if (!v->is_parameter() || v->dtype() != DType::kFloat32) continue;
    auto it = readers.find(v->name());
    if (it == readers.end()) continue;
    bool only_casts = true;
    for (size_t i : it->second) {
      const OpDesc& op = *block.op(i);
      only_casts &=
          op.type() == "cast" && op.Attr<int>("out_dtype") == static_cast<int>(options_.dtype);
    }
    if (!only_casts) continue;
    KEEL_ENFORCE(sb.FindVar(v->name()) != nullptr, "amp O2: parameter '", v->name(),
                 "' is not initialized by the startup program");
    KEEL_ENFORCE(block.FindVar(AmpMasterName(v->name())) == nullptr,
                 "amp O2: the program already has a var named '", AmpMasterName(v->name()),
                 "' (rewritten twice?)");
    for (size_t i : it->second) {
      param_of[block.op(i)->Output("Out")[0]] = v->name();
      drop.push_back(i);
    }
    o2_params_.push_back(v->name());
  }
  std::sort(drop.begin(), drop.end());
  for (size_t k = drop.size(); k-- > 0;) block.RemoveOp(drop[k]);
  for (const auto& [cast, param] : param_of) block.RemoveVar(cast);
  for (size_t i = 0; i < block.num_ops(); ++i) {
    OpDesc* op = block.op(i);
    for (const auto& [slot, args] : op->inputs()) {
      std::vector<std::string> renamed = args;
      bool changed = false;
      for (std::string& a : renamed) {
        auto p = param_of.find(a);
        if (p == param_of.end()) continue;
        a = p->second;
        changed = true;
      }
      if (changed) op->SetInput(slot, renamed);
    }
  }
  // The masters, and startup initializing them in the parameters' place.
  std::set<std::string> low(o2_params_.begin(), o2_params_.end());
  for (const std::string& name : o2_params_) {
    VarDesc* p = block.MustFindVar(name);
    const std::string master = AmpMasterName(name);
    for (Block* b : {&block, &sb}) {
      VarDesc* m = b->Var(master);
      m->set_shape(p->shape());
      m->set_dtype(DType::kFloat32);
      m->set_persistable(true);
      m->set_stop_gradient(true);
    }
    p->set_dtype(options_.dtype);
  }
  for (size_t i = 0; i < sb.num_ops(); ++i) {
    OpDesc* op = sb.op(i);
    for (const auto& [slot, args] : op->outputs()) {
      std::vector<std::string> renamed = args;
      bool changed = false;
      for (std::string& a : renamed)
        if (low.count(a)) {
          a = AmpMasterName(a);
          changed = true;
        }
      if (changed) op->SetOutput(slot, renamed);
    }
  }
  for (const std::string& name : o2_params_) {
    sb.MustFindVar(name)->set_dtype(options_.dtype);
    OpDesc* cast = sb.AppendOp("cast");
    cast->SetInput("X", {AmpMasterName(name)});
    cast->SetOutput("Out", {name});
    cast->SetAttr("in_dtype", static_cast<int>(DType::kFloat32));
    cast->SetAttr("out_dtype", static_cast<int>(options_.dtype));
    cast->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kForward));
    InferShapeAtBuild(cast, &sb);
  }
  startup.Touch();
}

void AmpPass::Apply(Program& main, Program& startup) const {
  Block& block = main.global_block();
  for (size_t i = 0; i < block.num_ops(); ++i) {
    const OpDesc& op = *block.op(i);
    if (op.HasAttr(kOpRoleAttr)) {
      const int role = op.Attr<int>(kOpRoleAttr);
      KEEL_ENFORCE(
          (role & (static_cast<int>(OpRole::kBackward) | static_cast<int>(OpRole::kOptimize))) == 0,
          "amp: the program already has backward or optimizer ops (op ", i, ", ", op.type(),
          "); AMP rewrites the forward program before backward");
    }
  }

  auto kind_of = [&](const std::string& type) {
    if (options_.white_list.count(type)) return Kind::kWhite;
    if (options_.black_list.count(type)) return Kind::kBlack;
    if (AmpWhiteList().count(type)) return Kind::kWhite;
    if (AmpBlackList().count(type)) return Kind::kBlack;
    if (AmpGrayList().count(type)) return Kind::kGray;
    return Kind::kOther;
  };

  // Classification, in program order: the producer of each var so far and its class.
  std::map<std::string, bool> produced_low;  // var -> written by an op classified white
  std::map<std::string, bool> produced_f32;  // var -> written by an op classified black
  std::vector<bool> low(block.num_ops(), false);
  for (size_t i = 0; i < block.num_ops(); ++i) {
    const OpDesc& op = *block.op(i);
    const Kind kind = kind_of(op.type());
    bool is_low = false;
    if (kind == Kind::kWhite) {
      is_low = true;
    } else if (kind == Kind::kGray) {
      bool from_black = false, from_white = false;
      for (const std::string& in : op.InputArgumentNames()) {
        if (produced_f32.count(in) && produced_f32[in]) from_black = true;
        if (produced_low.count(in) && produced_low[in]) from_white = true;
      }
      is_low = from_white && !from_black;
    }
    if (is_low && options_.check_kernels && !CanRunLow(op.type(), options_.place, options_.dtype)) {
      LogFallback(op.type(), options_.dtype, options_.place);
      is_low = false;
    }
    // Gray ops fed by parameters and data only stay as they are (float32) and count as neither.
    const bool counts_black = !is_low && !(kind == Kind::kGray);
    const bool gray_undecided = kind == Kind::kGray && !is_low;
    bool gray_black = false;
    if (gray_undecided)
      for (const std::string& in : op.InputArgumentNames())
        if (produced_f32.count(in) && produced_f32[in]) gray_black = true;
    for (const std::string& out : op.OutputArgumentNames()) {
      produced_low[out] = is_low;
      produced_f32[out] = counts_black || gray_black;
    }
    low[i] = is_low;
  }

  // Rewrite: casts before each op, reusing a cast var until its source is written again.
  std::map<std::pair<std::string, DType>, std::string> cast_of;  // (source, dtype) -> cast var
  const std::string low_suffix = AmpDTypeSuffix(options_.dtype);
  size_t orig = 0;
  for (size_t i = 0; i < block.num_ops(); ++i, ++orig) {
    OpDesc* op = block.op(i);
    const DType want = low[orig] ? options_.dtype : DType::kFloat32;
    // Which inputs to convert: to `want` from the other float precision of the pair.
    std::vector<std::string> renames_from, renames_to;
    for (const auto& [slot, args] : op->inputs()) {
      if (!CastsSlot(*op, slot)) continue;
      for (const std::string& in : args) {
        const VarDesc* v = block.FindVarRecursive(in);
        if (v == nullptr || !IsFloat(v->dtype()) || v->dtype() == DType::kFloat64) continue;
        if (v->dtype() == want) continue;
        auto key = std::make_pair(in, want);
        auto it = cast_of.find(key);
        std::string cast_name;
        if (it != cast_of.end()) {
          cast_name = it->second;
        } else {
          cast_name = in + ".cast_" + (want == DType::kFloat32 ? std::string("fp32") : low_suffix);
          // A name the program already has (a second cast after the source was rewritten)
          // gets a fresh one.
          if (block.FindVarRecursive(cast_name)) cast_name = main.UniqueName(cast_name + "_");
          VarDesc* cv = block.Var(cast_name);
          cv->set_dtype(want);
          cv->set_shape(v->shape());
          cv->set_stop_gradient(v->stop_gradient());
          OpDesc* cast = block.InsertOp(i, "cast");
          cast->SetInput("X", {in});
          cast->SetOutput("Out", {cast_name});
          cast->SetAttr("in_dtype", static_cast<int>(v->dtype()));
          cast->SetAttr("out_dtype", static_cast<int>(want));
          cast->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kForward));
          // The consumer's pipeline stage, if it has one (the cast is built where it is read).
          if (op->HasAttr(kOpDeviceAttr)) cast->SetAttr(kOpDeviceAttr, op->GetAttr(kOpDeviceAttr));
          InferShapeAtBuild(cast, &block);
          ++i;
          op = block.op(i);
          cast_of[key] = cast_name;
        }
        renames_from.push_back(in);
        renames_to.push_back(cast_name);
      }
    }
    for (size_t k = 0; k < renames_from.size(); ++k) {
      // Only the slots the pass converts (batch norm's Scale may share no name with X anyway).
      for (const auto& [slot, args] : op->inputs()) {
        if (!CastsSlot(*op, slot)) continue;
        std::vector<std::string> renamed = args;
        bool changed = false;
        for (std::string& a : renamed)
          if (a == renames_from[k]) {
            a = renames_to[k];
            changed = true;
          }
        if (changed) op->SetInput(slot, renamed);
      }
    }
    InferShapeAtBuild(op, &block);
    // What this op writes invalidates casts of it.
    for (const std::string& out : op->OutputArgumentNames()) {
      cast_of.erase({out, DType::kFloat32});
      cast_of.erase({out, options_.dtype});
    }
  }
  if (options_.o2) MakeParametersLow(main, startup);
  main.Touch();
}

}  // namespace transpiler
}  // namespace keel
