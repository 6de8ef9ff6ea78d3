// DistributedStrategy: how fleet::distributed_optimizer transpiles and runs a collective job
// (Paddle 1.x's collective DistributedStrategy; docs/architecture.md, "Transpiling").
//
// Every field has an effect or is refused by Validate / RequireImplemented with an error naming
// it: a field that only matters under a switch (fuse_grad_size_in_MB without
// fuse_all_reduce_ops, ...) is refused when set while its switch is off.
//
// Flags (settable as FLAGS_name=value in the environment, see keel::Init):
//   --sync_nccl_allreduce, --comm_timeout_s   defaults of the fields of the same name, read when a
//                                             strategy is constructed;
//   --fuse_parameter_memory_size (MB), --fuse_parameter_groups_size
//                                             Paddle's fusion flags; when either is given,
//                                             ApplyFlagOverrides() copies them to paddle_fuse
//                                             and gradients are grouped as Paddle groups them.
#pragma once

#include <string>
#include <vector>

#include "executor/execution_strategy.h"
#include "fleet/role.h"
#include "framework/dsl/amp.h"
#include "framework/dsl/gradient_merge.h"

namespace keel {
namespace fleet {

struct DistributedStrategy {
  DistributedStrategy();  // defaults below; sync_nccl_allreduce and comm_timeout_s from the flags

  // Rings (communicators) that gradient all-reduces are spread over: grad i uses ring i % n.
  int nccl_comm_num = 1;

  // Group gradients, in the order backward produces them, into buffers of at most
  // fuse_grad_size_in_MB megabytes and fuse_grad_size_in_num tensors; one all-reduce per group.
  bool fuse_all_reduce_ops = false;
  double fuse_grad_size_in_MB = 32;
  // 8 as in Paddle 2.x's DistributedStrategy; Paddle 1.x's FLAGS_fuse_parameter_groups_size
  // defaulted to 1 (3 in early 1.x), but its seed recipe sets 50 explicitly.
  int fuse_grad_size_in_num = 8;
  // With fuse_all_reduce_ops (and not Paddle's fusion flags): a group also closes once its
  // all-reduce's fixed latency stops mattering, at a size minimize measures on the job's CPU
  // ring (framework/comm/ring_model.h), so that the first groups leave while backward still runs.
  // false, or on CUDA places (not measured yet): groups fill up to the two limits above.
  bool fuse_by_ring_model = true;

  // Paddle's fusion flags, copied here by ApplyFlagOverrides() when either flag is given. With
  // `given`, gradients are grouped as Paddle's coalesce_grad_tensor_pass groups them, and
  // fuse_grad_size_in_MB / _num must stay at their defaults:
  //   a layer's parameters (names up to the first '.', e.g. fc_0.w_0 and fc_0.b_0) form one
  //   group; memory_size_mb < 0: a group per layer; 0: one group of every gradient; > 0:
  //   consecutive layers merge until a group holds memory_size_mb megabytes or more, or (with
  //   groups_size > 1) more than groups_size gradients. groups_size 1 or -1: no count limit.
  //   Each group then splits by dtype.
  struct PaddleFuseFlags {
    bool given = false;
    double memory_size_mb = -1;  // FLAGS_fuse_parameter_memory_size
    int groups_size = 1;         // FLAGS_fuse_parameter_groups_size
  };
  PaddleFuseFlags paddle_fuse;

  // Reduce-scatter inside a node, all-reduce across nodes, all-gather inside the node.
  bool use_hierarchical_allreduce = false;
  int hierarchical_allreduce_inter_nranks = 0;  // ranks per node; 0 = the role's local_world_size

  // Synchronous training for local_sgd_warmup_steps, then each rank steps alone and parameters
  // are averaged every local_sgd_steps steps.
  bool use_local_sgd = false;
  int local_sgd_steps = 1;
  int local_sgd_warmup_steps = 0;
  // Paddle's name for local_sgd_warmup_steps (its seed: local_sgd_is_warm_steps); -1: not set.
  // Either may be set; both set to different values is refused. Warm-up counts steps.
  int local_sgd_is_warm_steps = -1;

