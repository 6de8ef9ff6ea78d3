// How an op's collective names itself to the collective watch (framework/comm/collective_watch.h)
// while it waits: "op c_allreduce_sum of @FUSED_GRAD@0 in run 12 of its program". Shared by the
// collective ops (collective_ops.cc), the tensor-parallel ops (tensor_parallel_ops.cc) and the
// ops that reduce across ranks inside their math (sync_batch_norm_ops.cc).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "framework/comm/collective_watch.h"
#include "framework/op/execution_context.h"

namespace keel {

class OpCall : public CollectiveCall {
 public:
  explicit OpCall(const ExecutionContext& ctx) : op_(ctx.op()), run_(ctx.run_index()) {}
  std::string Name() const override {
    const std::vector<std::string> args = op_.InputArgumentNames();
    return "op " + op_.type() + (args.empty() ? "" : " of " + args[0]);
  }
  std::string Detail() const override { return StrCat("in run ", run_ + 1, " of its program"); }

 private:
  const OpDesc& op_;
  int64_t run_;
};

// Runs `f` (the op's collective) as the op's call.
template <typename F>
void AsOp(const ExecutionContext& ctx, F&& f) {
  OpCall call(ctx);
  CollectiveCall::Scope scope(&call);
  std::forward<F>(f)();
}

}  // namespace keel
