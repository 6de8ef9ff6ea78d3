#include "fleet/transpile.h"

#include "transpiler/gradient_merge_pass.h"
#include "transpiler/merge_optimizer_pass.h"
#include "transpiler/sharding_pass.h"

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
                                                         const Role& role, double group_bytes) {
  transpiler::GradAllReduceOptions o;
  o.rings = RingOptionsFor(strategy, role);
  o.fuse = strategy.fuse_all_reduce_ops;
  o.fuse_mb = strategy.fuse_grad_size_in_MB;
  o.fuse_num = strategy.fuse_grad_size_in_num;
  if (strategy.fuse_by_ring_model) o.group_bytes = group_bytes;
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

void Transpile(Program& main, Program& startup, const DistributedStrategy& strategy,
               const Role& role) {
  TranspileGradientMerge(main, startup, strategy);
  TranspileCollective(main, startup, strategy, role);
}

void TranspileCollective(Program& main, Program& startup, const DistributedStrategy& strategy,
                         const Role& role, double group_bytes) {
  if (role.world_size <= 1) return;
  if (strategy.sharding) {
    // ZeRO-1: gradients reduce-scattered to their owners instead of all-reduced.
    transpiler::ShardingOptions o;
    o.rings = RingOptionsFor(strategy, role);
    transpiler::ShardingPass(o).Apply(main, startup);
  } else if (strategy.use_local_sgd) {
    transpiler::LocalSGDPass(LocalSGDOptionsFor(strategy, role)).Apply(main, startup);
  } else {
    transpiler::GradAllReducePass(GradAllReduceOptionsFor(strategy, role, group_bytes))
        .Apply(main, startup);
    // One optimizer op per fused gradient group (one CUDA launch each); none without fusion.
    transpiler::MergeOptimizerOpsPass().Apply(main, startup);
  }
}

}  // namespace fleet
}  // namespace keel
