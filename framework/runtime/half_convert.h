// Bulk conversions between float32 and the 16-bit storage types (framework/runtime/float16.h),
// for the CPU kernels that widen a block of values, compute in float32 and narrow the result.
// Each rounds exactly as float16.h's scalar conversions do (round to nearest even, float16's
// subnormals, overflow to infinity; a NaN stays a NaN) and is vectorized: float16 by the CPU's
// F16C instructions where it has them (checked at run time; keel is built for any x86-64),
// bfloat16 by integer loops the compiler vectorizes, in an AVX2 build picked at run time; with
// AVX-512 (F, BW, VL) 16 values a vector, bfloat16 narrowed by AVX512-BF16's instruction.
#pragma once

#include <cstdint>

#include "framework/runtime/float16.h"

namespace keel {

void WidenN(const float16* src, float* dst, int64_t n);
void WidenN(const bfloat16* src, float* dst, int64_t n);
void NarrowN(const float* src, float16* dst, int64_t n);
void NarrowN(const float* src, bfloat16* dst, int64_t n);

// NarrowN over `rows` rows of `cols` values, row r at src + r * src_ld and dst + r * dst_ld (a
// block of a wider matrix), with the CPU's instructions picked once for the whole block.
void NarrowRows(const float* src, int64_t src_ld, float16* dst, int64_t dst_ld, int64_t rows,
                int64_t cols);
void NarrowRows(const float* src, int64_t src_ld, bfloat16* dst, int64_t dst_ld, int64_t rows,
                int64_t cols);

// dst[i] = a[i] + b[i], the sum in float32 rounded once (as widening, adding and narrowing);
// dst may be a or b.
void AddN(const bfloat16* a, const bfloat16* b, bfloat16* dst, int64_t n);
void AddN(const float16* a, const float16* b, float16* dst, int64_t n);

// Which instructions the conversions use on this CPU ("f16c+avx2", "scalar", ...), for logs.
const char* HalfConvertIsa();

}  // namespace keel
