// Tensor creation and layout ops: fill_constant, fill_zeros_like, uniform_random,
// gaussian_random, cast, reshape.
//
// dtype attrs are ints holding a keel::DType (0 = float32). Ops without inputs pick their kernel
// from attr "dtype" (the registry's default). The kernels are in tensor_ops.h (reshape's in
// ops/device.h); here are the shapes, the CPU cast and the registrations.
#include "ops/tensor_ops.h"

#include <string>
#include <type_traits>
#include <vector>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/half_convert.h"
#include "ops/op_util.h"

namespace keel {
namespace {

template <typename V>
std::string ListStr(const std::vector<V>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Attr check: the int names a dtype kernels compute in (float32/64, float16, bfloat16, int32/64,
// bool, uint8, int8). Whether an op has a kernel for it is the kernel lookup's to say.
std::string CheckComputeDType(const Attribute& a) {
  int v = std::get<int>(a);
  switch (static_cast<DType>(v)) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8:
      return "";
    default:
      return StrCat(
          "not a dtype kernels compute in (float32=0, float64=1, int32=2, int64=3, "
          "bool=4, float16=5, bfloat16=6, uint8=7, int8=8), got ",
          v);
  }
}
// As CheckComputeDType, also allowing the 16-bit floats (float16=5, bfloat16=6), which cast
// converts to and from and fill_constant fills.
std::string CheckStorageDType(const Attribute& a) {
  const DType t = static_cast<DType>(std::get<int>(a));
  if (t == DType::kFloat16 || t == DType::kBFloat16) return "";
  const std::string e = CheckComputeDType(a);
  return e.empty() ? "" : e + " (or float16=5, bfloat16=6)";
}
// As CheckStorageDType, also allowing -1 ("unset").
std::string CheckOptionalDType(const Attribute& a) {
  return std::get<int>(a) == -1 ? "" : CheckStorageDType(a);
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

// ---------------------------------------------------------------- uniform_random, gaussian_random

void UniformRandomShape(InferShapeContext& ctx) {
  KEEL_SHAPE_CHECK(ctx.Attr<float>("min") < ctx.Attr<float>("max"), "min ", ctx.Attr<float>("min"),
                   " must be below max ", ctx.Attr<float>("max"));
  ShapeFromAttrs(ctx);
}

void GaussianRandomShape(InferShapeContext& ctx) {
  KEEL_SHAPE_CHECK(ctx.Attr<float>("std") >= 0, "std must be >= 0, got ", ctx.Attr<float>("std"));
  ShapeFromAttrs(ctx);
}

// ---------------------------------------------------------------- cast

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

// ---------------------------------------------------------------- reshape

// Out's shape from attr `shape`: 0 copies X's dim at that index, one -1 takes what is left.
// At build time X's unknown (-1) dims make the inferred dim unknown too, unless each is copied.
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
  if (in_numel < 0 || copies_unknown) {
    // Build time: when each unknown dim of X is copied (a 0 at its index), the -1 is still
    // known: X's known dims over Out's ([-1, L, D] to {0, 0, -1, E}: D / E).
    if (infer_at < 0) return out;
    int64_t in_known = 1;
    for (int i = 0; i < in.size(); ++i) {
      if (in[i] >= 0) {
        in_known *= in[i];
      } else if (i >= static_cast<int>(shape.size()) || shape[i] != 0) {
        return out;
      }
    }
    KEEL_SHAPE_CHECK(known > 0 && in_known % known == 0, "cannot reshape X ", in.str(),
                     " to shape ", ListStr(shape), ": its known dims (", in_known,
                     " elements per copied index) are not a multiple of ", known);
    out[infer_at] = in_known / known;
    return out;
  }
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

// Eigen's element-wise cast; float32 to and from the 16-bit types by the vectorized conversions
// (half_convert.h), others through ConvertTo; in pieces on the thread budget.
template <>
struct CastMath<CPUDevice> {
  template <typename In, typename Out>
  static void Run(const ExecutionContext&, const In* src, Out* dst, int64_t n) {
    if constexpr (!kIsHalf<In> && !kIsHalf<Out>) {
      Vec<Out>(dst, n) = ConstVec<In>(src, n).template cast<Out>();
    } else {
      cpu_threads::ParallelForRange(n, cpu_threads::kElementwiseGrain, [&](int64_t b, int64_t e) {
        if constexpr (kIsHalf<In> && std::is_same_v<Out, float>) {
          WidenN(src + b, dst + b, e - b);
        } else if constexpr (std::is_same_v<In, float> && kIsHalf<Out>) {
          NarrowN(src + b, dst + b, e - b);
        } else {
          for (int64_t i = b; i < e; ++i) dst[i] = ConvertTo<Out>(src[i]);
        }
      });
    }
  }
};

// ---------------------------------------------------------------- registration

KEEL_REGISTER_OP(fill_constant)
    .Doc("Out = value everywhere. shape {2, 3}, value 1, dtype 0 -> float32 [2, 3] of ones.")
    .Output("Out", "shape `shape`, dtype `dtype`")
    .Attr<std::vector<int64_t>>("shape", {}, "Out's shape", CheckShapeAttr)
    .Attr<float>("value", 0.0f, "the fill value, converted to dtype")
    .Attr<int>("dtype", static_cast<int>(DType::kFloat32), "Out's keel::DType as int",
               CheckStorageDType)
    .Shape(ShapeFromAttrs);
KEEL_REGISTER_KERNEL(CPU, fill_constant, FillConstantKernel, float, double, int32_t, int64_t, bool,
                     bfloat16, float16);

KEEL_REGISTER_OP(fill_zeros_like)
    .Doc("Out = zeros of X's shape and dtype.")
    .Input("X", "any shape and dtype")
    .Output("Out", "shape and dtype of X")
    .Shape(SameShapeAsX);
KEEL_REGISTER_KERNEL(CPU, fill_zeros_like, FillZerosLikeKernel, float, double, int32_t, int64_t,
                     bool, bfloat16, float16);

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
KEEL_REGISTER_KERNEL(CPU, uniform_random, UniformRandomKernel, float, double);

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
KEEL_REGISTER_KERNEL(CPU, gaussian_random, GaussianRandomKernel, float, double);

KEEL_REGISTER_OP(cast)
    .Doc(
        "Out = X converted to out_dtype (float -> int truncates; nonzero -> true; to and from "
        "float16 and bfloat16 through float32, rounding to nearest even).")
    .Input("X", "any shape")
    .Output("Out", "shape of X, dtype out_dtype")
    .RequiredAttr<int>("out_dtype", "Out's keel::DType as int", CheckStorageDType)
    .Attr<int>("in_dtype", -1, "X's keel::DType as int; -1: X's declared dtype", CheckOptionalDType)
    .Shape(CastShape)
    .Grad(CastGradMaker());
KEEL_REGISTER_GRAD_OP(cast_grad, cast).Shape(CastGradShape).KernelDTypeFrom(GradVarName("Out"));
KEEL_REGISTER_KERNEL(CPU, cast, CastKernel, float, double, int32_t, int64_t, bool, uint8_t, int8_t,
                     bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, cast_grad, CastGradKernel, float, double, bfloat16, float16);

KEEL_REGISTER_OP(reshape)
    .Doc(
        "Out = X with shape `shape`: 0 copies X's dim, one -1 is inferred. "
        "X [4, 6], shape {0, -1, 2} -> Out [4, 3, 2].")
    .Input("X", "any shape")
    .Output("Out", "same elements as X, in the new shape")
    .RequiredAttr<std::vector<int>>("shape", "the new shape; 0 copies X's dim, -1 is inferred")
    .Shape(ReshapeShape)
    .Grad(GradMaker("reshape_grad", {"X"}, {"Out"}, {"X"}))  // X for X@GRAD's shape
    .MayShareBuffer("Out", "X");
KEEL_REGISTER_GRAD_OP(reshape_grad, reshape).MayShareBuffer(GradVarName("X"), GradVarName("Out"));
KEEL_REGISTER_KERNEL(CPU, reshape, CopyKernel, float, double, int32_t, int64_t, bool, uint8_t,
                     int8_t, bfloat16, float16);
KEEL_REGISTER_KERNEL(CPU, reshape_grad, CopyGradKernel, float, double, bfloat16, float16);

}  // namespace keel
