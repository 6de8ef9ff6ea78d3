// The op registry: per op type a declared schema (inputs, outputs, attrs with defaults and checks,
// shape inference, grad maker) and kernels keyed by (place, dtype).
//
//   KEEL_REGISTER_OP(mul)
//       .Doc("Out = flatten(X) * flatten(Y)")
//       .Input("X", "left operand, flattened to 2-D at x_num_col_dims")
//       .Input("Y", "right operand")
//       .Output("Out", "the product")
//       .Attr<int>("x_num_col_dims", 1, "dims of X that become rows")
//       .Shape(MulShape)
//       .DefaultGrad();
//   KEEL_REGISTER_GRAD_OP(mul_grad, mul);
//   KEEL_REGISTER_CPU_KERNEL(mul, MulKernel, float, double);
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "framework/ir/program.h"
#include "framework/op/shape_inference.h"
#include "framework/runtime/place.h"

namespace keel {

class ExecutionContext;

class OpKernel {
 public:
  virtual ~OpKernel() = default;
  virtual void Compute(ExecutionContext& ctx) = 0;
  // A CUDA graph replayed this op's captured launches instead of calling Compute: the host-side
  // checks Compute makes of earlier runs (errors kernels reported through DeviceReportSlot).
  virtual void Replayed(ExecutionContext& ctx) {}
};

using KernelFactory = std::function<std::unique_ptr<OpKernel>(const OpDesc&)>;
using InferShapeFn = std::function<void(InferShapeContext&)>;
// Builds the grad ops of a forward op. Outputs named GradVarName(x) for every input x; autodiff
// blanks the ones nobody needs.
using GradOpMakerFn = std::function<std::vector<std::unique_ptr<OpDesc>>(const OpDesc&)>;
// Returns an error message for a bad value, empty when fine.
using AttrCheckFn = std::function<std::string(const Attribute&)>;

struct ArgDef {
  std::string name, doc;
  bool duplicable = false;      // takes a list of vars
  bool dispensable = false;     // may be absent
  bool row_sparse_ok = false;   // an input that may be row-sparse (OpSchema::AcceptsRowSparse)
  std::string row_sparse_attr;  // ... only when this bool attribute is true ("": always)
};

struct AttrDef {
  std::string name, doc;
  Attribute default_value;
  bool required = false;
  AttrCheckFn check;
  // Differs between the ranks of one job by design (a rank, a device id, a node's group): the
  // cross-rank program check compares programs with it set to its default.
  bool per_rank = false;
};

// What the executor must know of an op beyond its slots, declared at registration: the executor,
// the event plan and the CUDA-graph capture read these, never op type names.
struct OpTraits {
  // Runs on its ring's thread and stream (attribute ring_id), overlapping compute, unless its
  // use_calc_stream attribute is set.
  bool on_ring = false;
  // On a ring, reduces X into itself across the ranks: a fused buffer it reduces is placed where
  // the ring reads and writes it without copies.
  bool all_reduces_in_place = false;
  // Why it must run after every earlier op and before every later one ("" : it need not), e.g.
  // it makes a ring that later collectives use.
  std::string barrier;
  // Outputs that are views into one buffer: each var of `slices_slot` is a slice of the var of
  // `fused_slot` ("" : none).
  std::string slices_slot, fused_slot;
  // Why a CUDA graph cannot capture it ("" : it can).
  std::string not_capturable;
  // Each output is computed from the inputs alone, the same whichever other outputs are asked
  // for: a pass may split the op into copies that each write some of its outputs (the
  // data-parallel pass makes a weight gradient ready before the op's input gradient, so its
  // all-reduce overlaps that computation).
  bool outputs_apart = false;
  // A program holding it is model-parallel: each rank's parameters are its own shards of the
  // model, so what one rank holds is not the whole model (fleet refuses rank-0 checkpoints).
  bool shards_model = false;
  // What the op is in one process holding the whole tensors: an op of this type with the same
  // input and output slots and its default attributes (a tensor-parallel collective: assign;
  // a vocabulary-parallel lookup: lookup_table). "": none (fleet's one-process inference model
  // refuses it).
  std::string one_process_form;
  // (output slot, input slot) pairs: the output may be the input's own buffer instead of a copy
  // of it (an identity such as the bias add's input gradient, or a reshape), where the executor
  // allows it: neither var persistable nor data, each written by exactly one op of the program,
  // so neither changes while the other is read. The kernel asks ExecutionContext::MayShare.
  std::vector<std::pair<std::string, std::string>> may_share;
  // Reads X and writes Out = X only to order itself (a stream sync, a barrier): its kernel leaves
  // the values alone, so a pass may point it at another var of the same writer.
  bool only_orders = false;
  // Output slots the op computes in float32 whose var may be float16 or bfloat16 instead (a pass
  // retyped it: transpiler/narrow_grads_pass.h): the kernel then stores each value rounded once,
  // what a cast right after the op would give, bit for bit, and shape inference keeps the 16-bit
  // type (NarrowedDType).
  std::vector<std::string> narrows_outputs;
  // Input slots that may be float16 or bfloat16 where the op computes in float32: the kernel
  // widens each value as it reads it, what a cast before the op would give, bit for bit.
  std::vector<std::string> widens_inputs;
  // Output slots whose results the op can add into the values their vars already hold, instead of
  // overwriting them, when its attribute "accumulate_into" lists the slot (a pass sets it:
  // transpiler/fuse_grad_accumulation_pass.h makes a gradient's op add it into gradient merge's
  // buffer): what a sum of the var and the result right after the op would give.
  std::vector<std::string> accumulates_outputs;
  bool AccumulatesOutput(const std::string& slot) const {
    return std::find(accumulates_outputs.begin(), accumulates_outputs.end(), slot) !=
           accumulates_outputs.end();
  }
  bool NarrowsOutput(const std::string& slot) const {
    return std::find(narrows_outputs.begin(), narrows_outputs.end(), slot) != narrows_outputs.end();
  }
  bool WidensInput(const std::string& slot) const {
    return std::find(widens_inputs.begin(), widens_inputs.end(), slot) != widens_inputs.end();
  }
};

class OpSchema {
 public:
  explicit OpSchema(std::string type) : type_(std::move(type)) {}

