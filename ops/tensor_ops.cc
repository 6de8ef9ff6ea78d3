// Tensor creation and layout ops: fill_constant, fill_zeros_like, uniform_random,
// gaussian_random, cast, reshape.
//
// dtype attrs are ints holding a keel::DType (0 = float32). Ops without inputs pick their kernel
// from attr "dtype" (the registry's default).
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "ops/op_util.h"
#include "ops/random_fill.h"

namespace keel {
namespace {

template <typename V>
std::string ListStr(const std::vector<V>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Attr check: the int names a dtype kernels compute in (float32/64, int32/64, bool, uint8, int8).
std::string CheckComputeDType(const Attribute& a) {
  int v = std::get<int>(a);
  switch (static_cast<DType>(v)) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8:
      return "";
    default:
      return StrCat(
          "not a dtype kernels compute in (float32=0, float64=1, int32=2, int64=3, "
          "bool=4, uint8=7, int8=8), got ",
          v);
  }
}
// As CheckComputeDType, also allowing -1 ("unset").
std::string CheckOptionalDType(const Attribute& a) {
  return std::get<int>(a) == -1 ? "" : CheckComputeDType(a);
}
std::string CheckShapeAttr(const Attribute& a) {
  for (int64_t d : std::get<std::vector<int64_t>>(a))
    if (d < 0) return "every dim must be >= 0";
  return "";
}

// Out takes its shape from attr "shape" and its dtype from attr "dtype".
void ShapeFromAttrs(InferShapeContext& ctx) {
  ctx.SetOutputDim("Out", DDim(ctx.Attr<std::vector<int64_t>>("shape")));
  ctx.SetOutputDType("Out", static_cast<DType>(ctx.Attr<int>("dtype")));
}

// ---------------------------------------------------------------- fill_constant, fill_zeros_like

template <typename T>
class FillConstantKernel : public OpKernel {
 public:
  explicit FillConstantKernel(const OpDesc& op) : value_(static_cast<T>(op.Attr<float>("value"))) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Out");
    std::fill_n(out->mutable_data<T>(ctx.place()), out->numel(), value_);
  }

 private:
  T value_;
};

template <typename T>
class FillZerosLikeKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Out");
    std::fill_n(out->mutable_data<T>(ctx.place()), out->numel(), T(0));
  }
};

// ---------------------------------------------------------------- uniform_random, gaussian_random

void UniformRandomShape(InferShapeContext& ctx) {
  KEEL_SHAPE_CHECK(ctx.Attr<float>("min") < ctx.Attr<float>("max"), "min ", ctx.Attr<float>("min"),
                   " must be below max ", ctx.Attr<float>("max"));
  ShapeFromAttrs(ctx);
}

// out ~ U[min, max).
template <typename T>
class UniformRandomKernel : public OpKernel {
 public:
  explicit UniformRandomKernel(const OpDesc& op)
      : min_(op.Attr<float>("min")), max_(op.Attr<float>("max")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Out");
    FillUniform(engine_.Get(ctx.seed()), min_, max_, out->mutable_data<T>(ctx.place()),
                out->numel());
  }

 private:
  double min_, max_;
  SeededEngine engine_;
};

void GaussianRandomShape(InferShapeContext& ctx) {
  KEEL_SHAPE_CHECK(ctx.Attr<float>("std") >= 0, "std must be >= 0, got ", ctx.Attr<float>("std"));
  ShapeFromAttrs(ctx);
}

// out ~ N(mean, std^2), by Box-Muller: two normals from two uniforms.
template <typename T>
class GaussianRandomKernel : public OpKernel {
 public:
  explicit GaussianRandomKernel(const OpDesc& op)
      : mean_(op.Attr<float>("mean")), std_(op.Attr<float>("std")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* out = ctx.Output("Out");
    FillGaussian(engine_.Get(ctx.seed()), mean_, std_, out->mutable_data<T>(ctx.place()),
                 out->numel());
  }

 private:
  double mean_, std_;
  SeededEngine engine_;
};

// ---------------------------------------------------------------- cast

// out = static_cast<OutT>(in) elementwise, OutT the C++ type of `out_dtype`.
template <typename InT>
void CastTo(const Tensor& in, DType out_dtype, Tensor* out, const Place& place) {
  const int64_t n = in.numel();
  const InT* src = in.data<InT>();
  VisitDType(out_dtype, [&](auto zero) {
    using OutT = decltype(zero);
    OutT* dst = out->mutable_data<OutT>(place);
    if constexpr (std::is_same_v<InT, OutT>) {
      if (static_cast<const void*>(dst) != static_cast<const void*>(src)) std::copy_n(src, n, dst);
    } else {
      Vec<OutT>(dst, n) = ConstVec<InT>(src, n).template cast<OutT>();
    }
  });
}

