// What the transpiler pass tests share: a small trained MLP program pair, a role, and gradients
// fused the way the all-reduce pass fuses them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fleet/role_maker.h"
#include "framework/ir/program.h"

namespace keel::testing {

// x[-1, 4] -> fc(3, tanh) -> fc(2, softmax) -> cross_entropy(y) -> mean, minimized by SGD(0.1).
void BuildTrainedMlp(Program& main, Program& startup);

// Rank 1 of 4, all on one node.
fleet::Role TwoOfFour();

// Puts first in `b` a coalesce_tensor making `grads` (of `numels` elements each) float32 views of
// one buffer, @FUSED_GRAD@0, as the all-reduce pass's fusion does.
void InsertFusedGradients(Block& b, const std::vector<std::string>& grads,
                          const std::vector<int64_t>& numels);

}  // namespace keel::testing
