// Copying a list of tensors through one flat buffer and back, for the passes that move a stage's
// persistable gradient accumulators through one collective (GradAllReducePass's fused all-reduce
// and ShardingPass's reduce-scatter in a pipeline): the accumulators are summed into every
// micro-batch, so they are copied into the buffer rather than made slices of it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "framework/ir/program.h"

namespace keel {
namespace transpiler {

// "<var>@FLAT": `var` as one dim of its element count.
std::string FlatName(const std::string& var);

// At `at`, with op_role `role`: a reshape of `var` (known shape) into FlatName(var), declared here.
// Returns the index after.
size_t InsertFlatten(Block& b, size_t at, const std::string& var, int role);
// At `at`: a reshape of FlatName(var) back into `var`'s shape. Returns the index after.
size_t InsertUnflatten(Block& b, size_t at, const std::string& var, int role);
// At `at`: `out` = the 1-D `parts` concatenated (declared here: dtype of parts[0], their total
// length). Returns the index after.
size_t InsertConcatFlat(Block& b, size_t at, const std::vector<std::string>& parts,
                        const std::string& out, int role);
// At `at`: the 1-D `in` split into `parts` of `sizes` elements. Returns the index after.
size_t InsertSplitFlat(Block& b, size_t at, const std::string& in,
                       const std::vector<std::string>& parts, const std::vector<int>& sizes,
                       int role);

}  // namespace transpiler
}  // namespace keel
