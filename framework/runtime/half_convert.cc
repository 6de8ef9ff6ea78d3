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

// AVX-512: 16 values a vector, the tail by masked loads and stores. bfloat16 is narrowed by
// AVX512-BF16's vcvtneps2bf16 (round to nearest even; a NaN comes out quiet, as ours), which
// however reads float32 subnormals as zeros: a vector holding one is rounded by the integer rule
// instead, so the bits are the scalar conversion's.
#define KEEL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define KEEL_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

KEEL_AVX512 inline __mmask16 TailMask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

// Full vectors are read and written by plain loads and stores, only the tail by masked ones
// (kFull false): with a masked store in the main loop, narrowing 1.6 M values from outside the
// caches took 2.5x as long on AMD Zen 5 (0.64 against 0.26 ms).
template <bool kFull>
KEEL_AVX512 inline __m256i Load16(const void* s, __mmask16 m) {
  if constexpr (kFull) return _mm256_loadu_si256(static_cast<const __m256i*>(s));
  return _mm256_maskz_loadu_epi16(m, s);
}
template <bool kFull>
KEEL_AVX512 inline void Store16(void* d, __mmask16 m, __m256i v) {
  if constexpr (kFull) return _mm256_storeu_si256(static_cast<__m256i*>(d), v);
  _mm256_mask_storeu_epi16(d, m, v);
}
template <bool kFull>
KEEL_AVX512 inline __m512 LoadF32(const Bits32* s, __mmask16 m) {
  if constexpr (kFull) return _mm512_loadu_ps(s);
  return _mm512_maskz_loadu_ps(m, s);
}
template <bool kFull>
KEEL_AVX512 inline void StoreF32(Bits32* d, __mmask16 m, __m512 v) {
  if constexpr (kFull) return _mm512_storeu_ps(reinterpret_cast<float*>(d), v);
  _mm512_mask_storeu_ps(reinterpret_cast<float*>(d), m, v);
}

template <bool kFull>
KEEL_AVX512 inline __m512 LoadBf16(const Bits16* s, __mmask16 m) {
  const __m256i h = Load16<kFull>(s, m);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
KEEL_AVX512 inline __m256i NarrowBf16Int(__m512i u) {
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                         _mm512_and_si512(_mm512_srli_epi32(u, 16), one)),
                        16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}
KEEL_AVX512BF16 inline __m256i NarrowBf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __mmask16 subnormal = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
                              _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
  if (subnormal != 0) return NarrowBf16Int(u);
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
}

// One vector of each loop; the loops run it on full vectors, then on the tail.
template <bool kFull>
KEEL_AVX512 inline void WidenBf16Vec(const Bits16* s, Bits32* d, __mmask16 m) {
  StoreF32<kFull>(d, m, LoadBf16<kFull>(s, m));
}
template <bool kFull>
KEEL_AVX512BF16 inline void NarrowBf16Vec(const Bits32* s, Bits16* d, __mmask16 m) {
  Store16<kFull>(d, m, NarrowBf16(LoadF32<kFull>(s, m)));
}
template <bool kFull>
KEEL_AVX512BF16 inline void AddBf16Vec(const Bits16* a, const Bits16* b, Bits16* d, __mmask16 m) {
  Store16<kFull>(d, m, NarrowBf16(_mm512_add_ps(LoadBf16<kFull>(a, m), LoadBf16<kFull>(b, m))));
}
template <bool kFull>
KEEL_AVX512 inline void AddF16Vec(const float16* a, const float16* b, float16* d, __mmask16 m) {
  const __m512 x = _mm512_cvtph_ps(Load16<kFull>(a, m));
  const __m512 y = _mm512_cvtph_ps(Load16<kFull>(b, m));
  Store16<kFull>(
      d, m, _mm512_cvtps_ph(_mm512_add_ps(x, y), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

KEEL_AVX512 void WidenBf16Avx512(const Bits16* s, Bits32* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) WidenBf16Vec<true>(s + i, d + i, 0xffff);
  if (i < n) WidenBf16Vec<false>(s + i, d + i, TailMask(n - i));
}
KEEL_AVX512BF16 void NarrowBf16Avx512(const Bits32* s, Bits16* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) NarrowBf16Vec<true>(s + i, d + i, 0xffff);
  if (i < n) NarrowBf16Vec<false>(s + i, d + i, TailMask(n - i));
}
KEEL_AVX512BF16 void AddBf16Avx512(const Bits16* a, const Bits16* b, Bits16* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) AddBf16Vec<true>(a + i, b + i, d + i, 0xffff);
  if (i < n) AddBf16Vec<false>(a + i, b + i, d + i, TailMask(n - i));
}
KEEL_AVX512 void AddF16Avx512(const float16* a, const float16* b, float16* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) AddF16Vec<true>(a + i, b + i, d + i, 0xffff);
  if (i < n) AddF16Vec<false>(a + i, b + i, d + i, TailMask(n - i));
}

