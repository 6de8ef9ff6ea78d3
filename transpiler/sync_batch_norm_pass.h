// SyncBatchNormPass: DistributedStrategy::sync_batch_norm. Every training-mode batch norm of the
// main program normalizes with the statistics of all ranks' batches together
// (ops/sync_batch_norm_ops.cc, docs/sync-batch-norm.md).
//
// Requires: nothing beyond a valid program; it may run before or after append_backward and before
//   or after gradient merge (GradientMergePass refuses programs that already hold ring ops, so
//   fleet runs this pass after it). The ring options.ring_id is created by whoever sets up the
//   job's rings (GradAllReducePass creates ring 0); with one rank none is needed.
// Guarantees: in every block, each batch_norm op with is_test and use_global_stats false becomes
//   sync_batch_norm with the same slots and attrs plus ring_id = options.ring_id, at the same
//   position; each batch_norm_grad op whose SavedMean is written by such a batch_norm (its
//   forward) becomes sync_batch_norm_grad with ring_id likewise. Applying it twice changes
//   nothing more.
// Leaves alone: batch_norm ops with is_test or use_global_stats (and their grads), every other op,
//   the vars, the startup program.
#pragma once

#include "transpiler/pass.h"

namespace keel {
namespace transpiler {

struct SyncBatchNormOptions {
  int ring_id = 0;  // the ring whose ranks' batches are normalized together
};

class SyncBatchNormPass : public Pass {
 public:
  explicit SyncBatchNormPass(SyncBatchNormOptions options = {}) : options_(options) {}
  std::string name() const override { return "sync_batch_norm"; }
  void Apply(Program& main, Program& startup) const override;

 private:
  SyncBatchNormOptions options_;
};

}  // namespace transpiler
}  // namespace keel