  // The seed's FLAGS_sync_nccl_allreduce. keel's all-reduces run on their rings' threads and
  // streams, overlapping backward, and each completes before the ops that read its result
  // (c_sync_comm_stream) and before the step's run returns: Paddle's `true`. `false` (an
  // all-reduce that may still run when the step ends) is refused by RequireImplemented.
  bool sync_nccl_allreduce = true;
  // Seconds the setup of each ring and every collective on it may take: minimize() gives it to
  // the rings the startup program creates. (fleet::init's store connection, made before any
  // strategy exists, and store waits are bounded by --comm_timeout_s.)
  int comm_timeout_s = 300;

  ExecutionStrategy exec_strategy;

  // Mixed precision (framework/dsl/amp.h): the forward program rewritten to run mul/matmul/conv2d
  // and what follows them in amp_configs.dtype, with loss scaling for float16. amp_configs.place
  // is set from the worker's place.
  bool amp = false;
  amp::AmpConfig amp_configs;

  // Recompute (framework/autodiff/backward.h): backward keeps only the checkpoints from forward
  // and runs the forward segments between them again. Empty checkpoints: the vars the model
  // marked with recompute_checkpoint().
  bool recompute = false;
  struct RecomputeConfigs {
    std::vector<std::string> checkpoints;
  } recompute_configs;
  // Gradient merge (transpiler/gradient_merge_pass.h): gradients accumulate over
  // gradient_merge_configs.k_steps runs in persistable buffers; the all-reduce of the buffers, the
  // loss-scale decision, the clip, the learning-rate schedule and the updates run on every k-th
  // run only, so all-reduces drop k-fold. On any number of workers.
  bool gradient_merge = false;
  gradient_merge::GradientMergeConfig gradient_merge_configs;

  // ZeRO-1 sharding (transpiler/sharding_pass.h, docs/sharding.md): each rank owns a contiguous,
  // size-balanced set of parameters; gradients are reduce-scattered to their owners, only owners
  // run the optimizer and hold its state (about 1/N of it per rank), and parameters are broadcast
  // from their owners. Instead of the gradient all-reduce; with one worker it changes nothing.
  bool sharding = false;
  struct ShardingConfigs {
    int stage = 1;            // 1: optimizer state (2 and 3 are refused: not built)
    int sharding_degree = 0;  // ranks sharing one copy of the state; 0 or world_size for now
  } sharding_configs;
  // Tensor (model) parallelism, Megatron style (docs/tensor-parallel.md; Paddle's names): groups
  // of tensor_parallel_degree consecutive ranks (fleet/topology.h) each hold one copy of the
  // model, its parallel layers split over the group; data parallelism fills the rest of the world
  // (world_size / degree replicas, all-reducing gradients among ranks of one group coordinate).
  // The model must be built inside fleet::tensor_parallel_guard(strategy).
  bool tensor_parallel = false;
  struct TensorParallelConfigs {
    int tensor_parallel_degree = 1;
  } tensor_parallel_configs;
  // The degree in force: tensor_parallel_degree with the switch on, else 1.
  int TensorParallelDegree() const {
    return tensor_parallel ? tensor_parallel_configs.tensor_parallel_degree : 1;
  }
  // Synchronized batch norm (transpiler/sync_batch_norm_pass.h, docs/sync-batch-norm.md): every
  // training-mode batch_norm of the main program becomes sync_batch_norm on ring 0, normalizing
  // with the statistics of every rank's batch together (weighted by count, so unequal batches are
  // exact). On any number of workers (alone: batch_norm's result, unbiased moving variance), on
  // CPU and CUDA places; refused with use_local_sgd (ranks hold different parameters).
  bool sync_batch_norm = false;

  // Each fully connected layer's mul and bias add run as one fused_gemm_epilogue op, forward and
  // backward (transpiler/fuse_gemm_epilogue_pass.h; Paddle's BuildStrategy.fuse_gemm_epilogue,
  // off by default there and here; keel train and keel bench turn it on): the same values bit for
  // bit, one pass over each layer's output fewer forward and no copy of its gradient backward.
  bool fuse_gemm_epilogue = false;

