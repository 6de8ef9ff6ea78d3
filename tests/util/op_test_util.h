// What op tests share besides the harness in grad_checker.h: tensors read back as doubles, a case
// described in one line, a forward output compared with a reference, error messages checked.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "framework/runtime/ddim.h"
#include "framework/runtime/tensor.h"
#include "tests/util/grad_checker.h"

namespace keel::testing {

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
