// Optimizer update ops and gradient clipping. Every XOut is normally the same variable as X:
// updates are in place.
//
//   sgd        param -= lr * g
//   momentum   v = mu * v + g;  param -= lr * (g + mu * v) (use_nesterov) or lr * v
//   adam       (Paddle's form, t = 1, 2, ... the step; Beta1Pow = beta1^t on entry)
//              m1 = beta1 * m1 + (1 - beta1) * g;  m2 = beta2 * m2 + (1 - beta2) * g^2
//              lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
//              param -= lr_t * m1 / (sqrt(m2) + epsilon * sqrt(1 - beta2^t))
//              Beta1Pow *= beta1;  Beta2Pow *= beta2
//   adamw      param -= lr * coeff * param (decoupled weight decay, Paddle 2), then adam
//   squared_l2_norm       Out = sum(X^2), shape [1]
//   clip_by_global_norm   norm = sqrt(sum_i sum(X_i^2));
//                         Out_i = X_i * clip_norm / max(norm, clip_norm)
// The kernels are in optimizer_ops.h; here are the shapes, the CPU math, the CPU's merged ops and
// the registrations.
#include "ops/optimizer_ops.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/op_util.h"

namespace keel {
namespace {

// Param and Grad agree in shape and dtype, or Grad is float16 / bfloat16 for a float32 Param of an
// op that widens it (OpTraits::widens_inputs: a gradient all-reduced in 16 bits, fp16_allreduce);
// LearningRate holds one element.
void CheckParamGradLr(InferShapeContext& ctx) {
  DDim p = ctx.GetInputDim("Param");
  DDim g = ctx.GetInputDim("Grad");
  DDim lr = ctx.GetInputDim("LearningRate");
  KEEL_SHAPE_CHECK(ctx.DimsEq(p, g), "Param ", p.str(), " and Grad ", g.str(),
                   " must have the same shape");
  const DType pt = ctx.GetInputDType("Param"), gt = ctx.GetInputDType("Grad");
  const bool widened = pt == DType::kFloat32 && (gt == DType::kFloat16 || gt == DType::kBFloat16) &&
                       OpRegistry::Traits(ctx.op().type()).WidensInput("Grad");
  KEEL_SHAPE_CHECK(pt == gt || widened, "Param is ", DTypeName(pt), ", Grad is ", DTypeName(gt),
                   "; they must match",
                   pt == DType::kFloat32
                       ? " (or Grad be float16 / bfloat16, which " + ctx.op().type() + " widens)"
                       : std::string());
  KEEL_SHAPE_CHECK(lr.numel() == 1 || (!ctx.IsRuntime() && lr.numel() < 0),
                   "LearningRate must hold one element, got ", lr.str());
}

// The dtype of the update's math and accumulators: Param's, or float32 for a float16 / bfloat16
// Param (multi_precision: the update runs on its float32 MasterParam).
DType UpdateDType(InferShapeContext& ctx) {
  const DType p = ctx.GetInputDType("Param");
  return p == DType::kFloat16 || p == DType::kBFloat16 ? DType::kFloat32 : p;
}

// Input `slot` (an accumulator) has Param's shape and the update's dtype; output `out` gets them.
void CheckLikeParam(InferShapeContext& ctx, const std::string& slot, const std::string& out) {
  DDim p = ctx.GetInputDim("Param");
  DDim a = ctx.GetInputDim(slot);
  KEEL_SHAPE_CHECK(ctx.DimsEq(p, a), "Param ", p.str(), " and ", slot, " ", a.str(),
                   " must have the same shape");
  KEEL_SHAPE_CHECK(UpdateDType(ctx) == ctx.GetInputDType(slot), "Param is ",
                   DTypeName(ctx.GetInputDType("Param")), ", ", slot, " is ",
                   DTypeName(ctx.GetInputDType(slot)), "; it must be ", DTypeName(UpdateDType(ctx)),
                   UpdateDType(ctx) != ctx.GetInputDType("Param")
                       ? " (the accumulators of a 16-bit parameter are float32: multi_precision)"
                       : "");
  ctx.SetOutputDim(out, p);
  ctx.SetOutputDType(out, UpdateDType(ctx));
}

// multi_precision (AMP O2; Paddle's attr of that name is implied by the slot): a float16 /
// bfloat16 Param needs MasterParam, float32 of its shape; MasterParamOut gets MasterParam's shape
// and dtype. Other Params take none.
void CheckMaster(InferShapeContext& ctx) {
  const DType p = ctx.GetInputDType("Param");
  const bool low = p == DType::kFloat16 || p == DType::kBFloat16;
  const bool has = ctx.HasInput("MasterParam");
  KEEL_SHAPE_CHECK(low == has, "Param is ", DTypeName(p),
                   low ? ", which needs MasterParam, its float32 master copy (multi_precision)"
                       : ", which takes no MasterParam (only float16/bfloat16 parameters do)");
  if (!has) return;
  KEEL_SHAPE_CHECK(ctx.HasOutput("MasterParamOut"), "MasterParam needs MasterParamOut");
  const DDim m = ctx.GetInputDim("MasterParam");
  KEEL_SHAPE_CHECK(ctx.DimsEq(ctx.GetInputDim("Param"), m) &&
                       ctx.GetInputDType("MasterParam") == DType::kFloat32,
                   "MasterParam must be float32 of Param's shape ", ctx.GetInputDim("Param").str(),
                   ", got ", DTypeName(ctx.GetInputDType("MasterParam")), " ", m.str());
  ctx.ShareDimAndDType("MasterParam", "MasterParamOut");
}

// Input `slot` holds one float element; output `out` gets its shape and dtype.
void CheckScalar(InferShapeContext& ctx, const std::string& slot, const std::string& out) {
  DDim d = ctx.GetInputDim(slot);
  KEEL_SHAPE_CHECK(d.numel() == 1 || (!ctx.IsRuntime() && d.numel() < 0), slot,
                   " must hold one element, got ", d.str());
  DType t = ctx.GetInputDType(slot);
  KEEL_SHAPE_CHECK(t == DType::kFloat32 || t == DType::kFloat64, slot,
                   " must be float32 or float64, got ", DTypeName(t));
  ctx.ShareDimAndDType(slot, out);
}

// Writes v into the one-element tensor `out` in its own dtype (float32 or float64).
void SetScalar(Tensor* out, double v, const Place& place) {
  if (out->dtype() == DType::kFloat64) {
    *out->mutable_data<double>(place) = v;
  } else {
    *out->mutable_data<float>(place) = static_cast<float>(v);
  }
}

// ------------------------------------------------------------------------------------------ sgd

void SgdShape(InferShapeContext& ctx) {
  CheckParamGradLr(ctx);
  CheckMaster(ctx);
  ctx.SetOutputDim("ParamOut", ctx.GetInputDim("Param"));
  ctx.SetOutputDType("ParamOut", ctx.GetInputDType("Param"));
}
// ------------------------------------------------------------------------------------- momentum

void MomentumShape(InferShapeContext& ctx) {
  CheckParamGradLr(ctx);
  CheckMaster(ctx);
  CheckLikeParam(ctx, "Velocity", "VelocityOut");
  ctx.SetOutputDim("ParamOut", ctx.GetInputDim("Param"));
  ctx.SetOutputDType("ParamOut", ctx.GetInputDType("Param"));
}

// ---------------------------------------------------------------------------------- adam, adamw

void AdamShape(InferShapeContext& ctx) {
  CheckParamGradLr(ctx);
  CheckMaster(ctx);
  CheckLikeParam(ctx, "Moment1", "Moment1Out");
  CheckLikeParam(ctx, "Moment2", "Moment2Out");
  CheckScalar(ctx, "Beta1Pow", "Beta1PowOut");
  CheckScalar(ctx, "Beta2Pow", "Beta2PowOut");
  ctx.SetOutputDim("ParamOut", ctx.GetInputDim("Param"));
  ctx.SetOutputDType("ParamOut", ctx.GetInputDType("Param"));
}

// ------------------------------------------------- merged_sgd, merged_momentum, merged_adam(w)

// The merged ops update a list of parameters with one op (Paddle's merged_momentum /
// merged_adam): every list slot holds one var per parameter, LearningRate is shared. The merge
// pass forms them from the per-parameter ops of a fused gradient group, so that the CUDA kernel
// updates the group in one launch. On the CPU each parameter runs the per-parameter kernel
// itself, so results are those of the separate ops, bit for bit.

// The list slots of a merged op and the input each output list mirrors.
struct MergedSlots {
  std::vector<std::string> inputs;                           // besides Param and LearningRate
  std::vector<std::pair<std::string, std::string>> outputs;  // (output, its input)
};
const MergedSlots& SlotsOf(const std::string& single) {
  static const MergedSlots sgd{{"Grad"}, {{"ParamOut", "Param"}}};
  static const MergedSlots momentum{{"Grad", "Velocity"},
                                    {{"ParamOut", "Param"}, {"VelocityOut", "Velocity"}}};
  static const MergedSlots adam{{"Grad", "Moment1", "Moment2", "Beta1Pow", "Beta2Pow"},
                                {{"ParamOut", "Param"},
                                 {"Moment1Out", "Moment1"},
                                 {"Moment2Out", "Moment2"},
                                 {"Beta1PowOut", "Beta1Pow"},
                                 {"Beta2PowOut", "Beta2Pow"}}};
  if (single == "sgd") return sgd;
  if (single == "momentum") return momentum;
  return adam;
}

// Every list has one var per Param; parameter i's slots pass the per-parameter op's checks.
void MergedShape(InferShapeContext& ctx) {
  const std::string single = ctx.op().type().substr(std::string("merged_").size());
  const MergedSlots& slots = SlotsOf(single);
  const int n = ctx.NumInputs("Param");
  KEEL_SHAPE_CHECK(n > 0, "needs at least one Param");
  for (const std::string& in : slots.inputs)
    KEEL_SHAPE_CHECK(ctx.NumInputs(in) == n, in, " lists ", ctx.NumInputs(in), " vars for ", n,
                     " Params");
  for (const auto& [out, in] : slots.outputs)
    KEEL_SHAPE_CHECK(ctx.NumOutputs(out) == n, out, " lists ", ctx.NumOutputs(out), " vars for ", n,
                     " Params");
  const DDim lr = ctx.GetInputDim("LearningRate");
  KEEL_SHAPE_CHECK(lr.numel() == 1 || (!ctx.IsRuntime() && lr.numel() < 0),
                   "LearningRate must hold one element, got ", lr.str());
  const bool scalar_pow = single == "adam" || single == "adamw";
  for (int i = 0; i < n; ++i) {
    const DDim p = ctx.GetInputDim("Param", i);
    const DType pt = ctx.GetInputDType("Param", i);
    for (const std::string& in : slots.inputs) {
      if (scalar_pow && (in == "Beta1Pow" || in == "Beta2Pow")) {
        const DDim d = ctx.GetInputDim(in, i);
        KEEL_SHAPE_CHECK(d.numel() == 1 || (!ctx.IsRuntime() && d.numel() < 0), in, "[", i, "] (",
                         ctx.InputName(in, i), ") must hold one element, got ", d.str());
        continue;
      }
      KEEL_SHAPE_CHECK(ctx.DimsEq(p, ctx.GetInputDim(in, i)) && ctx.GetInputDType(in, i) == pt, in,
                       "[", i, "] (", ctx.InputName(in, i), ") ", ctx.GetInputDim(in, i).str(), " ",
                       DTypeName(ctx.GetInputDType(in, i)), " must match Param[", i, "] (",
                       ctx.InputName("Param", i), ") ", p.str(), " ", DTypeName(pt));
    }
    for (const auto& [out, in] : slots.outputs) ctx.ShareDimAndDType(in, out, i);
  }
}

// The per-parameter kernel of type `single` with the merged op's attrs.
template <typename K>
std::unique_ptr<OpKernel> MakeSingle(const OpDesc& desc) {
  if constexpr (std::is_constructible_v<K, const OpDesc&>) {
    return std::make_unique<K>(desc);
  } else {
    return std::make_unique<K>();
  }
}

template <typename T, template <typename, typename> class Single>
class MergedKernel : public OpKernel {
 public:
  explicit MergedKernel(const OpDesc& op) : desc_(op.type().substr(std::string("merged_").size())) {
    for (const auto& [name, value] : op.attrs()) desc_.SetAttr(name, value);
    single_ = MakeSingle<Single<CPUDevice, T>>(desc_);
  }
  void Compute(ExecutionContext& ctx) override {
    const int n = ctx.NumInputs("Param");
    // Parameter i's context: the i-th var of each list slot, the shared LearningRate. Built once;
    // the executor resolves a context's vars once per plan.
    if (subs_.size() != static_cast<size_t>(n) || first_ != ctx.input_slots()[0].vars[0]) {
      subs_.clear();
      for (int i = 0; i < n; ++i) {
        ExecutionContext sub(&desc_, ctx.place());
        for (const auto& s : ctx.input_slots())
          sub.AddInput(s.name, {s.vars.size() == static_cast<size_t>(n) ? s.vars[i] : s.vars[0]});
        for (const auto& s : ctx.output_slots()) {
          sub.AddOutput(s.name, {s.vars[i]},
                        i < static_cast<int>(s.dtypes.size()) ? std::vector<DType>{s.dtypes[i]}
                                                              : std::vector<DType>{});
        }
        subs_.push_back(std::move(sub));
      }
      first_ = ctx.input_slots()[0].vars[0];
    }
    for (ExecutionContext& sub : subs_) single_->Compute(sub);
  }