  OpSchema& Doc(std::string d) {
    doc_ = std::move(d);
    return *this;
  }
  OpSchema& Input(const std::string& name, const std::string& doc = "") {
    return AddArg(&inputs_, name, doc, false, false);
  }
  OpSchema& OptionalInput(const std::string& name, const std::string& doc = "") {
    return AddArg(&inputs_, name, doc, false, true);
  }
  OpSchema& InputList(const std::string& name, const std::string& doc = "") {
    return AddArg(&inputs_, name, doc, true, false);
  }
  OpSchema& Output(const std::string& name, const std::string& doc = "") {
    return AddArg(&outputs_, name, doc, false, false);
  }
  OpSchema& OptionalOutput(const std::string& name, const std::string& doc = "") {
    return AddArg(&outputs_, name, doc, false, true);
  }
  OpSchema& OutputList(const std::string& name, const std::string& doc = "") {
    return AddArg(&outputs_, name, doc, true, false);
  }
  template <typename T>
  OpSchema& Attr(const std::string& name, T default_value, const std::string& doc = "",
                 AttrCheckFn check = nullptr) {
    attrs_.push_back(AttrDef{name, doc, Attribute(std::in_place_type<T>, std::move(default_value)),
                             false, std::move(check)});
    return *this;
  }
  // An attribute whose value is this process's own (see AttrDef::per_rank).
  template <typename T>
  OpSchema& PerRankAttr(const std::string& name, T default_value, const std::string& doc = "",
                        AttrCheckFn check = nullptr) {
    Attr<T>(name, std::move(default_value), doc, std::move(check));
    attrs_.back().per_rank = true;
    return *this;
  }
  template <typename T>
  OpSchema& RequiredAttr(const std::string& name, const std::string& doc = "",
                         AttrCheckFn check = nullptr) {
    attrs_.push_back(AttrDef{name, doc, Attribute(std::in_place_type<T>), true, std::move(check)});
    return *this;
  }
  OpSchema& Shape(InferShapeFn fn) {
    infer_shape_ = std::move(fn);
    return *this;
  }
  OpSchema& Grad(GradOpMakerFn fn) {
    grad_maker_ = std::move(fn);
    return *this;
  }
  // Grad op "<type>_grad" taking every input, then each output and its grad, producing the grads
  // of every input.
  OpSchema& DefaultGrad();
  // The input slot whose dtype picks the kernel; default: the first input, or attr "dtype".
  OpSchema& KernelDTypeFrom(const std::string& slot) {
    kernel_dtype_slot_ = slot;
    return *this;
  }
  // Traits (OpTraits says what each means to the executor).
  OpSchema& RunsOnRing() {
    traits_.on_ring = true;
    return *this;
  }
  OpSchema& AllReducesInPlace() {
    traits_.on_ring = traits_.all_reduces_in_place = true;
    return *this;
  }
  OpSchema& Barrier(std::string why) {
    traits_.barrier = std::move(why);
    return *this;
  }
  OpSchema& FusesOutputs(std::string slices_slot, std::string fused_slot) {
    traits_.slices_slot = std::move(slices_slot);
    traits_.fused_slot = std::move(fused_slot);
    return *this;
  }
  OpSchema& NotCapturable(std::string why) {
    traits_.not_capturable = std::move(why);
    return *this;
  }
  OpSchema& ComputesOutputsApart() {
    traits_.outputs_apart = true;
    return *this;
  }
  OpSchema& ShardsModel() {
    traits_.shards_model = true;
    return *this;
  }
  OpSchema& OneProcessForm(std::string type) {
    traits_.one_process_form = std::move(type);
    return *this;
  }
  OpSchema& OnlyOrders() {
    traits_.only_orders = true;
    return *this;
  }
  OpSchema& NarrowsOutput(std::string slot) {
    traits_.narrows_outputs.push_back(std::move(slot));
    return *this;
  }
  // Declares the trait and, once, the attribute "accumulate_into" that selects the slots.
  OpSchema& AccumulatesOutput(std::string slot) {
    if (traits_.accumulates_outputs.empty())
      Attr<std::vector<std::string>>(
          "accumulate_into", {},
          "output slots whose results are added into the values their vars hold instead of "
          "overwriting them (gradient merge's buffers: transpiler/fuse_grad_accumulation_pass.h)");
    traits_.accumulates_outputs.push_back(std::move(slot));
    return *this;
  }
  OpSchema& WidensInput(std::string slot) {
    traits_.widens_inputs.push_back(std::move(slot));
    return *this;
  }
  OpSchema& MayShareBuffer(std::string out_slot, std::string in_slot) {
    traits_.may_share.emplace_back(std::move(out_slot), std::move(in_slot));
    return *this;
  }

