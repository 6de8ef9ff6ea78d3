// Small pieces the test workers share (tests/workers/*_worker.cc).
#pragma once

#include <keel/keel.h>

#include <cstdint>
#include <string>

#include "transpiler/overflow_flag.h"
#include "transpiler/pipeline_pass.h"

namespace keel::testing {

// Bytes of optimizer state `scope` holds: the persistable vars of `main` that are not parameters,
// the learning rate or a pipeline's gradient accumulators.
inline int64_t OptimizerStateBytes(const Scope& scope, const Program& main) {
  int64_t bytes = 0;
  for (VarDesc* v : main.global_block().AllVars()) {
    const std::string& n = v->name();
    if (!v->persistable() || v->is_parameter() || n.rfind("learning_rate", 0) == 0 ||
        n.find(transpiler::kPipelineAccSuffix) != std::string::npos)
      continue;
    const Variable* var = scope.FindVar(n);
    if (var != nullptr && var->tensor().initialized())
      bytes += static_cast<int64_t>(var->tensor().nbytes());
  }
  return bytes;
}

// Negative tests: removes the collectives that take the maximum of AMP's overflow flag over ring
// `ring_id` (transpiler/overflow_flag.h), so that each rank keeps its own. Returns how many.
inline int RemoveOverflowFlagAllReduce(Program& main, int ring_id) {
  Block& b = main.global_block();
  const std::string twin = transpiler::OverflowFlagIntName("");
  int removed = 0;
  for (size_t i = b.num_ops(); i-- > 0;) {
    const OpDesc& op = *b.op(i);
    if (!op.HasAttr("ring_id") || op.Attr<int>("ring_id") != ring_id || !op.HasInput("X") ||
        op.Input("X").empty())
      continue;
    const std::string& x = op.Input("X")[0];
    if (x.size() < twin.size() || x.compare(x.size() - twin.size(), twin.size(), twin) != 0)
      continue;
    b.RemoveOp(i);
    ++removed;
  }
  main.Touch();
  return removed;
}

}  // namespace keel::testing