 private:
  OpDesc desc_;
  std::unique_ptr<OpKernel> single_;
  std::vector<ExecutionContext> subs_;
  const Variable* first_ = nullptr;
};

template <typename T>
using MergedSgdKernel = MergedKernel<T, SgdKernel>;
template <typename T>
using MergedMomentumKernel = MergedKernel<T, MomentumKernel>;
template <typename T>
using MergedAdamKernel = MergedKernel<T, AdamKernel>;
template <typename T>
using MergedAdamWKernel = MergedKernel<T, AdamWKernel>;

// ---------------------------------------------------------- squared_l2_norm, clip_by_global_norm

void SquaredL2NormShape(InferShapeContext& ctx) {
  ctx.SetOutputDim("Out", DDim{1});
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

void ClipByGlobalNormShape(InferShapeContext& ctx) {
  const int n = ctx.NumInputs("X");
  KEEL_SHAPE_CHECK(ctx.NumOutputs("Out") == n, "Out must list as many vars as X (", n, "), got ",
                   ctx.NumOutputs("Out"));
  const DType t = ctx.GetInputDType("X", 0);
  for (int i = 0; i < n; ++i) {
    KEEL_SHAPE_CHECK(ctx.GetInputDType("X", i) == t, "X[", i, "] (", ctx.InputName("X", i), ") is ",
                     DTypeName(ctx.GetInputDType("X", i)), ", X[0] is ", DTypeName(t),
                     "; all must match");
    ctx.ShareDimAndDType("X", "Out", i);
  }
  if (ctx.HasOutput("GlobalNorm")) {
    ctx.SetOutputDim("GlobalNorm", DDim{1});
    ctx.SetOutputDType("GlobalNorm", t);
  }
}

std::string CheckPositive(const Attribute& a) {
  return std::get<float>(a) > 0 ? "" : "must be > 0";
}
std::string CheckUnitInterval(const Attribute& a) {
  float v = std::get<float>(a);
  return v >= 0 && v < 1 ? "" : "must be in [0, 1)";
}

}  // namespace

template <typename T>
struct AdamMath<CPUDevice, T> {
  // The math of fn::Adam (the CUDA kernel's), kept as Eigen expressions here: the per-element
  // functor loop rounds differently on this CPU (measured: parameters after 10 MLP steps differ in
  // the last bits), and CPU results stay as they were.
  static void Update(const ExecutionContext& ctx, const AdamIO<CPUDevice, T>& io, double beta1,
                     double beta2, double epsilon, double coeff) {
    const double b1_pow = io.b1p.Get(), b2_pow = io.b2p.Get();
    if (io.skip != nullptr && *io.skip) {
      for (auto [src, dst] : {std::pair{io.p, io.po}, {io.m1, io.m1o}, {io.m2, io.m2o}})
        if (src != dst) std::copy_n(src, io.n, dst);
      SetScalar(io.b1o, b1_pow, ctx.place());
      SetScalar(io.b2o, b2_pow, ctx.place());
      return;
    }
    const fn::Adam<T> a =
        fn::AdamStep<T>(io.lr.Get(), b1_pow, b2_pow, beta1, beta2, epsilon, coeff);
    const int64_t n = io.n;
    ConstVec<T> p(io.p, n), g(io.g, n), m1(io.m1, n), m2(io.m2, n);
    Vec<T> m1_out(io.m1o, n), m2_out(io.m2o, n), p_out(io.po, n);
    m1_out = a.b1 * m1 + (T(1) - a.b1) * g;
    m2_out = a.b2 * m2 + (T(1) - a.b2) * g.square();
    p_out = a.decay * p - a.lr_t * (m1_out / (m2_out.sqrt() + a.eps_hat));
    SetScalar(io.b1o, b1_pow * beta1, ctx.place());
    SetScalar(io.b2o, b2_pow * beta2, ctx.place());
  }
};

// Eigen sums of squares in double.
template <typename T>
class GlobalNormMath<CPUDevice, T> {
 public:
  static double SumOfSquares(const Tensor& x) {
    return static_cast<double>(ConstVec<T>(x.data<T>(), x.numel()).square().sum());
  }

