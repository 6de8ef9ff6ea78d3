#include "framework/runtime/dtype.h"

#include "framework/error.h"

namespace keel {

size_t SizeOf(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kBool:
      return 1;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kUInt8:
      return 1;
    case DType::kInt8:
      return 1;
  }
  KEEL_THROW("unknown dtype code ", static_cast<int>(t));
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt8:
      return "int8";
  }
  return "unknown";
}

DType DTypeFromName(const std::string& n) {
  if (n == "float32" || n == "fp32" || n == "f32" || n == "float") return DType::kFloat32;
  if (n == "float64" || n == "fp64" || n == "f64" || n == "double") return DType::kFloat64;
  if (n == "int32" || n == "i32") return DType::kInt32;
  if (n == "int64" || n == "i64") return DType::kInt64;
  if (n == "bool") return DType::kBool;
  if (n == "float16" || n == "fp16" || n == "f16") return DType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return DType::kBFloat16;
  if (n == "uint8" || n == "u8") return DType::kUInt8;
  if (n == "int8" || n == "i8") return DType::kInt8;
  KEEL_THROW("unknown dtype '", n,
             "' (known: float32 float64 int32 int64 bool float16 bfloat16 uint8 int8)");
}

}  // namespace keel
