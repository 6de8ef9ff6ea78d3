// keel inspect --summary: a program's parameters (name, shape, count), the persistable state its
// forward ops keep besides them (batch_norm statistics), the totals, and the forward pass's
// FLOPs per sample by op type (a multiply-add counts 2; element-wise ops 1 per output element).
#pragma once

#include <string>

#include "framework/ir/program.h"

namespace keel {
namespace cli {

struct ModelSummary {
  int64_t parameters = 0;  // elements of vars marked parameter
  int64_t buffers = 0;     // elements of other persistables that forward ops use
  double flops_per_sample = 0;
  std::string text;  // the printed table
};

// Summarizes block 0 of `program`, counting only ops with the forward role for FLOPs (a training
// program's backward and optimizer ops are left out). A batch dimension (-1) counts as 1.
ModelSummary SummarizeModel(const Program& program, const std::string& title);

}  // namespace cli
}  // namespace keel
