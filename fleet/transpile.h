// The collective transpiler's pipeline: which passes a strategy asks for, in order, and each
// pass's options filled from the user's DistributedStrategy and Role.
//
// Requires: main holds forward, backward and optimizer ops (Optimizer::minimize); startup
//   initializes every parameter; the strategy is validated for the role.
// Guarantees, in this order:
//   1. GradientMergePass when strategy.gradient_merge, with any number of workers: it moves the
//      optimizer section into its merge sub-block, so it must see the section as minimize left
//      it, before any collective;
//   2. with role.world_size > 1: PipelinePass first when strategy.pipeline (this rank's stage),
//      then ShardingPass when strategy.sharding (ZeRO-1, instead of the
//      gradient all-reduce), LocalSGDPass when strategy.use_local_sgd, else GradAllReducePass
//      (fusion and hierarchy are its options; after gradient merge it all-reduces the merged
//      buffers inside the merge sub-block, once per merge step, instead of every run's gradients)
//      then MergeOptimizerOpsPass (nothing to merge without fused groups), on the data-parallel
//      group's rings (all ranks without tensor parallelism; none when the tensor-parallel group
//      is the whole world); then, with tensor parallelism, TensorParallelPass (the tensor-parallel
//      ring, replicated parameters broadcast in the group); nothing with one worker.
//   minimize runs 1 before it records which persistables the passes made (gradient merge's
//   buffers and counter are checkpointed, so that a resume mid-accumulation is exact) and 2 after.
// Leaves alone: everything the chosen passes leave alone; starts no communication, so `keel
//   inspect --strategy` prints a job's programs without any worker (and so without the ring
//   model that sizes fusion groups in a running job: inspect shows groups filled to the limits).
#pragma once

#include "fleet/distributed_strategy.h"
#include "fleet/role.h"
#include "fleet/topology.h"
#include "framework/dsl/tensor_parallel.h"
#include "framework/ir/program.h"
#include "transpiler/grad_allreduce_pass.h"
#include "transpiler/local_sgd_pass.h"
#include "transpiler/pipeline_pass.h"
#include "transpiler/tensor_parallel_pass.h"

namespace keel {
namespace fleet {

// The job's hybrid topology: tensor_parallel_degree (1 without tensor_parallel) ranks per
// tensor-parallel group, pp_degree (1 without pipeline) stages per pipeline group, data
// parallelism filling the rest.
Topology TopologyFor(const DistributedStrategy& strategy, const Role& role);
// The data-parallel rings of `strategy` (nccl_comm_num) and the role's place on them: the role's
// data-parallel group (all ranks without tensor parallelism), its index in it, its first GPU.
transpiler::RingOptions RingOptionsFor(const DistributedStrategy& strategy, const Role& role);
// `group_bytes`: GradAllReduceOptions::group_bytes, from the ring model minimize measured when
// strategy.fuse_by_ring_model applies (0: none; groups fill up to the strategy's limits).
transpiler::GradAllReduceOptions GradAllReduceOptionsFor(const DistributedStrategy& strategy,
                                                         const Role& role, double group_bytes = 0);
// The pipeline stage of `role` (fleet/topology.h: its index in its pipeline group).
transpiler::PipelineOptions PipelineOptionsFor(const DistributedStrategy& strategy,
                                               const Role& role);
transpiler::LocalSGDOptions LocalSGDOptionsFor(const DistributedStrategy& strategy,
                                               const Role& role);

// The tensor-parallel group `role` builds its model in (degree 1 without tensor_parallel).
TensorParallelConfig TensorParallelConfigFor(const DistributedStrategy& strategy, const Role& role);
transpiler::TensorParallelOptions TensorParallelOptionsFor(const DistributedStrategy& strategy,
                                                           const Role& role);

// Step 1: GradientMergePass when strategy.gradient_merge; nothing otherwise.
void TranspileGradientMerge(Program& main, Program& startup, const DistributedStrategy& strategy);
// Step 1b: SyncBatchNormPass on ring 0 when strategy.sync_batch_norm (any number of workers;
// after gradient merge, which refuses ring ops); nothing otherwise.
void TranspileSyncBatchNorm(Program& main, Program& startup, const DistributedStrategy& strategy);
// Step 1c: FuseGemmEpiloguePass when strategy.fuse_gemm_epilogue, with any number of workers, after
// gradient merge and sync batch norm, before the parameter-server or collective passes; then, with
// gradient merge, FuseGradAccumulationPass (the gradients' ops add into the merge buffers).
void TranspileFuseGemmEpilogue(Program& main, Program& startup,
                               const DistributedStrategy& strategy);
// Under sharding: the owner of each optimizer state var of this rank's main program, as its index
// in the data-parallel group (the world, or the replicas of a pipeline stage or tensor-parallel
// coordinate; the sharding pass makes the group's ring 0), and this rank's index there.
struct ShardedStateOwners {
  std::map<std::string, int> index;
  int my_index = 0;
};
// Step 2: the data-parallel passes, then, under AMP O1, AmpWeightCopyPass where the updates are
// plain (one worker, or the all-reduce of data parallelism without a pipeline or tensor
// parallelism: transpiler/amp_weight_copy_pass.h). With `owners` and sharding on, it receives the
// owners of the state (nothing otherwise).
void TranspileCollective(Program& main, Program& startup, const DistributedStrategy& strategy,
                         const Role& role, double group_bytes = 0,
                         ShardedStateOwners* owners = nullptr);
// Parameter-server mode (role.is_ps()): instead of step 2, ParameterServerPass makes this role's
// programs (a trainer's, or server role.rank's; transpiler/ps_pass.h).
void TranspileParameterServer(Program& main, Program& startup, const DistributedStrategy& strategy,
                              const Role& role);
// All, in order (what minimize does after backward and the updates; keel inspect --strategy).
void Transpile(Program& main, Program& startup, const DistributedStrategy& strategy,
               const Role& role);

}  // namespace fleet
}  // namespace keel