  // Row-sparse values (VarDesc::row_sparse, the gradients of is_sparse embeddings). Input `slot`
  // may read one: its kernel reads the rows (ValidateProgram refuses row-sparse inputs anywhere
  // else), or only when the op's bool attribute `when` is true. The slot must be declared first.
  OpSchema& AcceptsRowSparse(const std::string& slot, const std::string& when = "");
  bool ReadsRowSparse(const OpDesc& op, const std::string& slot) const;
  // Output `slot` is row-sparse when the op's bool attribute `attr` is true (autodiff marks the
  // variable so).
  OpSchema& WritesRowSparseWhen(const std::string& slot, const std::string& attr) {
    row_sparse_outputs_.emplace_back(slot, attr);
    return *this;
  }
  bool WritesRowSparse(const OpDesc& op, const std::string& slot) const;

  const std::string& type() const { return type_; }
  const std::string& doc() const { return doc_; }
  const std::vector<ArgDef>& inputs() const { return inputs_; }
  const std::vector<ArgDef>& outputs() const { return outputs_; }
  const std::vector<AttrDef>& attrs() const { return attrs_; }
  const InferShapeFn& infer_shape() const { return infer_shape_; }
  const GradOpMakerFn& grad_maker() const { return grad_maker_; }
  bool has_grad() const { return static_cast<bool>(grad_maker_); }
  const std::string& kernel_dtype_slot() const { return kernel_dtype_slot_; }
  const OpTraits& traits() const { return traits_; }
  const ArgDef* FindInput(const std::string& name) const;
  const ArgDef* FindOutput(const std::string& name) const;
  const AttrDef* FindAttr(const std::string& name) const;

  // Fills absent attrs with defaults, then checks slots and attrs; throws keel::Error naming the
  // op. An attribute the schema does not declare is refused (op_role and op_role_var excepted).
  void Complete(OpDesc* op) const;
  // Throws keel::Error naming the op, the attribute and the declared ones for an undeclared attr.
  void CheckNoUnknownAttrs(const OpDesc& op) const;

 private:
  friend class OpRegistry;
  OpSchema& AddArg(std::vector<ArgDef>* v, const std::string& name, const std::string& doc,
                   bool dup, bool disp) {
    v->push_back(ArgDef{name, doc, dup, disp, false, ""});
    return *this;
  }
  std::string type_, doc_;
  std::vector<ArgDef> inputs_, outputs_;
  std::vector<AttrDef> attrs_;
  InferShapeFn infer_shape_;
  GradOpMakerFn grad_maker_;
  std::string kernel_dtype_slot_;
  OpTraits traits_;
  std::vector<std::pair<std::string, std::string>> row_sparse_outputs_;  // slot, bool attr
};

struct KernelKey {
  Place::Kind place;
  DType dtype;
  bool operator<(const KernelKey& o) const {
    return std::tie(place, dtype) < std::tie(o.place, o.dtype);
  }
};

class OpRegistry {
 public:
  static OpSchema& Register(const std::string& type);
  // A grad op whose slots derive from the forward schema: inputs are the forward inputs, outputs
  // and output grads (all optional); outputs are the input grads (optional); attrs are the same.
  // Its shape inference gives each X@GRAD the shape and dtype of X.
  static OpSchema& RegisterGrad(const std::string& grad_type, const std::string& fwd_type);
  static void RegisterKernel(const std::string& type, KernelKey key, KernelFactory f);