void CastShape(InferShapeContext& ctx) {
  const int in_dtype = ctx.Attr<int>("in_dtype");
  const DType x_dtype = ctx.GetInputDType("X");
  KEEL_SHAPE_CHECK(in_dtype == -1 || static_cast<DType>(in_dtype) == x_dtype, "in_dtype ",
                   DTypeName(static_cast<DType>(in_dtype)), " does not match X's dtype ",
                   DTypeName(x_dtype));
  ctx.SetOutputDim("Out", ctx.GetInputDim("X"));
  ctx.SetOutputDType("Out", static_cast<DType>(ctx.Attr<int>("out_dtype")));
}

// cast_grad: Out@GRAD (and X when in_dtype is unset, for its dtype) -> X@GRAD, cast back.
GradOpMakerFn CastGradMaker() {
  GradOpMakerFn with_x = GradMaker("cast_grad", {"X"}, {"Out"}, {"X"});
  GradOpMakerFn without_x = GradMaker("cast_grad", {}, {"Out"}, {"X"});
  return [with_x, without_x](const OpDesc& fwd) {
    return fwd.Attr<int>("in_dtype") == -1 ? with_x(fwd) : without_x(fwd);
  };
}

void CastGradShape(InferShapeContext& ctx) {
  const int in_dtype = ctx.Attr<int>("in_dtype");
  ctx.SetOutputDim(GradVarName("X"), ctx.GetInputDim(GradVarName("Out")));
  ctx.SetOutputDType(GradVarName("X"),
                     in_dtype == -1 ? ctx.GetInputDType("X") : static_cast<DType>(in_dtype));
}

template <typename InT>
class CastKernel : public OpKernel {
 public:
  explicit CastKernel(const OpDesc& op)
      : out_dtype_(static_cast<DType>(op.Attr<int>("out_dtype"))) {}
  void Compute(ExecutionContext& ctx) override {
    CastTo<InT>(ctx.Input("X"), out_dtype_, ctx.Output("Out"), ctx.place());
  }

 private:
  DType out_dtype_;
};

// dx = cast(dout) back to X's dtype; InT is Out's dtype.
template <typename InT>
class CastGradKernel : public OpKernel {
 public:
  explicit CastGradKernel(const OpDesc& op) : in_dtype_(op.Attr<int>("in_dtype")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const DType to = in_dtype_ == -1 ? ctx.Input("X").dtype() : static_cast<DType>(in_dtype_);
    CastTo<InT>(ctx.Input(GradVarName("Out")), to, dx, ctx.place());
  }

 private:
  int in_dtype_;
};

// ---------------------------------------------------------------- reshape

// Out's shape from attr `shape`: 0 copies X's dim at that index, one -1 takes what is left.
// At build time X's unknown (-1) dims make the inferred dim unknown too.
DDim InferReshape(const DDim& in, const std::vector<int>& shape) {
  DDim out;
  int infer_at = -1;
  int64_t known = 1;  // product of the output dims that are known
  bool copies_unknown = false;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    const int s = shape[i];
    if (s == -1) {
      KEEL_SHAPE_CHECK(infer_at < 0, "shape ", ListStr(shape), " has more than one -1");
      infer_at = i;
      out.push_back(-1);
      continue;
    }
    if (s == 0) {
      KEEL_SHAPE_CHECK(i < in.size(), "shape ", ListStr(shape), " copies dim ", i, " (a 0) but X ",
                       in.str(), " has rank ", in.size());
      out.push_back(in[i]);
    } else {
      KEEL_SHAPE_CHECK(s > 0, "shape ", ListStr(shape), " has dim ", s,
                       "; use -1 to infer a dim, 0 to copy X's");
      out.push_back(s);
    }
    if (out[i] < 0) {
      copies_unknown = true;
    } else {
      known *= out[i];
    }
  }
  const int64_t in_numel = in.numel();  // -1 when unknown (build time)
  if (in_numel < 0 || copies_unknown) return out;
  if (infer_at >= 0) {
    KEEL_SHAPE_CHECK(known > 0 && in_numel % known == 0, "cannot reshape X ", in.str(), " (",
                     in_numel, " elements) to shape ", ListStr(shape), ": ", in_numel,
                     " is not a multiple of ", known);
    out[infer_at] = in_numel / known;
  } else {
    KEEL_SHAPE_CHECK(out.numel() == in_numel, "cannot reshape X ", in.str(), " (", in_numel,
                     " elements) to ", out.str(), " (", out.numel(), " elements)");
  }
  return out;
}