  // Gradient all-reduce in 16 bits for float32 training (docs/mixed-precision.md, "Communication
  // in low precision"): each float32 gradient (or fused buffer) is cast to
  // fp16_allreduce_configs.dtype before its all-reduce and back to float32 after it, where the
  // 1/nranks scale is applied; half the bytes on the wire. Paddle's switch is the bool (float16);
  // keel also takes bfloat16 (float32's range: no overflow). Refused beside amp (the gradients
  // are already low precision), sharding, use_local_sgd, gradient_merge and
  // use_hierarchical_allreduce (not built), naming both.
  bool fp16_allreduce = false;
  struct Fp16AllreduceConfigs {
    DType dtype = DType::kFloat16;  // kFloat16 or kBFloat16
  } fp16_allreduce_configs;
  // Pipeline parallelism (transpiler/pipeline_pass.h, docs/pipeline.md; Paddle's names): the
  // model's stages (marked with PipelineStageGuard, framework/dsl/pipeline.h) run on the
  // pp_degree ranks of a pipeline group, each holding its stage's parameters; a mini-batch runs
  // as accumulate_steps micro-batches whose gradients are summed, then the optimizer runs once.
  // Data parallelism fills the rest of the world (world_size / pp_degree groups).
  bool pipeline = false;
  struct PipelineConfigs {
    int pp_degree = 1;                   // stages (ranks per pipeline group), >= 2 with pipeline on
    int accumulate_steps = 1;            // micro-batches per mini-batch (M)
    int micro_batch_size = 0;            // rows per micro-batch; 0: the mini-batch's rows / M
    std::string schedule_mode = "1F1B";  // "1F1B" | "F-then-B"
  } pipeline_configs;
  // The number of stages in force: pp_degree with the switch on, else 1.
  int PipelineDegree() const { return pipeline ? pipeline_configs.pp_degree : 1; }
  // The pipeline part of Validate.
  void ValidatePipeline(const Role& role) const;
  // Parameter-server training (fleet::init(CloudRoleMaker(false)), docs/parameter-server.md;
  // Paddle's fields and defaults): the mode is a_sync=false: synchronous; a_sync=true with
  // a_sync_configs.k_steps <= 0 (-1: unset, as Paddle's setter makes it 0): asynchronous;
  // k_steps > 0: GEO every k steps. Only synchronous mode is built: the others are refused by
  // ValidateParameterServer. In collective mode both must stay at their defaults.
  bool a_sync = true;
  struct ASyncConfigs {
    int k_steps = -1;
    // Asynchronous mode (framework/ps/async_communicator.h): steps of gradients that may wait in
    // a trainer's communicator before the trainer blocks (Paddle's default 16); 0 (keel's): no
    // communicator, the trainer pushes and pulls in each step itself (one trainer then trains
    // exactly as one process). max_merge_var_num: the most queued steps merged into one push
    // (Paddle's default 1: none merged).
    int send_queue_size = 16;
    int max_merge_var_num = 1;
    // keel's, not Paddle's: with the communicator, how many of its own latest steps a trainer's
    // step may lack. 0 (the default): each step waits, after the ops that need no parameter (a
    // distributed table's lookups), for the parameters pulled after the trainer's previous push;
    // -1: never waits (Paddle's communicator, whose trainers train on parameters a step or more
    // behind their own updates, which costs this project's CTR model 0.02-0.05 AUC).
    int max_staleness = 0;
  } a_sync_configs;
  // Parameter-server trainers' memory budget in MiB (0: none; docs/sparse-embeddings.md): a
  // trainer whose own parameters and optimizer state (after the transpiler moved what lives on the
  // servers) exceed it is refused at minimize, naming the largest var. Parameter-server mode only.
  int64_t ps_worker_memory_mb = 0;

  // hierarchical_allreduce_inter_nranks with 0 resolved to role.local_world_size.
  int HierarchicalInterNranks(const Role& role) const;
  // local_sgd_warmup_steps, or local_sgd_is_warm_steps when only that one is set.
  int LocalSgdWarmupSteps() const;