  static const OpSchema* Find(const std::string& type);
  // The schema, or a keel::Error listing the known op types.
  static const OpSchema& Get(const std::string& type);
  // The kernel for (place, dtype), or a keel::Error listing what is registered for the op.
  static std::unique_ptr<OpKernel> CreateKernel(const OpDesc& op, const Place& place, DType dtype);
  static bool HasKernel(const std::string& type, Place::Kind place, DType dtype);
  // The op's declared traits; none for a type without a schema.
  static const OpTraits& Traits(const std::string& type);
  static std::vector<std::string> OpTypes();

  // The dtype that picks op's kernel given the block's var descs.
  static DType KernelDType(const OpDesc& op, const Block& block);
};

// A grad op maker for one grad op `grad_type` that reads a chosen part of the forward op. Its
// inputs are the forward vars in `fwd_slots` (input or output slots of the forward op, inputs
// first), then the grads of the forward outputs in `out_grads` (as slot "Out@GRAD"); its outputs
// are the grads of the forward inputs in `in_grads` (as slot "X@GRAD"); it copies the forward
// attrs. Slots are set in that order, the order the program text prints them.
//   .Grad(GradMaker("softmax_grad", {"Out"}, {"Out"}, {"X"}))
//   // softmax_grad(Out: y, Out@GRAD: y@GRAD) -> (X@GRAD: x@GRAD)
GradOpMakerFn GradMaker(std::string grad_type, std::vector<std::string> fwd_slots,
                        std::vector<std::string> out_grads, std::vector<std::string> in_grads);

// Completes `op` against its schema and runs compile-time shape inference over `block`, setting
// output var shapes and dtypes. Errors name the op, its vars and the shapes.
void InferShapeAtBuild(OpDesc* op, Block* block);

// Gives each X@GRAD output the shape and dtype of input X.
void GradShapeFromInputs(InferShapeContext& ctx);

// Attributes every op may carry whatever its schema: op_role and op_role_var.
bool IsFrameworkAttr(const std::string& name);

namespace detail {
template <template <typename> class K, typename T>
KernelFactory MakeFactory() {
  return [](const OpDesc& op) -> std::unique_ptr<OpKernel> {
    if constexpr (std::is_constructible_v<K<T>, const OpDesc&>) {
      return std::make_unique<K<T>>(op);
    } else {
      return std::make_unique<K<T>>();
    }
  };
}
template <template <typename> class K, typename... Ts>
bool RegisterKernels(const char* type, Place::Kind place) {
  (OpRegistry::RegisterKernel(type, KernelKey{place, DTypeOf<Ts>::value}, MakeFactory<K, Ts>()),
   ...);
  return true;
}
}  // namespace detail

}  // namespace keel

#define KEEL_CONCAT_(a, b) a##b
#define KEEL_CONCAT(a, b) KEEL_CONCAT_(a, b)

#define KEEL_REGISTER_OP(type)                                                   \
  [[maybe_unused]] static ::keel::OpSchema& KEEL_CONCAT(keel_op_schema_, type) = \
      ::keel::OpRegistry::Register(#type)

#define KEEL_REGISTER_GRAD_OP(grad_type, fwd_type)                                    \
  [[maybe_unused]] static ::keel::OpSchema& KEEL_CONCAT(keel_op_schema_, grad_type) = \
      ::keel::OpRegistry::RegisterGrad(#grad_type, #fwd_type)

// KEEL_REGISTER_CPU_KERNEL(mul, MulKernel, float, double): MulKernel<T> for each listed T.
#define KEEL_REGISTER_CPU_KERNEL(type, Kernel, ...)                  \
  [[maybe_unused]] static bool KEEL_CONCAT(keel_cpu_kernel_, type) = \
      ::keel::detail::RegisterKernels<Kernel, __VA_ARGS__>(#type, ::keel::Place::Kind::kCPU)

#define KEEL_REGISTER_CUDA_KERNEL(type, Kernel, ...)                  \
  [[maybe_unused]] static bool KEEL_CONCAT(keel_cuda_kernel_, type) = \
      ::keel::detail::RegisterKernels<Kernel, __VA_ARGS__>(#type, ::keel::Place::Kind::kCUDA)
