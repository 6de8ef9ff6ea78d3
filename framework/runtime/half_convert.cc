#include "framework/runtime/half_convert.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KEEL_X86 1
#endif

namespace keel {
namespace {

// The bit patterns of float and bfloat16 values, read and written as integers.
using Bits32 = uint32_t __attribute__((may_alias));
using Bits16 = uint16_t __attribute__((may_alias));

// bfloat16: a shift to widen; to narrow, float16.h's rounding written without branches so that
// the compiler vectorizes the loop.
__attribute__((always_inline)) inline void WidenBf16Loop(const Bits16* s, Bits32* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = uint32_t{s[i]} << 16;
}
__attribute__((always_inline)) inline void NarrowBf16Loop(const Bits32* s, Bits16* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = s[i];
    const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet = (u >> 16) | 0x0040u;
    d[i] = static_cast<uint16_t>(nan ? quiet : rounded);
  }
}

#ifdef KEEL_X86
__attribute__((target("avx2"))) void WidenBf16Avx2(const Bits16* s, Bits32* d, int64_t n) {
  WidenBf16Loop(s, d, n);
}
__attribute__((target("avx2"))) void NarrowBf16Avx2(const Bits32* s, Bits16* d, int64_t n) {
  NarrowBf16Loop(s, d, n);
}

// float16 by F16C, 8 values at a time; the tail by float16.h.
__attribute__((target("avx,f16c"))) void WidenF16C(const float16* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = static_cast<float>(s[i]);
}
__attribute__((target("avx,f16c"))) void NarrowF16C(const float* s, float16* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  for (; i < n; ++i) d[i] = float16(s[i]);
}

struct Isa {
  bool avx2 = false, f16c = false;
  Isa() {
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2");
    // F16C is CPUID leaf 1, ECX bit 29 (clang has no "f16c" for __builtin_cpu_supports); its
    // 256-bit forms need AVX, which the OS enabled when __builtin_cpu_supports says so.
    unsigned a = 0, b = 0, c = 0, d = 0;
    f16c = __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
  }
};
const Isa& Cpu() {
  static const Isa isa;
  return isa;
}
#endif

}  // namespace

void WidenN(const bfloat16* src, float* dst, int64_t n) {
  static_assert(sizeof(bfloat16) == 2 && sizeof(float) == 4, "16- and 32-bit patterns");
  const auto* s = reinterpret_cast<const Bits16*>(src);
  auto* d = reinterpret_cast<Bits32*>(dst);
#ifdef KEEL_X86
  if (Cpu().avx2) return WidenBf16Avx2(s, d, n);
#endif
  WidenBf16Loop(s, d, n);
}

void NarrowN(const float* src, bfloat16* dst, int64_t n) {
  const auto* s = reinterpret_cast<const Bits32*>(src);
  auto* d = reinterpret_cast<Bits16*>(dst);
#ifdef KEEL_X86
  if (Cpu().avx2) return NarrowBf16Avx2(s, d, n);
#endif
  NarrowBf16Loop(s, d, n);
}

void WidenN(const float16* src, float* dst, int64_t n) {
#ifdef KEEL_X86
  if (Cpu().f16c) return WidenF16C(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

void NarrowN(const float* src, float16* dst, int64_t n) {
#ifdef KEEL_X86
  if (Cpu().f16c) return NarrowF16C(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = float16(src[i]);
}

const char* HalfConvertIsa() {
#ifdef KEEL_X86
  if (Cpu().f16c && Cpu().avx2) return "f16c+avx2";
  if (Cpu().f16c) return "f16c";
  if (Cpu().avx2) return "avx2";
#endif
  return "scalar";
}

}  // namespace keel
