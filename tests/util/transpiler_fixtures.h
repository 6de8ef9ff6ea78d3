// What the transpiler pass tests share: a small trained MLP program pair and a role.
#pragma once

#include "fleet/role_maker.h"
#include "framework/ir/program.h"

namespace keel::testing {

// x[-1, 4] -> fc(3, tanh) -> fc(2, softmax) -> cross_entropy(y) -> mean, minimized by SGD(0.1).
void BuildTrainedMlp(Program& main, Program& startup);

// Rank 1 of 4, all on one node.
fleet::Role TwoOfFour();

}  // namespace keel::testing
