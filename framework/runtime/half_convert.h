// Bulk conversions between float32 and the 16-bit storage types (framework/runtime/float16.h),
// for the CPU kernels that widen a block of values, compute in float32 and narrow the result.
// Each rounds exactly as float16.h's scalar conversions do (round to nearest even, float16's
// subnormals, overflow to infinity; a NaN stays a NaN) and is vectorized: float16 by the CPU's
// F16C instructions where it has them (checked at run time; keel is built for any x86-64),
// bfloat16 by integer loops the compiler vectorizes, in an AVX2 build picked at run time.
#pragma once

#include <cstdint>

#include "framework/runtime/float16.h"

namespace keel {

void WidenN(const float16* src, float* dst, int64_t n);
void WidenN(const bfloat16* src, float* dst, int64_t n);
void NarrowN(const float* src, float16* dst, int64_t n);
void NarrowN(const float* src, bfloat16* dst, int64_t n);

// Which instructions the conversions use on this CPU ("f16c+avx2", "scalar", ...), for logs.
const char* HalfConvertIsa();

}  // namespace keel
