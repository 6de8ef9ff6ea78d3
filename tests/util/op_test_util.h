// What op tests share besides the harness in grad_checker.h: tensors read back as doubles, a case
// described in one line, a forward output compared with a reference, error messages checked.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "framework/runtime/ddim.h"
#include "framework/runtime/tensor.h"
#include "tests/util/grad_checker.h"

namespace keel::testing {

// The floating dtypes op cases run in.
inline constexpr DType kFloatTypes[] = {DType::kFloat32, DType::kFloat64};

// t's elements as doubles, in row-major order.
std::vector<double> ToDouble(const Tensor& t);

// "case 'NAME' op TYPE X=float32[2, 3] ... attr=value ...", for SCOPED_TRACE.
std::string Describe(const OpCase& c);

// How ExpectOutputNear compares.
struct OutputCheck {
  double f32_tol;                     // relative tolerance for float32; float64 gets 1e-12
  bool dtype_of_first_input = false;  // also ASSERT the output has the first input's dtype
};

// Runs c forward (under SCOPED_TRACE(Describe(c))) and ASSERTs output `slot` has want_dims and
// values within a relative tolerance of `want`, computed in double from the same inputs.
void ExpectOutputNear(const OpCase& c, const std::string& slot, const DDim& want_dims,
                      const std::vector<double>& want, const OutputCheck& check);

// Output `slot` of c's forward run equals `want` (shape and values, to the dtype's precision:
// `f32_tol` relative for float32, 1e-12 for float64).
void ExpectForward(const OpCase& c, const std::string& slot, const DDim& want_dims,
                   const std::vector<double>& want, double f32_tol = 2e-6);

// A case of op `type` with the one input X = x.
OpCase UnaryCase(const std::string& name, const std::string& type, Tensor x,
                 std::map<std::string, Attribute> attrs = {});

// A random tensor of integers in [lo, hi] (as dtype), so int kernels and exact ties get tested.
Tensor RandomInts(const DDim& dims, DType dtype, int lo, int hi, uint64_t seed);

// A pair attribute ({a, b}: strides, paddings, kernel sizes).
std::vector<int> Pair(int a, int b);

// `axis` counted from the front (a negative axis counts from the end, as ops take it).
int CanonicalAxis(int axis, int rank);

// dims split around `axis` as [pre, n, post]; element (i, k, j) at (i * n + k) * post + j.
struct AxisParts {
  int64_t pre, n, post;
};
AxisParts SplitAroundAxis(const DDim& d, int axis);

// softmax of `x` (of shape `dims`) along `axis`, in double: the reference of softmax and of
// softmax_with_cross_entropy.
std::vector<double> NaiveSoftmax(const std::vector<double>& x, const DDim& dims, int axis);

// The keel::Error message of f(); "" when it throws none; another exception's message after
// kNotAKeelError (user input must fail with a keel::Error, so that is a finding, not a crash).
inline constexpr char kNotAKeelError[] = "<not a keel::Error> ";
std::string ErrorOf(const std::function<void()>& f);

// The keel::Error message of running c forward (which builds the program first); "" when none.
std::string ForwardError(const OpCase& c);

// EXPECTs every one of `parts` in msg.
void ExpectContainsAll(const std::string& msg, const std::vector<std::string>& parts);

// EXPECTs msg (from ErrorOf or ForwardError) to be a keel::Error's, holding every one of `parts`.
void ExpectErrorContainsAll(const std::string& msg, const std::vector<std::string>& parts);

// Whether two lists of tensors hold the same bytes, tensor by tensor.
bool SameBits(const std::vector<Tensor>& a, const std::vector<Tensor>& b);

}  // namespace keel::testing
