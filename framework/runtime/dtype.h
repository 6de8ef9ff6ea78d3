// Element types of tensors. f16/bf16 are storage types: kernels compute in f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel {

// Values match framework.proto's DataType so conversion is a cast.
enum class DType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kBool = 4,
  kFloat16 = 5,
  kBFloat16 = 6,
  kUInt8 = 7,
  kInt8 = 8,
};

size_t SizeOf(DType t);
const char* DTypeName(DType t);  // "float32", ...
// Parses "float32"/"fp32"/"f32", ...; throws keel::Error for unknown names.
DType DTypeFromName(const std::string& name);

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kUInt8;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kInt8;
};

}  // namespace keel
