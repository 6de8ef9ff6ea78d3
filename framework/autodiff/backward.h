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

// Recompute (Paddle's RecomputeOptimizer), when `checkpoints` names forward vars: the forward
// ops are cut into segments, each ending at the op that writes a checkpoint; before the grad ops
// of every segment but the last, the segment's forward ops run again (op_role Backward) writing
// "<var>@RECOMPUTE" copies of its activations, and its grad ops read those. So only checkpoints
// (and vars read across segments, which are logged) stay alive from forward to backward, and the
// executor's eager deletion frees the rest after their last forward reader. Recomputed ops give
// the same bits as the forward ones: dropout replays the forward's mask (input ReplayMask); any
// other op that draws random numbers in a recomputed segment is a keel::Error naming it, as is a
// checkpoint that no forward op before the loss writes.
//
// Returns (parameter, gradient) var names in the order the parameters were created.
std::vector<ParamGrad> append_backward(Program& program, const std::string& loss,
                                       const std::set<std::string>& no_grad_set = {},
                                       const std::vector<std::string>& checkpoints = {});

}  // namespace keel
