// What the transpiler pass tests share: a small trained MLP program pair, a role, and gradients
// fused the way the all-reduce pass fuses them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "executor/executor.h"
#include "fleet/role_maker.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
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

// The mixed-precision tests' model, under the current ProgramGuard: x[-1, 6] -> fc(8, relu) ->
// layer_norm -> fc(3) -> softmax_with_cross_entropy(y) -> mean; returns the loss (not minimized).
Var AmpMlpLoss();
// Its batch of step `step`: 8 rows of x (a fixed pattern) and labels in 0..2.
FeedMap AmpMlpBatch(int step);
// That model in (main, startup), both seeded 5, minimized by `opt`; returns the loss.
Var MinimizedAmpMlp(Program& main, Program& startup, optimizer::Optimizer& opt);

// The optimizers the bit-for-bit training tests of the passes run, by name: SGD, Momentum,
// Nesterov, Adam and AdamW, each making a fresh optimizer.
std::vector<std::pair<std::string, std::function<std::unique_ptr<optimizer::Optimizer>()>>>
TrainingOptimizers();

// The bytes of every persistable of `program` in `exe`'s scope, by name.
std::map<std::string, std::vector<char>> PersistableBytes(const Program& program, Executor& exe);

}  // namespace keel::testing