struct Isa {
  bool avx2 = false, f16c = false, avx512 = false, avx512bf16 = false;
  Isa() {
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2");
    // F16C is CPUID leaf 1, ECX bit 29 (clang has no "f16c" for __builtin_cpu_supports); its
    // 256-bit forms need AVX, which the OS enabled when __builtin_cpu_supports says so.
    unsigned a = 0, b = 0, c = 0, d = 0;
    f16c = __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    // AVX-512 F, BW and VL (the OS's support included); BF16 is CPUID leaf 7 subleaf 1, EAX
    // bit 5.
    avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
    avx512bf16 = avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
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
  if (Cpu().avx512) return WidenBf16Avx512(s, d, n);
  if (Cpu().avx2) return WidenBf16Avx2(s, d, n);
#endif
  WidenBf16Loop(s, d, n);
}

void NarrowN(const float* src, bfloat16* dst, int64_t n) {
  const auto* s = reinterpret_cast<const Bits32*>(src);
  auto* d = reinterpret_cast<Bits16*>(dst);
#ifdef KEEL_X86
  if (Cpu().avx512bf16) return NarrowBf16Avx512(s, d, n);
  if (Cpu().avx2) return NarrowBf16Avx2(s, d, n);
#endif
  NarrowBf16Loop(s, d, n);
}

void NarrowRows(const float* src, int64_t src_ld, bfloat16* dst, int64_t dst_ld, int64_t rows,
                int64_t cols) {
  const auto* s = reinterpret_cast<const Bits32*>(src);
  auto* d = reinterpret_cast<Bits16*>(dst);
#ifdef KEEL_X86
  if (Cpu().avx512bf16) {
    for (int64_t r = 0; r < rows; ++r) NarrowBf16Avx512(s + r * src_ld, d + r * dst_ld, cols);
    return;
  }
  if (Cpu().avx2) {
    for (int64_t r = 0; r < rows; ++r) NarrowBf16Avx2(s + r * src_ld, d + r * dst_ld, cols);
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r) NarrowBf16Loop(s + r * src_ld, d + r * dst_ld, cols);
}

void NarrowRows(const float* src, int64_t src_ld, float16* dst, int64_t dst_ld, int64_t rows,
                int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) NarrowN(src + r * src_ld, dst + r * dst_ld, cols);
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

// Through float32 a block at a time where no vector code adds in registers.
template <typename T>
void AddThroughFloat(const T* a, const T* b, T* dst, int64_t n) {
  constexpr int64_t kChunk = 1024;
  alignas(64) float fa[kChunk], fb[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = n - i < kChunk ? n - i : kChunk;
    WidenN(a + i, fa, len);
    WidenN(b + i, fb, len);
    for (int64_t j = 0; j < len; ++j) fa[j] += fb[j];
    NarrowN(fa, dst + i, len);
  }
}

void AddN(const bfloat16* a, const bfloat16* b, bfloat16* dst, int64_t n) {
#ifdef KEEL_X86
  if (Cpu().avx512bf16)
    return AddBf16Avx512(reinterpret_cast<const Bits16*>(a), reinterpret_cast<const Bits16*>(b),
                         reinterpret_cast<Bits16*>(dst), n);
#endif
  AddThroughFloat(a, b, dst, n);
}

void AddN(const float16* a, const float16* b, float16* dst, int64_t n) {
#ifdef KEEL_X86
  if (Cpu().avx512) return AddF16Avx512(a, b, dst, n);
#endif
  AddThroughFloat(a, b, dst, n);
}

const char* HalfConvertIsa() {
#ifdef KEEL_X86
  if (Cpu().avx512bf16) return "avx512-bf16";
  if (Cpu().avx512) return "avx512";
  if (Cpu().f16c && Cpu().avx2) return "f16c+avx2";
  if (Cpu().f16c) return "f16c";
  if (Cpu().avx2) return "avx2";
#endif
  return "scalar";
}

}  // namespace keel