  void SquaredL2(const ExecutionContext&, const Tensor& x, T* out) {
    *out = static_cast<T>(SumOfSquares(x));
  }

  void ClipByGlobalNorm(const ExecutionContext& ctx, const std::vector<const Tensor*>& xs,
                        const std::vector<Tensor*>& outs, double clip_norm, T* global_norm) {
    double sum_sq = 0;
    for (const Tensor* x : xs) sum_sq += SumOfSquares(*x);
    const double norm = std::sqrt(sum_sq);
    const T scale = static_cast<T>(fn::GlobalNormScale(norm, clip_norm));
    for (size_t i = 0; i < xs.size(); ++i) {
      const int64_t n = xs[i]->numel();
      T* out = outs[i]->mutable_data<T>(ctx.place());
      if (scale != T(1)) {
        Vec<T>(out, n) = scale * ConstVec<T>(xs[i]->data<T>(), n);
      } else if (out != xs[i]->data<T>()) {
        std::copy_n(xs[i]->data<T>(), n, out);
      }
    }
    if (global_norm) *global_norm = T(norm);
  }
};

KEEL_REGISTER_OP(sgd)
    .Doc("ParamOut = Param - LearningRate * Grad, in place when ParamOut is Param.")
    .Input("Param", "the parameter")
    .Input("Grad",
           "its gradient, shape of Param; of Param's dtype, or float16 / bfloat16 for a float32 "
           "Param (widened as read)")
    .Input("LearningRate", "[1] float tensor")
    .OptionalInput("SkipUpdate",
                   "[1] bool, optional: when true, nothing changes (mixed precision skips a step "
                   "whose gradients overflowed)")
    .Output("ParamOut", "the updated parameter (usually the Param variable itself)")
    .OptionalInput("MasterParam",
                   "float32 [shape of Param] (multi_precision): the master copy a float16 / "
                   "bfloat16 Param is rounded from (AMP O2); the update runs on it in float32")
    .OptionalOutput("MasterParamOut", "the updated master (usually MasterParam itself)")
    .Shape(SgdShape)
    .KernelDTypeFrom("Param")
    .AcceptsRowSparse("Grad")
    .WidensInput("Grad");
KEEL_REGISTER_KERNEL(CPU, sgd, SgdKernel, float, double, float16, bfloat16);

KEEL_REGISTER_OP(momentum)
    .Doc(
        "VelocityOut = mu * Velocity + Grad; ParamOut = Param - LearningRate * VelocityOut, or "
        "Param - LearningRate * (Grad + mu * VelocityOut) with use_nesterov. In place.")
    .Input("Param", "the parameter")
    .Input("Grad",
           "its gradient, shape of Param; of Param's dtype, or float16 / bfloat16 for a float32 "
           "Param (widened as read)")
    .Input("Velocity", "the velocity accumulator, shape of Param")
    .Input("LearningRate", "[1] float tensor")
    .OptionalInput("SkipUpdate",
                   "[1] bool, optional: when true, nothing changes (mixed precision skips a step "
                   "whose gradients overflowed)")
    .Output("ParamOut", "the updated parameter (usually the Param variable itself)")
    .Output("VelocityOut", "the updated velocity (usually the Velocity variable itself)")
    .Attr<float>("mu", 0.9f, "the momentum factor")
    .Attr<bool>("use_nesterov", false, "Nesterov's update")
    .OptionalInput("MasterParam",
                   "float32 [shape of Param] (multi_precision): the master copy a float16 / "
                   "bfloat16 Param is rounded from (AMP O2); the update runs on it in float32")
    .OptionalOutput("MasterParamOut", "the updated master (usually MasterParam itself)")
    .Shape(MomentumShape)
    .KernelDTypeFrom("Param")
    .AcceptsRowSparse("Grad")
    .WidensInput("Grad");
KEEL_REGISTER_KERNEL(CPU, momentum, MomentumKernel, float, double, float16, bfloat16);

// adam and adamw share every slot and attr but adamw's coeff.
static OpSchema& AdamSchema(const std::string& type, const std::string& doc) {
  return OpRegistry::Register(type)
      .Doc(doc)
      .Input("Param", "the parameter")
      .Input("Grad",
             "its gradient, shape of Param; of Param's dtype, or float16 / bfloat16 for a float32 "
             "Param (widened as read)")
      .Input("LearningRate", "[1] float tensor")
      .Input("Moment1", "first-moment accumulator, shape of Param")
      .Input("Moment2", "second-moment accumulator, shape of Param")
      .Input("Beta1Pow", "[1] float: beta1^t")
      .Input("Beta2Pow", "[1] float: beta2^t")
      .OptionalInput("SkipUpdate",
                     "[1] bool, optional: when true, nothing changes (mixed precision skips a step "
                     "whose gradients overflowed)")
      .Output("ParamOut", "the updated parameter (usually Param itself)")
      .Output("Moment1Out", "usually Moment1 itself")
      .Output("Moment2Out", "usually Moment2 itself")
      .Output("Beta1PowOut", "Beta1Pow * beta1 (usually Beta1Pow itself)")
      .Output("Beta2PowOut", "Beta2Pow * beta2 (usually Beta2Pow itself)")
      .Attr<float>("beta1", 0.9f, "decay of the first moment", CheckUnitInterval)
      .Attr<float>("beta2", 0.999f, "decay of the second moment", CheckUnitInterval)
      .Attr<float>("epsilon", 1e-8f, "added to sqrt(Moment2) for stability")
      .Attr<bool>("lazy_mode", false,
                  "with a row-sparse Grad (an is_sparse embedding), update only its rows: the "
                  "other rows keep their values and moments (false: every row's moments decay, "
                  "as with a dense Grad)")
      .OptionalInput("MasterParam",
                     "float32 [shape of Param] (multi_precision): the master copy a float16 / "
                     "bfloat16 Param is rounded from (AMP O2); the update runs on it in float32")
      .OptionalOutput("MasterParamOut", "the updated master (usually MasterParam itself)")
      .AcceptsRowSparse("Grad")
      .WidensInput("Grad");
}

[[maybe_unused]] static OpSchema& keel_op_schema_adam =
    AdamSchema("adam",
               "Paddle's Adam with bias correction; Beta1Pow/Beta2Pow hold beta^t for this step t "
               "(beta at the first step) and are multiplied by beta. In place.")
        .Shape(AdamShape)
        .KernelDTypeFrom("Param");
KEEL_REGISTER_KERNEL(CPU, adam, AdamKernel, float, double, float16, bfloat16);

[[maybe_unused]] static OpSchema& keel_op_schema_adamw =
    AdamSchema("adamw",
               "Param -= LearningRate * coeff * Param (decoupled weight decay), then adam's "
               "update.")
        .Attr<float>("coeff", 0.01f, "the decoupled weight-decay coefficient")
        .Shape(AdamShape)
        .KernelDTypeFrom("Param");
KEEL_REGISTER_KERNEL(CPU, adamw, AdamWKernel, float, double, float16, bfloat16);

// The merged ops: list versions of the slots above (one var per parameter), the same attrs.
static OpSchema& MergedSchema(const std::string& type, const std::string& single) {
  OpSchema& s = OpRegistry::Register(type)
                    .Doc("updates every Param of the lists as " + single +
                         " does, in one op (one CUDA launch); formed by the merge pass from the "
                         "per-parameter ops of a fused gradient group")
                    .InputList("Param", "the parameters")
                    .Input("LearningRate", "[1] float tensor, shared")
                    .OptionalInput("SkipUpdate", "[1] bool, optional, shared: as in " + single);
  for (const std::string& in : SlotsOf(single).inputs)
    s.InputList(in, "one per Param, as in " + single);
  for (const auto& [out, in] : SlotsOf(single).outputs)
    s.OutputList(out, "one per Param (usually the " + in + " vars themselves)");
  // Each parameter's update is the single op's kernel, which reads a row-sparse Grad's rows.
  return s.Shape(MergedShape).KernelDTypeFrom("Param").AcceptsRowSparse("Grad");
}

[[maybe_unused]] static OpSchema& keel_op_schema_merged_sgd = MergedSchema("merged_sgd", "sgd");
KEEL_REGISTER_CPU_KERNEL(merged_sgd, MergedSgdKernel, float, double);
[[maybe_unused]] static OpSchema& keel_op_schema_merged_momentum =
    MergedSchema("merged_momentum", "momentum")
        .Attr<float>("mu", 0.9f, "the momentum factor")
        .Attr<bool>("use_nesterov", false, "Nesterov's update");
KEEL_REGISTER_CPU_KERNEL(merged_momentum, MergedMomentumKernel, float, double);
[[maybe_unused]] static OpSchema& keel_op_schema_merged_adam =
    MergedSchema("merged_adam", "adam")
        .Attr<float>("beta1", 0.9f, "decay of the first moment", CheckUnitInterval)
        .Attr<float>("beta2", 0.999f, "decay of the second moment", CheckUnitInterval)
        .Attr<float>("epsilon", 1e-8f, "added to sqrt(Moment2) for stability")
        .Attr<bool>("lazy_mode", false, "as in adam");
KEEL_REGISTER_CPU_KERNEL(merged_adam, MergedAdamKernel, float, double);
[[maybe_unused]] static OpSchema& keel_op_schema_merged_adamw =
    MergedSchema("merged_adamw", "adamw")
        .Attr<float>("beta1", 0.9f, "decay of the first moment", CheckUnitInterval)
        .Attr<float>("beta2", 0.999f, "decay of the second moment", CheckUnitInterval)
        .Attr<float>("epsilon", 1e-8f, "added to sqrt(Moment2) for stability")
        .Attr<float>("coeff", 0.01f, "the decoupled weight-decay coefficient")
        .Attr<bool>("lazy_mode", false, "as in adamw");
KEEL_REGISTER_CPU_KERNEL(merged_adamw, MergedAdamWKernel, float, double);

KEEL_REGISTER_OP(squared_l2_norm)
    .Doc("Out = sum(X^2); X [3, 4] -> Out [1]. No gradient (clipping and monitoring only).")
    .Input("X", "any shape")
    .Output("Out", "[1], dtype of X")
    .Shape(SquaredL2NormShape);
KEEL_REGISTER_KERNEL(CPU, squared_l2_norm, SquaredL2NormKernel, float, double);

KEEL_REGISTER_OP(clip_by_global_norm)
    .Doc(
        "GlobalNorm = sqrt(sum_i sum(X_i^2)); Out_i = X_i * clip_norm / max(GlobalNorm, "
        "clip_norm). Out is usually X itself (the gradients, clipped in place).")
    .InputList("X", "the gradients, one dtype")
    .OutputList("Out", "X scaled, one per X")
    .OptionalOutput("GlobalNorm", "[1]: the norm before clipping")
    .RequiredAttr<float>("clip_norm", "the largest global norm let through", CheckPositive)
    .Shape(ClipByGlobalNormShape);
KEEL_REGISTER_KERNEL(CPU, clip_by_global_norm, ClipByGlobalNormKernel, float, double);

}  // namespace keel
