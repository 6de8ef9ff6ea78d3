// The 16-bit floating-point storage types of mixed precision: `float16` (IEEE 754 binary16:
// 1 sign, 5 exponent, 10 mantissa bits) and `bfloat16` (float32's upper half: 1 sign, 8 exponent,
// 7 mantissa bits). They hold bits; arithmetic converts to float32, computes, and rounds back, as
// every kernel that reads them does (float32 accumulation). Conversions round to nearest, ties to
// even, keep NaN a NaN (quiet) and infinities infinite, overflow to infinity (float16 above
// 65504) and go through float16's subnormals. Same layout as CUDA's `__half` and
// `__nv_bfloat16` and oneDNN's f16/bf16 data types, so a tensor of them is handed over as is.
//
// Compiled by nvcc, every function is also a device function; device code converts with the
// GPU's own instructions (cvt.rn, round to nearest even: the same values, a NaN's payload aside).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "framework/runtime/dtype.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define KEEL_HALF_HD __host__ __device__ __forceinline__
#else
#define KEEL_HALF_HD inline
#endif

namespace keel {

namespace fp16_detail {
KEEL_HALF_HD uint32_t FloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
KEEL_HALF_HD float BitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
}  // namespace fp16_detail

struct bfloat16 {
  uint16_t bits = 0;

  bfloat16() = default;
  KEEL_HALF_HD explicit bfloat16(float f) : bits(Round(f)) {}
  KEEL_HALF_HD explicit operator float() const {
    return fp16_detail::BitsFloat(uint32_t{bits} << 16);
  }

  KEEL_HALF_HD static bfloat16 FromBits(uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  // float32 -> bfloat16 bits: round to nearest even on the dropped 16 bits; NaN stays a quiet NaN.
  KEEL_HALF_HD static uint16_t Round(float f) {
#ifdef __CUDA_ARCH__
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    const uint32_t u = fp16_detail::FloatBits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
  }
};

struct float16 {
  uint16_t bits = 0;

  float16() = default;
  KEEL_HALF_HD explicit float16(float f) : bits(Round(f)) {}
  KEEL_HALF_HD explicit operator float() const { return Widen(bits); }

  KEEL_HALF_HD static float16 FromBits(uint16_t b) {
    float16 h;
    h.bits = b;
    return h;
  }

  // float32 -> binary16 bits, round to nearest even (also into subnormals).
  KEEL_HALF_HD static uint16_t Round(float f) {
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(f));
#else
    return RoundBits(f);
#endif
  }
  KEEL_HALF_HD static float Widen(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    return WidenBits(h);
#endif
  }

  // The host's conversions, in integer and float32 arithmetic.
  static uint16_t RoundBits(float f) {
    const uint32_t u = fp16_detail::FloatBits(f);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
    if (a < 0x38800000u) {
      // Below float16's smallest normal (2^-14): a subnormal step is 2^-24. Scale the value so
      // that the step is one unit, and let float32's own rounding (to nearest even) place it.
      const float scaled = fp16_detail::BitsFloat(a) * 16777216.0f;  // * 2^24, exact
      // Adding 2^23 leaves the integer part in the low mantissa bits, rounded to nearest even.
      const uint32_t r = fp16_detail::FloatBits(scaled + 8388608.0f) - 0x4b000000u;
      return static_cast<uint16_t>(sign | r);
    }
    // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
    const uint32_t rebased = a - 0x38000000u;
    const uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }

  static float WidenBits(uint16_t h) {
    const uint32_t sign = uint32_t{h & 0x8000u} << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return fp16_detail::BitsFloat(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
      // Zero or subnormal: man * 2^-24, exact in float32.
      const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
      return sign ? -v : v;
    }
    return fp16_detail::BitsFloat(sign | ((exp + 112u) << 23) | (man << 13));
  }
};

template <>
struct DTypeOf<float16> {
  static constexpr DType value = DType::kFloat16;
};
template <>
struct DTypeOf<bfloat16> {
  static constexpr DType value = DType::kBFloat16;
};

// Kernels written once over T compute in `Acc<T>` (float for the 16-bit types) and convert at the
// ends: `Widen(x)` / `Narrow<T>(acc)`.
template <typename T>
struct AccOf {
  using type = T;
};
template <>
struct AccOf<float16> {
  using type = float;
};
template <>
struct AccOf<bfloat16> {
  using type = float;
};
template <typename T>
using Acc = typename AccOf<T>::type;

template <typename T>
KEEL_HALF_HD Acc<T> Widen(T x) {
  return static_cast<Acc<T>>(x);
}
template <typename T>
KEEL_HALF_HD T Narrow(Acc<T> x) {
  return static_cast<T>(x);
}

template <typename T>
constexpr bool kIsHalf = false;
template <>
inline constexpr bool kIsHalf<float16> = true;
template <>
inline constexpr bool kIsHalf<bfloat16> = true;

// x as a To, as static_cast does (float -> integer truncates, nonzero -> true), through float32
// where either side is a 16-bit type: a double or a 64-bit integer is rounded to float32 first,
// then to the 16-bit type (two roundings, as PyTorch's conversions of double to half).
template <typename To, typename From>
KEEL_HALF_HD To ConvertTo(From x) {
  if constexpr (kIsHalf<From> && kIsHalf<To>) {
    return To(static_cast<float>(x));
  } else if constexpr (kIsHalf<From>) {
    const float f = static_cast<float>(x);
    if constexpr (std::is_integral_v<To> && !std::is_same_v<To, bool>) {
      // A 16-bit type holds infinities and values past small integer types: saturate (NaN
      // gives 0) rather than convert out of range, which C++ leaves undefined.
      if (!(f == f)) return To(0);
      if (f >= static_cast<float>(std::numeric_limits<To>::max()))
        return std::numeric_limits<To>::max();
      if (f <= static_cast<float>(std::numeric_limits<To>::lowest()))
        return std::numeric_limits<To>::lowest();
    }
    return static_cast<To>(f);
  } else if constexpr (kIsHalf<To>) {
    return To(static_cast<float>(x));
  } else {
    return static_cast<To>(x);
  }
}

}  // namespace keel
