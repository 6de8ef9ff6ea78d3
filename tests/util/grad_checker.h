// The shared op test harness: run one op forward through a real program and executor, and check
// its analytic gradients (append_backward) against central finite differences.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "framework/ir/program.h"
#include "framework/runtime/tensor.h"

namespace keel::testing {

struct OpCase {
  std::string name;                                                 // printed on failure
  std::string type;                                                 // op type
  std::vector<std::pair<std::string, std::vector<Tensor>>> inputs;  // slot -> CPU tensors
  std::vector<std::pair<std::string, int>> outputs = {{"Out", 1}};  // slot -> count
  std::map<std::string, Attribute> attrs;
  std::vector<std::string> no_grad_inputs;  // input slots not checked
};

// Appends the op to a fresh program (build-time shape inference runs), runs it on `place`;
// returns each output slot's tensors (on the CPU).
std::map<std::string, std::vector<Tensor>> RunForward(const OpCase& c,
                                                      const Place& place = CPUPlace());

// The analytic gradients CheckGrad checks (loss = sum_k sum(out_k * w_k)), computed on `place`:
// input var name -> its gradient (on the CPU).
std::map<std::string, Tensor> RunGrads(const OpCase& c, const Place& place);

// Checks analytic gradients of loss = sum_k sum(out_k * w_k) (fixed random w_k over the float
// outputs in loss_outputs, default all) w.r.t. every float input slot not in no_grad_inputs,
// against central differences with step eps. Inputs should be float64.
void CheckGrad(const OpCase& c, double eps = 1e-6, double rtol = 1e-4, double atol = 1e-6,
               std::vector<std::string> loss_outputs = {});

// Uniform random tensor in [lo, hi).
Tensor RandomTensor(const DDim& dims, DType dtype, double lo = -1, double hi = 1,
                    uint64_t seed = 1);

}  // namespace keel::testing
