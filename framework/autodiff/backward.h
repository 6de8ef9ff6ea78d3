// append_backward: appends to the loss's block the ops that compute d(loss)/d(parameter).
//
// Requires: the loss is a one-element float var written by an op of the global block.
// Guarantees: grad ops come in reverse order of their forward ops; a var that feeds several ops
// gets its gradient summed by a `sum` op placed right after its last contribution; vars marked
// stop_gradient, vars in no_grad_set, integer vars and everything not on a path from a trainable
// parameter to the loss get no gradient. Every grad op carries op_role=Backward; the op that
// finally writes a parameter's gradient carries op_role_var=[param, grad].
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "framework/ir/program.h"

namespace keel {

using ParamGrad = std::pair<std::string, std::string>;

// Returns (parameter, gradient) var names in the order the parameters were created.
std::vector<ParamGrad> append_backward(Program& program, const std::string& loss,
                                       const std::set<std::string>& no_grad_set = {});

}  // namespace keel
