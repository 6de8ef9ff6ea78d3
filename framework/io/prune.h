// Pruning a training program for inference.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "framework/ir/program.h"

namespace keel {

// Keeps only the ops of block 0 needed to compute `targets` from `feeds`, drops backward and
// optimizer ops and unused vars.
std::unique_ptr<Program> PruneForInference(const Program& program,
                                           const std::vector<std::string>& feeds,
                                           const std::vector<std::string>& targets);

}  // namespace keel
