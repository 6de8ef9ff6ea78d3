#include "fleet/transpile.h"

#include "transpiler/amp_weight_copy_pass.h"
#include "transpiler/fuse_gemm_epilogue_pass.h"
#include "transpiler/fuse_grad_accumulation_pass.h"
#include "transpiler/gradient_merge_pass.h"
#include "transpiler/merge_optimizer_pass.h"
#include "transpiler/narrow_grads_pass.h"
#include "transpiler/pipeline_pass.h"
#include "transpiler/ps_pass.h"
#include "transpiler/sharding_pass.h"
#include "transpiler/sync_batch_norm_pass.h"
#include "transpiler/tensor_parallel_pass.h"

namespace keel {
namespace fleet {

Topology TopologyFor(const DistributedStrategy& strategy, const Role& role) {
  const int tp = strategy.TensorParallelDegree();
  const int pp = strategy.PipelineDegree();
  KEEL_ENFORCE(tp >= 1 && role.world_size % tp == 0,
               "DistributedStrategy.tensor_parallel_configs.tensor_parallel_degree=", tp,
               " does not divide world_size=", role.world_size);
  KEEL_ENFORCE(pp >= 1 && role.world_size % (tp * pp) == 0,
               "DistributedStrategy.pipeline_configs.pp_degree=", pp,
               " does not divide world_size=", role.world_size, " / tensor-parallel degree ", tp);
  return Topology(role.world_size, role.world_size / (tp * pp), pp, tp);
}

transpiler::RingOptions RingOptionsFor(const DistributedStrategy& strategy, const Role& role) {
  const Topology topo = TopologyFor(strategy, role);
  transpiler::RingOptions r;
  r.nrings = strategy.nccl_comm_num;
  r.nranks = topo.dp_degree();
  r.rank = topo.Coord(role.rank).dp;
  r.device = role.selected_gpus.empty() ? -1 : role.selected_gpus[0];
  r.group = topo.DpGroupName(role.rank);
  return r;
}

TensorParallelConfig TensorParallelConfigFor(const DistributedStrategy& strategy,
                                             const Role& role) {
  const Topology topo = TopologyFor(strategy, role);
  TensorParallelConfig c;
  c.degree = topo.tp_degree();
  c.rank = topo.Coord(role.rank).tp;
  c.ring_id = transpiler::kTensorParallelRingId;
  return c;
}

transpiler::TensorParallelOptions TensorParallelOptionsFor(const DistributedStrategy& strategy,
                                                           const Role& role) {
  const Topology topo = TopologyFor(strategy, role);
  transpiler::TensorParallelOptions o;
  o.degree = topo.tp_degree();
  o.rank = topo.Coord(role.rank).tp;
  o.group = topo.TpGroupName(role.rank);
  o.device = role.selected_gpus.empty() ? -1 : role.selected_gpus[0];
  return o;
}

transpiler::PipelineOptions PipelineOptionsFor(const DistributedStrategy& strategy,
                                               const Role& role) {
  const Topology topo = TopologyFor(strategy, role);
  transpiler::PipelineOptions o;
  o.degree = topo.pp_degree();
  o.stage = topo.Coord(role.rank).pp;
  o.micro_batches = strategy.pipeline_configs.accumulate_steps;
  o.micro_batch_size = strategy.pipeline_configs.micro_batch_size;
  o.device = role.selected_gpus.empty() ? -1 : role.selected_gpus[0];
  o.group = topo.PpGroupName(role.rank);
  return o;
}

transpiler::GradAllReduceOptions GradAllReduceOptionsFor(const DistributedStrategy& strategy,
                                                         const Role& role, double group_bytes) {
  transpiler::GradAllReduceOptions o;
  {
    const Topology topo = TopologyFor(strategy, role);
    o.has_loss = topo.Coord(role.rank).pp == topo.pp_degree() - 1;
  }
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
  if (strategy.fp16_allreduce) o.comm_dtype = strategy.fp16_allreduce_configs.dtype;
  o.amp_low_precision_grads = strategy.amp;
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

void TranspileFuseGemmEpilogue(Program& main, Program& startup,
                               const DistributedStrategy& strategy) {
  if (strategy.fuse_gemm_epilogue) transpiler::FuseGemmEpiloguePass().Apply(main, startup);
  // Gradient merge's accumulation done by the gradients' ops, once they are the fused ones.
  if (strategy.gradient_merge) transpiler::FuseGradAccumulationPass().Apply(main, startup);
}

void Transpile(Program& main, Program& startup, const DistributedStrategy& strategy,
               const Role& role) {
  TranspileGradientMerge(main, startup, strategy);
  TranspileSyncBatchNorm(main, startup, strategy);
  TranspileFuseGemmEpilogue(main, startup, strategy);
  if (role.is_ps()) {
    TranspileParameterServer(main, startup, strategy, role);
  } else {
    TranspileCollective(main, startup, strategy, role);
  }
}

void TranspileParameterServer(Program& main, Program& startup, const DistributedStrategy& strategy,
                              const Role& role) {
  transpiler::PsOptions o;
  const int k = strategy.a_sync_configs.k_steps;
  o.mode = !strategy.a_sync ? transpiler::PsMode::kSync
           : k > 0          ? transpiler::PsMode::kGeo
                            : transpiler::PsMode::kAsync;
  o.geo_k = k > 0 ? k : 0;
  o.nservers = role.server_num;
  o.ntrainers = role.trainer_num;
  o.server_index = role.is_server() ? role.rank : -1;
  o.worker_memory_mb = strategy.ps_worker_memory_mb;
  o.send_queue_size = strategy.a_sync_configs.send_queue_size;
  o.max_merge_var_num = strategy.a_sync_configs.max_merge_var_num;
  o.max_staleness = strategy.a_sync_configs.max_staleness;
  transpiler::ParameterServerPass(o).Apply(main, startup);
}

namespace {
// AMP O1's weight casts kept from step to step (transpiler/amp_weight_copy_pass.h). Only where
// each parameter's update is its own plain op: sharding, LocalSGD, pipelines and tensor
// parallelism have layouts and checkpoints of their own that know the parameters' updates (the
// pass would find nothing to do under sharding and LocalSGD anyway: other ops write the weights).
void CopyLowWeights(Program& main, Program& startup, const DistributedStrategy& strategy) {
  if (strategy.amp && strategy.amp_configs.level == "O1")
    transpiler::AmpWeightCopyPass().Apply(main, startup);
}

// fp16_allreduce in bfloat16 on CPU ranks of plain data parallelism: the gradients whose ops can
// make them 16-bit are made so there (transpiler/narrow_grads_pass.h), without the casts around
// the all-reduce. Not on GPUs: cuBLAS has no float32 GEMM with a 16-bit result, so the narrowing
// would be the cast's own pass, and the widening updates would lose the merged multi-tensor
// launch. Not for pipelines (a stage's accumulators read its gradients) or tensor parallelism
// (its pass runs after this one and is not written for 16-bit gradients).
bool NarrowsGrads(const DistributedStrategy& strategy, const Topology& topo,
                  const transpiler::GradAllReduceOptions& o) {
  return strategy.fp16_allreduce && o.comm_dtype == DType::kBFloat16 && o.rings.device < 0 &&
         topo.pp_degree() == 1 && topo.tp_degree() == 1;
}
}  // namespace

void TranspileCollective(Program& main, Program& startup, const DistributedStrategy& strategy,
                         const Role& role, double group_bytes, ShardedStateOwners* owners) {
  if (role.world_size <= 1) {
    CopyLowWeights(main, startup, strategy);
    return;
  }
  const Topology topo = TopologyFor(strategy, role);
  // Pipeline first: the data-parallel passes then see this stage's program only (and all-reduce
  // or reduce-scatter its gradient accumulators once per mini-batch). Each rank creates the
  // pipeline ring, then its data-parallel rings.
  if (topo.pp_degree() > 1)
    transpiler::PipelinePass(PipelineOptionsFor(strategy, role)).Apply(main, startup);
  // The data-parallel passes on the dp ring (every rank of one tp coordinate of one stage), then
  // the tensor-parallel ring: each rank creates its rings in this order.
  if (topo.dp_degree() == 1) {
    // Nothing to all-reduce or shard over: the group holds the only replica.
  } else if (strategy.sharding) {
    // ZeRO-1: gradients reduce-scattered to their owners instead of all-reduced, over the
    // data-parallel group (the whole world without a pipeline or tensor parallelism).
    transpiler::ShardingOptions o;
    o.rings = RingOptionsFor(strategy, role);
    if (owners != nullptr) {
      owners->my_index = o.rings.rank;
      owners->index = transpiler::PlanSharding(main, o.rings.nranks).StateOwners();
    }
    transpiler::ShardingPass(o).Apply(main, startup);
  } else if (strategy.use_local_sgd) {
    transpiler::LocalSGDPass(LocalSGDOptionsFor(strategy, role)).Apply(main, startup);
  } else {
    const transpiler::GradAllReduceOptions o = GradAllReduceOptionsFor(strategy, role, group_bytes);
    if (NarrowsGrads(strategy, topo, o))
      transpiler::NarrowGradsPass(o.comm_dtype).Apply(main, startup);
    transpiler::GradAllReducePass(o).Apply(main, startup);
    if (topo.pp_degree() == 1 && topo.tp_degree() == 1) CopyLowWeights(main, startup, strategy);
    // One optimizer op per fused gradient group (one CUDA launch each); none without fusion.
    transpiler::MergeOptimizerOpsPass().Apply(main, startup);
  }
  if (topo.tp_degree() > 1)
    transpiler::TensorParallelPass(TensorParallelOptionsFor(strategy, role)).Apply(main, startup);
}

}  // namespace fleet
}  // namespace keel
