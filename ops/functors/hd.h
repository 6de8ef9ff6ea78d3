// KEEL_HD marks element-wise math that both the CPU kernels (ops/*.cc) and the CUDA kernels
// (ops/*.cu) call, so the CPU tests cover the GPU's math. The math helpers pick the float or double
// libm function by overload on host and device alike (tanhf on host is what std::tanh(float)
// calls, so CPU results do not change).
#pragma once

#include <math.h>

#include <cstdint>

#ifdef __CUDACC__
#define KEEL_HD __host__ __device__ __forceinline__
#else
#define KEEL_HD inline
#endif

// A lambda a kernel front (ops/device.h) hands to the device vocabulary, run on the host by the
// CPU and on the device by CUDA: [=] KEEL_HD_LAMBDA(int64_t i) { ... }. It captures by value and
// must not use `this` (a host pointer on the device): copy members into locals first.
#ifdef __CUDACC__
#define KEEL_HD_LAMBDA __host__ __device__
#else
#define KEEL_HD_LAMBDA
#endif

namespace keel {
namespace fn {

KEEL_HD float Exp(float x) { return expf(x); }
KEEL_HD double Exp(double x) { return exp(x); }
KEEL_HD float Log(float x) { return logf(x); }
KEEL_HD double Log(double x) { return log(x); }
KEEL_HD float Tanh(float x) { return tanhf(x); }
KEEL_HD double Tanh(double x) { return tanh(x); }
KEEL_HD float Erf(float x) { return erff(x); }
KEEL_HD double Erf(double x) { return erf(x); }
KEEL_HD float Sqrt(float x) { return sqrtf(x); }
KEEL_HD double Sqrt(double x) { return sqrt(x); }

}  // namespace fn
}  // namespace keel
