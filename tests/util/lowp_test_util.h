// Tests of the 16-bit (mixed precision) kernels: an op case written in float32 runs twice from the
// same inputs, rounded to the 16-bit type first, once through the float32 kernels and once
// through the bfloat16 or float16 ones (inputs listed in `keep_f32`, such as batch_norm's Scale and
// statistics, stay float32), forward and gradient, and the results must agree to the 16-bit
// type's precision. The case table is shared by the CPU tests (tests/ops/lowp_ops_test.cc) and
// their CUDA twins (tests/gpu/lowp_kernels_test.cc).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "framework/runtime/tensor.h"
#include "tests/util/grad_checker.h"

namespace keel::testing {

inline constexpr DType kHalfTypes[] = {DType::kBFloat16, DType::kFloat16};

// A float32 tensor converted to dt (float32, float16 or bfloat16; round to nearest even), or a
// 16-bit one back to float32 (exact).
Tensor ConvertTensor(const Tensor& t, DType dt);
// The float32 values a tensor of dt holds: t rounded to dt and back.
Tensor RoundedTo(const Tensor& t, DType dt);
// Elements as doubles, the 16-bit types included.
std::vector<double> ValuesOf(const Tensor& t);

// How far `got` is from `want`: max over elements of |g - w| / (|w| + rms(want)), the error
// relative to each element with the tensor's scale as a floor (sums whose terms cancel round to
// a few ulps of the terms, not of the sum). Infinite where one side is NaN (or infinite) and the
// other is not, or where the shapes differ.
double ScaledErr(const Tensor& got, const Tensor& want);

struct LowpCase {
  OpCase op;                          // float32 inputs (not yet rounded)
  std::vector<std::string> keep_f32;  // input slots that stay float32 in the 16-bit run
  bool grads = true;                  // also compare the gradients of the float inputs
  double tol_scale = 1;               // multiplies the type's tolerance (ScaledErr)
};

// The tolerance of ScaledErr for dt: a few ulps (bfloat16 1.6e-2, float16 2e-3).
double HalfTolerance(DType dt);

// The case with its float inputs rounded to dt (stored as float32: the float32 reference run) or
// converted to dt (the 16-bit run; keep_f32 slots rounded but float32).
OpCase Reference(const LowpCase& c, DType dt);
OpCase InHalf(const LowpCase& c, DType dt);

// Forward outputs by slot, like RunForward.
std::map<std::string, std::vector<Tensor>> Forward(const OpCase& c, const Place& place);

// Gradients of loss = sum_k sum(float32(out_k) * w_k) with respect to every float input (16-bit
// included; input var name -> gradient, in its own dtype), computed on place. w_k are fixed
// random values rounded to `w_dtype`, so that the float32 and the 16-bit run get the same output
// gradients (the 16-bit run's cast back to float32 rounds them to its type).
std::map<std::string, Tensor> Grads(const OpCase& c, const Place& place, DType w_dtype);

// The table: element-wise (with broadcasting), activations, scale, sum, dropout, pool2d,
// batch_norm, layer_norm, mul, matmul, conv2d, cast, fills and the layout ops, at odd sizes.
std::vector<LowpCase> LowpCases();

// Runs `c` in dt on place and EXPECTs its outputs and gradients to agree with the float32 kernels'
// on the CPU (inputs rounded to dt first).
void ExpectMatchesFloat32(const LowpCase& c, DType dt, const Place& place);

}  // namespace keel::testing
