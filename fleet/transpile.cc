#include "fleet/transpile.h"

#include "transpiler/gradient_merge_pass.h"
#include "transpiler/merge_optimizer_pass.h"
#include "transpiler/sync_batch_norm_pass.h"

namespace keel {
namespace fleet {

transpiler::RingOptions RingOptionsFor(const DistributedStrategy& strategy, const Role& role) {
  transpiler::RingOptions r;
  r.nrings = strategy.nccl_comm_num;
  r.nranks = role.world_size;
  r.rank = role.rank;
  r.device = role.selected_gpus.empty() ? -1 : role.selected_gpus[0];
  return r;
}

transpiler::GradAllReduceOptions GradAllReduceOptionsFor(const DistributedStrategy& strategy,
                                                         const Role& role) {
  transpiler::GradAllReduceOptions o;
  o.rings = RingOptionsFor(strategy, role);
  o.fuse = strategy.fuse_all_reduce_ops;
  o.fuse_mb = strategy.fuse_grad_size_in_MB;
  o.fuse_num = strategy.fuse_grad_size_in_num;
  o.paddle_fuse = strategy.paddle_fuse.given;
  o.paddle_fuse_memory_size_mb = strategy.paddle_fuse.memory_size_mb;
  o.paddle_fuse_groups_size = strategy.paddle_fuse.groups_size;
  o.hierarchical = strategy.use_hierarchical_allreduce;
  o.ranks_per_node = strategy.HierarchicalInterNranks(role);
  return o;
}

transpiler::LocalSGDOptions LocalSGDOptionsFor(const DistributedStrategy& strategy,
                                               const Role& role) {
  transpiler::LocalSGDOptions o;
  o.rings = RingOptionsFor(strategy, role);
  o.steps = strategy.local_sgd_steps;
  o.warmup_steps = strategy.LocalSgdWarmupSteps();
  return o;
}

void TranspileGradientMerge(Program& main, Program& startup, const DistributedStrategy& strategy) {
  if (!strategy.gradient_merge) return;
  transpiler::GradientMergePass(gradient_merge::PassOptions(strategy.gradient_merge_configs))
      .Apply(main, startup);
}

void TranspileSyncBatchNorm(Program& main, Program& startup, const DistributedStrategy& strategy) {
  if (!strategy.sync_batch_norm) return;
  transpiler::SyncBatchNormPass(transpiler::SyncBatchNormOptions{0}).Apply(main, startup);
}

void Transpile(Program& main, Program& startup, const DistributedStrategy& strategy,
               const Role& role) {
  TranspileGradientMerge(main, startup, strategy);
  TranspileSyncBatchNorm(main, startup, strategy);
  TranspileCollective(main, startup, strategy, role);
}

void TranspileCollective(Program& main, Program& startup, const DistributedStrategy& strategy,
                         const Role& role) {
  if (role.world_size <= 1) return;
  if (strategy.use_local_sgd) {
    transpiler::LocalSGDPass(LocalSGDOptionsFor(strategy, role)).Apply(main, startup);
  } else {
    transpiler::GradAllReducePass(GradAllReduceOptionsFor(strategy, role)).Apply(main, startup);
    // One optimizer op per fused gradient group (one CUDA launch each); none without fusion.
    transpiler::MergeOptimizerOpsPass().Apply(main, startup);
  }
}

}  // namespace fleet
}  // namespace keel