  // One line, every field, in declaration order.
  std::string ToString() const;

  // Throws keel::Error naming the field and its value for: nccl_comm_num outside 1..8, fuse sizes
  // <= 0, hierarchical inter_nranks < 0 or not dividing role.world_size, local_sgd_steps < 1,
  // local_sgd_warmup_steps < 0, comm_timeout_s <= 0, exec_strategy.num_threads < 0,
  // exec_strategy.num_iteration_per_drop_scope < 1; for a field set
  // while the switch it belongs to is off (fuse_grad_size_*, paddle_fuse, inter_nranks,
  // local_sgd_*); for LocalSGD with fusion or hierarchy; for paddle_fuse values Paddle does not
  // define or that would have no effect, and for paddle_fuse given beside fuse_grad_size_*; for
  // gradient_merge beside use_local_sgd, fuse_all_reduce_ops, use_hierarchical_allreduce or
  // exec_strategy.use_cuda_graph (naming both), and gradient_merge_configs.k_steps < 1; for
  // sharding_configs.stage other than 1, sharding_degree other than 0 or world_size, and sharding
  // beside use_local_sgd, gradient_merge, use_hierarchical_allreduce, fuse_all_reduce_ops,
  // Paddle's fusion flags or nccl_comm_num > 1 (naming both);
  // tensor_parallel_configs set while tensor_parallel is off, a degree < 2 or not dividing
  // world_size, and tensor_parallel beside use_local_sgd, use_hierarchical_allreduce,
  // gradient_merge, amp or recompute (naming both);
  // sync_batch_norm beside use_local_sgd; fp16_allreduce_configs set
  // while fp16_allreduce is off, a dtype other than float16/bfloat16, and fp16_allreduce beside
  // amp, sharding, use_local_sgd, gradient_merge or use_hierarchical_allreduce (naming both).
  // sync_batch_norm beside use_local_sgd; pipeline_configs set while
  // pipeline is off, pp_degree < 2 or not dividing world_size (with the tensor-parallel degree),
  // accumulate_steps < 1, micro_batch_size < 0, a schedule_mode other than 1F1B / F-then-B, and
  // pipeline beside what it does not build (ValidatePipeline names both fields).
  void Validate(const Role& role) const;
  // The fp16_allreduce part of Validate.
  void ValidateFp16Allreduce() const;
  // The sharding part of Validate.
  void ValidateSharding(const Role& role) const;
  // The parameter-server part of Validate: in parameter-server mode (role.is_ps()) the mode must
  // be synchronous (a_sync=false; async and GEO are refused as not built), and every collective
  // field (rings, fusion, hierarchy, LocalSGD, gradient merge, sharding, tensor parallelism, sync
  // batch norm, amp, recompute) must stay at its default, each named when set; in collective
  // mode a_sync and a_sync_configs must stay at their defaults.
  void ValidateParameterServer(const Role& role) const;

  // Copies --fuse_parameter_memory_size / --fuse_parameter_groups_size into paddle_fuse when
  // either was given (on the command line or as FLAGS_ in the environment): the flags win over
  // the code, as in Paddle 1.x where the fusion pass read them.
  void ApplyFlagOverrides();

  // A setting of the strategy and whether keel implements it; RequireImplemented refuses the
  // requested ones that are not. Tests walk the table.
  struct Setting {
    const char* name;                               // "sync_nccl_allreduce=false"
    bool (*requested)(const DistributedStrategy&);  // the strategy asks for it
    void (*request)(DistributedStrategy*);          // asks for it (tests)
    bool implemented;
    const char* why;  // for the unimplemented: what is missing
  };
  static const std::vector<Setting>& Settings();

  // Throws keel::Error listing every requested setting keel does not implement (today:
  // sync_nccl_allreduce=false): refused rather than silently ignored.
  static void RequireImplemented(const DistributedStrategy& strategy);
};

}  // namespace fleet
}  // namespace keel