void ReshapeShape(InferShapeContext& ctx) {
  ctx.SetOutputDim("Out", InferReshape(ctx.GetInputDim("X"), ctx.Attr<std::vector<int>>("shape")));
  ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
}

}  // namespace

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(fill_constant)
    .Doc("Out = value everywhere. shape {2, 3}, value 1, dtype 0 -> float32 [2, 3] of ones.")
    .Output("Out", "shape `shape`, dtype `dtype`")
    .Attr<std::vector<int64_t>>("shape", {}, "Out's shape", CheckShapeAttr)
    .Attr<float>("value", 0.0f, "the fill value, converted to dtype")
    .Attr<int>("dtype", static_cast<int>(DType::kFloat32), "Out's keel::DType as int",
               CheckComputeDType)
    .Shape(ShapeFromAttrs);
KEEL_REGISTER_CPU_KERNEL(fill_constant, FillConstantKernel, float, double, int32_t, int64_t, bool);

KEEL_REGISTER_OP(fill_zeros_like)
    .Doc("Out = zeros of X's shape and dtype.")
    .Input("X", "any shape and dtype")
    .Output("Out", "shape and dtype of X")
    .Shape(SameShapeAsX);
KEEL_REGISTER_CPU_KERNEL(fill_zeros_like, FillZerosLikeKernel, float, double, int32_t, int64_t,
                         bool);

KEEL_REGISTER_OP(uniform_random)
    .Doc("Out ~ U[min, max). The same seed gives the same values.")
    .NotCapturable("draws its random numbers on the host (a replay would repeat them)")
    .Output("Out", "shape `shape`, dtype `dtype`")
    .Attr<std::vector<int64_t>>("shape", {}, "Out's shape", CheckShapeAttr)
    .Attr<float>("min", -1.0f, "lower bound, inclusive")
    .Attr<float>("max", 1.0f, "upper bound, exclusive")
    .Attr<int>("seed", 0, "0: derived from the program's random_seed (or nondeterministic)")
    .Attr<int>("dtype", static_cast<int>(DType::kFloat32), "Out's keel::DType as int",
               CheckComputeDType)
    .Shape(UniformRandomShape);
KEEL_REGISTER_CPU_KERNEL(uniform_random, UniformRandomKernel, float, double);

KEEL_REGISTER_OP(gaussian_random)
    .Doc("Out ~ N(mean, std^2). The same seed gives the same values.")
    .NotCapturable("draws its random numbers on the host (a replay would repeat them)")
    .Output("Out", "shape `shape`, dtype `dtype`")
    .Attr<std::vector<int64_t>>("shape", {}, "Out's shape", CheckShapeAttr)
    .Attr<float>("mean", 0.0f, "mean of the distribution")
    .Attr<float>("std", 1.0f, "standard deviation, >= 0")
    .Attr<int>("seed", 0, "0: derived from the program's random_seed (or nondeterministic)")
    .Attr<int>("dtype", static_cast<int>(DType::kFloat32), "Out's keel::DType as int",
               CheckComputeDType)
    .Shape(GaussianRandomShape);
KEEL_REGISTER_CPU_KERNEL(gaussian_random, GaussianRandomKernel, float, double);

KEEL_REGISTER_OP(cast)
    .Doc("Out = X converted to out_dtype (float -> int truncates; nonzero -> true).")
    .Input("X", "any shape")
    .Output("Out", "shape of X, dtype out_dtype")
    .RequiredAttr<int>("out_dtype", "Out's keel::DType as int", CheckComputeDType)
    .Attr<int>("in_dtype", -1, "X's keel::DType as int; -1: X's declared dtype", CheckOptionalDType)
    .Shape(CastShape)
    .Grad(CastGradMaker());
KEEL_REGISTER_GRAD_OP(cast_grad, cast).Shape(CastGradShape).KernelDTypeFrom(GradVarName("Out"));
KEEL_REGISTER_CPU_KERNEL(cast, CastKernel, float, double, int32_t, int64_t, bool, uint8_t, int8_t);
KEEL_REGISTER_CPU_KERNEL(cast_grad, CastGradKernel, float, double);

KEEL_REGISTER_OP(reshape)
    .Doc(
        "Out = X with shape `shape`: 0 copies X's dim, one -1 is inferred. "
        "X [4, 6], shape {0, -1, 2} -> Out [4, 3, 2].")
    .Input("X", "any shape")
    .Output("Out", "same elements as X, in the new shape")
    .RequiredAttr<std::vector<int>>("shape", "the new shape; 0 copies X's dim, -1 is inferred")
    .Shape(ReshapeShape)
    .Grad(GradMaker("reshape_grad", {"X"}, {"Out"}, {"X"}));  // X for X@GRAD's shape
KEEL_REGISTER_GRAD_OP(reshape_grad, reshape);
KEEL_REGISTER_CPU_KERNEL(reshape, CopyKernel, float, double, int32_t, int64_t, bool, uint8_t,
                         int8_t);
KEEL_REGISTER_CPU_KERNEL(reshape_grad, CopyGradKernel, float, double);

}  // namespace keel
