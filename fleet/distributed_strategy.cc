#include "fleet/distributed_strategy.h"

#include <gflags/gflags.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "framework/error.h"

DEFINE_bool(sync_nccl_allreduce, true,
            "Each gradient all-reduce completes before the ops that read its result and before "
            "the step ends, overlapping backward (keel's mode; false is refused). Default of "
            "DistributedStrategy::sync_nccl_allreduce.");
DEFINE_int32(comm_timeout_s, 300,
             "Seconds the rendezvous store, communicator setup and each collective may take "
             "before failing (default of DistributedStrategy::comm_timeout_s).");
DEFINE_double(fuse_parameter_memory_size, -1.0,
              "Paddle's fusion flag: MB of gradients per fused all-reduce group (0: one group of "
              "every gradient; -1: a group per layer). Given, gradients are grouped as Paddle "
              "groups them (DistributedStrategy::paddle_fuse).");
DEFINE_int32(fuse_parameter_groups_size, 1,
             "Paddle's fusion flag: with --fuse_parameter_memory_size > 0, a group also closes "
             "past this many gradients; 1 or -1: no count limit.");

namespace keel {
namespace fleet {
namespace {

bool FlagGiven(const char* name) {
  gflags::CommandLineFlagInfo info;
  return gflags::GetCommandLineFlagInfo(name, &info) && !info.is_default;
}

const char* Bool(bool b) { return b ? "true" : "false"; }

}  // namespace

const std::vector<DistributedStrategy::Setting>& DistributedStrategy::Settings() {
  using S = DistributedStrategy;
  static const std::vector<Setting> settings = {
      {"fuse_all_reduce_ops=true", [](const S& s) { return s.fuse_all_reduce_ops; },
       [](S* s) { s->fuse_all_reduce_ops = true; }, true, ""},
      {"use_hierarchical_allreduce=true", [](const S& s) { return s.use_hierarchical_allreduce; },
       [](S* s) { s->use_hierarchical_allreduce = true; }, true, ""},
      {"use_local_sgd=true", [](const S& s) { return s.use_local_sgd; },
       [](S* s) { s->use_local_sgd = true; }, true, ""},
      {"nccl_comm_num>1", [](const S& s) { return s.nccl_comm_num > 1; },
       [](S* s) { s->nccl_comm_num = 2; }, true, ""},
      {"gradient_merge=true", [](const S& s) { return s.gradient_merge; },
       [](S* s) { s->gradient_merge = true; }, true, ""},
      {"sync_nccl_allreduce=false", [](const S& s) { return !s.sync_nccl_allreduce; },
       [](S* s) { s->sync_nccl_allreduce = false; }, false,
       "keel's rings complete each collective before their next one (compute goes on beside "
       "them, on the executor's workers); keep sync_nccl_allreduce=true "
       "(FLAGS_sync_nccl_allreduce=1, the seed's setting)"},
  };
  return settings;
}

DistributedStrategy::DistributedStrategy()
    : sync_nccl_allreduce(FLAGS_sync_nccl_allreduce), comm_timeout_s(FLAGS_comm_timeout_s) {}

int DistributedStrategy::LocalSgdWarmupSteps() const {
  return local_sgd_warmup_steps == 0 && local_sgd_is_warm_steps >= 0 ? local_sgd_is_warm_steps
                                                                     : local_sgd_warmup_steps;
}

int DistributedStrategy::HierarchicalInterNranks(const Role& role) const {
  return hierarchical_allreduce_inter_nranks == 0 ? role.local_world_size
                                                  : hierarchical_allreduce_inter_nranks;
}

namespace {
std::string ListString(const std::set<std::string>& list) {
  std::string out = "[";
  for (const std::string& t : list) out += StrCat(out.size() > 1 ? " " : "", t);
  return out + "]";
}
template <typename T>
std::string OptString(const std::optional<T>& v) {
  if (!v) return "unset";
  if constexpr (std::is_same_v<T, bool>) {
    return *v ? "true" : "false";
  } else {
    return StrCat(*v);
  }
}
// ", amp=..., amp_configs={...}" (every field but place, which fleet sets).
std::string AmpString(const DistributedStrategy& st) {
  const amp::AmpConfig& c = st.amp_configs;
  return StrCat(
      ", amp=", st.amp ? "true" : "false", ", amp_configs={dtype=", DTypeName(c.dtype),
      ", level=", c.level, ", use_dynamic_loss_scaling=", OptString(c.use_dynamic_loss_scaling),
      ", init_loss_scaling=", OptString(c.init_loss_scaling),
      ", incr_every_n_steps=", c.incr_every_n_steps,
      ", decr_every_n_nan_or_inf=", c.decr_every_n_nan_or_inf, ", incr_ratio=", c.incr_ratio,
      ", decr_ratio=", c.decr_ratio, ", custom_white_list=", ListString(c.custom_white_list),
      ", custom_black_list=", ListString(c.custom_black_list),
      ", check_kernels=", c.check_kernels ? "true" : "false", "}");
}
// ", recompute=..., recompute_configs={checkpoints=[...]}".
std::string RecomputeString(const DistributedStrategy& st) {
  std::string list = "[";
  for (const std::string& c : st.recompute_configs.checkpoints)
    list += StrCat(list.size() > 1 ? " " : "", c);
  return StrCat(", recompute=", st.recompute ? "true" : "false",
                ", recompute_configs={checkpoints=", list, "]}");
}
// ", gradient_merge=..., gradient_merge_configs={...}".
std::string GradientMergeString(const DistributedStrategy& st) {
  const gradient_merge::GradientMergeConfig& c = st.gradient_merge_configs;
  return StrCat(", gradient_merge=", st.gradient_merge ? "true" : "false",
                ", gradient_merge_configs={k_steps=", c.k_steps, ", avg=", c.avg ? "true" : "false",
                "}");
}
// ", sharding=..., sharding_configs={...}".
std::string ShardingString(const DistributedStrategy& st) {
  return StrCat(", sharding=", st.sharding ? "true" : "false",
                ", sharding_configs={stage=", st.sharding_configs.stage,
                ", sharding_degree=", st.sharding_configs.sharding_degree, "}");
}
}  // namespace

std::string DistributedStrategy::ToString() const {
  return StrCat(
      "DistributedStrategy{nccl_comm_num=", nccl_comm_num,
      ", fuse_all_reduce_ops=", Bool(fuse_all_reduce_ops),
      ", fuse_grad_size_in_MB=", fuse_grad_size_in_MB,
      ", fuse_grad_size_in_num=", fuse_grad_size_in_num,
      ", fuse_by_ring_model=", Bool(fuse_by_ring_model),
      ", paddle_fuse={given=", Bool(paddle_fuse.given),
      ", memory_size_mb=", paddle_fuse.memory_size_mb, ", groups_size=", paddle_fuse.groups_size,
      "}", ", use_hierarchical_allreduce=", Bool(use_hierarchical_allreduce),
      ", hierarchical_allreduce_inter_nranks=", hierarchical_allreduce_inter_nranks,
      ", use_local_sgd=", Bool(use_local_sgd), ", local_sgd_steps=", local_sgd_steps,
      ", local_sgd_warmup_steps=", local_sgd_warmup_steps,
      ", local_sgd_is_warm_steps=", local_sgd_is_warm_steps,
      ", sync_nccl_allreduce=", Bool(sync_nccl_allreduce), ", comm_timeout_s=", comm_timeout_s,
      ", exec_strategy={num_threads=", exec_strategy.num_threads,
      ", num_iteration_per_drop_scope=", exec_strategy.num_iteration_per_drop_scope,
      ", use_cuda_graph=", Bool(exec_strategy.use_cuda_graph), "}", AmpString(*this),
      RecomputeString(*this), GradientMergeString(*this), ShardingString(*this),
      ", tensor_parallel=", Bool(tensor_parallel),
      ", tensor_parallel_configs={tensor_parallel_degree=",
      tensor_parallel_configs.tensor_parallel_degree, "}",
      ", sync_batch_norm=", Bool(sync_batch_norm),
      ", fuse_gemm_epilogue=", Bool(fuse_gemm_epilogue), ", fp16_allreduce=", Bool(fp16_allreduce),
      ", fp16_allreduce_configs={dtype=", DTypeName(fp16_allreduce_configs.dtype), "}",
      ", pipeline=", Bool(pipeline), ", pipeline_configs={pp_degree=", pipeline_configs.pp_degree,
      ", accumulate_steps=", pipeline_configs.accumulate_steps,
      ", micro_batch_size=", pipeline_configs.micro_batch_size,
      ", schedule_mode=", pipeline_configs.schedule_mode, "}", ", a_sync=", Bool(a_sync),
      ", a_sync_configs={k_steps=", a_sync_configs.k_steps,
      ", send_queue_size=", a_sync_configs.send_queue_size,
      ", max_merge_var_num=", a_sync_configs.max_merge_var_num,
      ", max_staleness=", a_sync_configs.max_staleness, "}",
      ", ps_worker_memory_mb=", ps_worker_memory_mb, "}");
}

void DistributedStrategy::Validate(const Role& role) const {
  const char* s = "DistributedStrategy.";
  KEEL_ENFORCE(nccl_comm_num >= 1 && nccl_comm_num <= 8, s, "nccl_comm_num=", nccl_comm_num,
               " must be in 1..8");
  KEEL_ENFORCE(fuse_grad_size_in_MB > 0, s, "fuse_grad_size_in_MB=", fuse_grad_size_in_MB,
               " must be > 0");
  KEEL_ENFORCE(fuse_grad_size_in_num > 0, s, "fuse_grad_size_in_num=", fuse_grad_size_in_num,
               " must be > 0");
  KEEL_ENFORCE(hierarchical_allreduce_inter_nranks >= 0, s,
               "hierarchical_allreduce_inter_nranks=", hierarchical_allreduce_inter_nranks,
               " must be >= 0 (0 = local_world_size)");
  if (use_hierarchical_allreduce) {
    const int k = HierarchicalInterNranks(role);
    KEEL_ENFORCE(role.world_size % k == 0, s, "hierarchical_allreduce_inter_nranks=", k,
                 hierarchical_allreduce_inter_nranks == 0 ? " (local_world_size)" : "",
                 " does not divide world_size=", role.world_size,
                 "; it is the number of ranks per node");
  }
  KEEL_ENFORCE(local_sgd_steps >= 1, s, "local_sgd_steps=", local_sgd_steps, " must be >= 1");
  // LocalSGD averages parameters instead of all-reducing gradients: the gradient all-reduce
  // switches would have nothing to act on, and are refused rather than ignored.
  KEEL_ENFORCE(!use_local_sgd || (!fuse_all_reduce_ops && !use_hierarchical_allreduce), s,
               "use_local_sgd=true does not combine with ",
               fuse_all_reduce_ops ? "fuse_all_reduce_ops=true" : "use_hierarchical_allreduce=true",
               ": LocalSGD averages parameters and all-reduces no gradients");
  KEEL_ENFORCE(local_sgd_warmup_steps >= 0, s, "local_sgd_warmup_steps=", local_sgd_warmup_steps,
               " must be >= 0");
  KEEL_ENFORCE(local_sgd_is_warm_steps >= -1, s,
               "local_sgd_is_warm_steps=", local_sgd_is_warm_steps,
               " must be >= 0 (or -1: not set)");
  KEEL_ENFORCE(local_sgd_is_warm_steps < 0 || local_sgd_warmup_steps == 0 ||
                   local_sgd_is_warm_steps == local_sgd_warmup_steps,
               s, "local_sgd_is_warm_steps=", local_sgd_is_warm_steps, " and ", s,
               "local_sgd_warmup_steps=", local_sgd_warmup_steps,
               " disagree: they are one setting (Paddle's name and keel's); set one of them");

  // Fields that only act under a switch: set while it is off, they would be ignored.
  const DistributedStrategy d;
  auto off = [&](bool changed, const std::string& field, const char* sw) {
    KEEL_ENFORCE(!changed, s, field, " is set but ", s, sw,
                 "=false, so it would have no effect; turn ", sw, " on or leave ", field,
                 " at its default");
  };
  if (!fuse_all_reduce_ops) {
    off(fuse_grad_size_in_MB != d.fuse_grad_size_in_MB,
        StrCat("fuse_grad_size_in_MB=", fuse_grad_size_in_MB), "fuse_all_reduce_ops");
    off(fuse_grad_size_in_num != d.fuse_grad_size_in_num,
        StrCat("fuse_grad_size_in_num=", fuse_grad_size_in_num), "fuse_all_reduce_ops");
    off(fuse_by_ring_model != d.fuse_by_ring_model,
        StrCat("fuse_by_ring_model=", Bool(fuse_by_ring_model)), "fuse_all_reduce_ops");
    KEEL_ENFORCE(!paddle_fuse.given,
                 "FLAGS_fuse_parameter_memory_size=", paddle_fuse.memory_size_mb,
                 " / FLAGS_fuse_parameter_groups_size=", paddle_fuse.groups_size, " are given but ",
                 s, "fuse_all_reduce_ops=false, so they would have no effect",
                 use_local_sgd ? " (LocalSGD all-reduces parameters, not gradients)" : "",
                 "; turn fusion on or unset the flags");
  }
  if (!use_hierarchical_allreduce)
    off(hierarchical_allreduce_inter_nranks != 0,
        StrCat("hierarchical_allreduce_inter_nranks=", hierarchical_allreduce_inter_nranks),
        "use_hierarchical_allreduce");
  if (!use_local_sgd) {
    off(local_sgd_steps != d.local_sgd_steps, StrCat("local_sgd_steps=", local_sgd_steps),
        "use_local_sgd");
    off(local_sgd_warmup_steps != 0, StrCat("local_sgd_warmup_steps=", local_sgd_warmup_steps),
        "use_local_sgd");
    off(local_sgd_is_warm_steps != -1, StrCat("local_sgd_is_warm_steps=", local_sgd_is_warm_steps),
        "use_local_sgd");
  }

  // Paddle's fusion flags: the values Paddle defines, and never beside keel's own sizes.
  if (paddle_fuse.given) {
    const double mb = paddle_fuse.memory_size_mb;
    const int num = paddle_fuse.groups_size;
    KEEL_ENFORCE(mb == -1.0 || mb >= 0, "FLAGS_fuse_parameter_memory_size=", mb,
                 " must be >= 0 (MB per group; 0: one group) or -1 (a group per layer)");
    KEEL_ENFORCE(num == -1 || num >= 1, "FLAGS_fuse_parameter_groups_size=", num,
                 " must be >= 1 (gradients per group; 1: no limit) or -1 (no limit)");
    KEEL_ENFORCE(num <= 1 || mb > 0, "FLAGS_fuse_parameter_groups_size=", num,
                 " has no effect unless FLAGS_fuse_parameter_memory_size > 0 (as in Paddle, the "
                 "count limit applies only when layers merge by size; it is ",
                 mb, "); set both");
    KEEL_ENFORCE(fuse_grad_size_in_MB == d.fuse_grad_size_in_MB &&
                     fuse_grad_size_in_num == d.fuse_grad_size_in_num,
                 "FLAGS_fuse_parameter_memory_size / FLAGS_fuse_parameter_groups_size are given, "
                 "so gradients are grouped as Paddle groups them, and ",
                 s, "fuse_grad_size_in_MB=", fuse_grad_size_in_MB,
                 " / fuse_grad_size_in_num=", fuse_grad_size_in_num,
                 " would be ignored; use one or the other");
    KEEL_ENFORCE(fuse_by_ring_model,
                 "FLAGS_fuse_parameter_memory_size / FLAGS_fuse_parameter_groups_size are given, "
                 "so gradients are grouped as Paddle groups them, and ",
                 s, "fuse_by_ring_model=false would have no effect; use one or the other");
  }
  if (amp) {
    amp::ValidateAmpConfig(amp_configs, s);
    // LocalSGD ranks step on their own gradients, so their overflow flags (and loss scales)
    // would differ: keel all-reduces no flag there.
    KEEL_ENFORCE(!use_local_sgd || !amp::ScalesLoss(amp_configs), s,
                 "amp=true with loss scaling (amp_configs.dtype=", DTypeName(amp_configs.dtype),
                 ") does not combine with ", s,
                 "use_local_sgd=true: each rank would skip steps on its own overflow flag; use "
                 "bfloat16 without loss scaling, or plain data parallelism");
    // AMP O2 (low-precision parameters, float32 masters): what is not built beside it.
    if (amp_configs.level == "O2") {
      auto both = [&](bool conflict, const char* other, const char* why) {
        KEEL_ENFORCE(!conflict, s, "amp_configs.level=O2 does not combine with ", s, other, ": ",
                     why);
      };
      both(use_local_sgd, "use_local_sgd=true",
           "LocalSGD would average the low-precision parameters and leave the float32 masters "
           "apart");
      both(sharding, "sharding=true", "sharding the float32 masters is not built");
      both(gradient_merge, "gradient_merge=true",
           "merging low-precision gradients over k runs is not built (they would accumulate in "
           "16 bits)");
      both(recompute, "recompute=true", "recompute with low-precision parameters is not tested");
    }
  } else {
    const amp::AmpConfig a;
    const amp::AmpConfig& c = amp_configs;
    off(c.dtype != a.dtype, StrCat("amp_configs.dtype=", DTypeName(c.dtype)), "amp");
    off(c.level != a.level, StrCat("amp_configs.level=", c.level), "amp");
    off(c.use_dynamic_loss_scaling != a.use_dynamic_loss_scaling,
        StrCat("amp_configs.use_dynamic_loss_scaling=", OptString(c.use_dynamic_loss_scaling)),
        "amp");
    off(c.init_loss_scaling != a.init_loss_scaling,
        StrCat("amp_configs.init_loss_scaling=", OptString(c.init_loss_scaling)), "amp");
    off(c.incr_every_n_steps != a.incr_every_n_steps,
        StrCat("amp_configs.incr_every_n_steps=", c.incr_every_n_steps), "amp");
    off(c.decr_every_n_nan_or_inf != a.decr_every_n_nan_or_inf,
        StrCat("amp_configs.decr_every_n_nan_or_inf=", c.decr_every_n_nan_or_inf), "amp");
    off(c.incr_ratio != a.incr_ratio, StrCat("amp_configs.incr_ratio=", c.incr_ratio), "amp");
    off(c.decr_ratio != a.decr_ratio, StrCat("amp_configs.decr_ratio=", c.decr_ratio), "amp");
    off(c.custom_white_list != a.custom_white_list,
        StrCat("amp_configs.custom_white_list=", ListString(c.custom_white_list)), "amp");
    off(c.custom_black_list != a.custom_black_list,
        StrCat("amp_configs.custom_black_list=", ListString(c.custom_black_list)), "amp");
    off(c.check_kernels != a.check_kernels, "amp_configs.check_kernels=false", "amp");
  }
  if (!recompute)
    off(!recompute_configs.checkpoints.empty(), "recompute_configs.checkpoints", "recompute");
  if (gradient_merge) {
    gradient_merge::ValidateGradientMergeConfig(gradient_merge_configs, s);
    // Settings that cannot act on a program whose optimizer runs in a merge step.
    auto both = [&](bool conflict, const char* other, const char* why) {
      KEEL_ENFORCE(!conflict, s, "gradient_merge=true does not combine with ", s, other, ": ", why);
    };
    both(use_local_sgd, "use_local_sgd=true",
         "LocalSGD steps each rank on its own gradients every run and averages parameters, "
         "gradient merge steps every k_steps runs on the all-reduced merged gradients; use one");
    both(fuse_all_reduce_ops, "fuse_all_reduce_ops=true",
         "the merged gradients are all-reduced one by one, once per merge step (fusing the "
         "merge buffers is not built); set fuse_all_reduce_ops=false");
    both(use_hierarchical_allreduce, "use_hierarchical_allreduce=true",
         "the merged gradients are all-reduced on flat rings (a hierarchical all-reduce of "
         "the merge buffers is not built)");
    both(exec_strategy.use_cuda_graph, "exec_strategy.use_cuda_graph=true",
         "the merge step is a conditional_block whose condition comes to the host every run, "
         "which a CUDA graph cannot replay");
  } else {
    const gradient_merge::GradientMergeConfig g;
    off(gradient_merge_configs.k_steps != g.k_steps,
        StrCat("gradient_merge_configs.k_steps=", gradient_merge_configs.k_steps),
        "gradient_merge");
    off(gradient_merge_configs.avg != g.avg, "gradient_merge_configs.avg=false", "gradient_merge");
  }
  ValidateSharding(role);
  ValidateFp16Allreduce();
  ValidatePipeline(role);
  ValidateParameterServer(role);
  // Tensor parallelism (docs/tensor-parallel.md, "What is refused").
  if (tensor_parallel) {
    const int tp = tensor_parallel_configs.tensor_parallel_degree;
    KEEL_ENFORCE(tp >= 2, s, "tensor_parallel_configs.tensor_parallel_degree=", tp,
                 " must be >= 2 with ", s, "tensor_parallel=true (1 is plain data parallelism)");
    KEEL_ENFORCE(role.world_size % tp == 0, s,
                 "tensor_parallel_configs.tensor_parallel_degree=", tp,
                 " does not divide world_size=", role.world_size,
                 " (data parallelism fills world_size / degree)");
    auto both = [&](bool conflict, const char* other, const char* why) {
      KEEL_ENFORCE(!conflict, s, "tensor_parallel=true does not combine with ", s, other, ": ",
                   why);
    };
    both(use_local_sgd, "use_local_sgd=true",
         "LocalSGD would average the sharded parameters' replicas on their own schedule, which "
         "is not built or tested with tensor-parallel groups");
    both(use_hierarchical_allreduce, "use_hierarchical_allreduce=true",
         "the data-parallel ranks of a tensor-parallel job are not one node's consecutive ranks, "
         "which the hierarchical rings assume");
  } else {
    off(tensor_parallel_configs.tensor_parallel_degree != 1,
        StrCat("tensor_parallel_configs.tensor_parallel_degree=",
               tensor_parallel_configs.tensor_parallel_degree),
        "tensor_parallel");
  }
  if (sync_batch_norm) {
    KEEL_ENFORCE(!use_local_sgd, s, "sync_batch_norm=true does not combine with ", s,
                 "use_local_sgd=true: between their averaging steps LocalSGD's ranks hold "
                 "different parameters, so one set of batch statistics over all ranks' batches "
                 "normalizes activations of different models; use one");
    KEEL_ENFORCE(!tensor_parallel || role.world_size != TensorParallelDegree(), s,
                 "sync_batch_norm=true with ", s,
                 "tensor_parallel_configs.tensor_parallel_degree=", TensorParallelDegree(), " on ",
                 role.world_size,
                 " workers: there is one data-parallel replica, so no other batch to synchronize "
                 "with (and no data-parallel ring); turn sync_batch_norm off, or add replicas");
  }
  KEEL_ENFORCE(amp_configs.place == amp::AmpConfig().place, s,
               "amp_configs.place is set: under fleet the worker's place decides which kernels "
               "AMP may use; leave it at its default");
  KEEL_ENFORCE(comm_timeout_s > 0, s, "comm_timeout_s=", comm_timeout_s, " must be > 0");
  KEEL_ENFORCE(exec_strategy.num_threads >= 0, s,
               "exec_strategy.num_threads=", exec_strategy.num_threads,
               " must be >= 0 (0: one worker per core of the budget)");
  KEEL_ENFORCE(exec_strategy.num_iteration_per_drop_scope >= 1, s,
               "exec_strategy.num_iteration_per_drop_scope=",
               exec_strategy.num_iteration_per_drop_scope, " must be >= 1");
}

void DistributedStrategy::ValidateSharding(const Role& role) const {
  const char* s = "DistributedStrategy.";
  const ShardingConfigs d;
  const ShardingConfigs& c = sharding_configs;
  if (!sharding) {
    auto off = [&](bool changed, const std::string& field) {
      KEEL_ENFORCE(!changed, s, field, " is set but ", s,
                   "sharding=false, so it would have no effect; turn sharding on or leave ", field,
                   " at its default");
    };
    off(c.stage != d.stage, StrCat("sharding_configs.stage=", c.stage));
    off(c.sharding_degree != d.sharding_degree,
        StrCat("sharding_configs.sharding_degree=", c.sharding_degree));
    return;
  }
  KEEL_ENFORCE(c.stage == 1, s, "sharding_configs.stage=", c.stage,
               " is not built: keel shards the optimizer state only (stage 1); stages 2 "
               "(gradients) and 3 (parameters) are refused");
  // The data-parallel group: the world, or the replicas of a pipeline stage or of a
  // tensor-parallel coordinate.
  const int model =
      (pipeline ? std::max(1, pipeline_configs.pp_degree) : 1) * TensorParallelDegree();
  const int group = role.world_size / std::max(1, model);
  KEEL_ENFORCE(c.sharding_degree == 0 || c.sharding_degree == group, s,
               "sharding_configs.sharding_degree=", c.sharding_degree, " must be 0 or ",
               group == role.world_size ? "the world size (" : "the data-parallel degree (", group,
               "): sharding groups inside data-parallel groups need the hybrid topology, not "
               "built yet");
  KEEL_ENFORCE(
      model <= 1 || role.world_size % model != 0 || group > 1, s, "sharding=true with ", s,
      pipeline ? StrCat("pipeline_configs.pp_degree=", pipeline_configs.pp_degree, " ")
               : std::string(),
      tensor_parallel
          ? StrCat("tensor_parallel_configs.tensor_parallel_degree=", TensorParallelDegree(), " ")
          : std::string(),
      "on ", role.world_size,
      " workers: there is one data-parallel replica, so no group to shard the optimizer "
      "state over; turn sharding off, or add replicas");
  auto both = [&](bool conflict, const std::string& other, const char* why) {
    KEEL_ENFORCE(!conflict, s, "sharding=true does not combine with ", s, other, ": ", why);
  };
  both(use_local_sgd, "use_local_sgd=true",
       "LocalSGD steps every rank's whole optimizer on its own gradients; sharding gives each "
       "parameter's update to one owner");
  both(gradient_merge, "gradient_merge=true",
       "the merge step's buffers and updates are not sharded (not built)");
  both(use_hierarchical_allreduce, "use_hierarchical_allreduce=true",
       "sharding reduce-scatters the gradients on one flat ring (a two-level reduce-scatter to "
       "owners is not built)");
  both(fuse_all_reduce_ops, "fuse_all_reduce_ops=true",
       "sharding always fuses the gradients into one buffer laid out by owner; leave "
       "fuse_all_reduce_ops off");
  both(paddle_fuse.given, "paddle_fuse (FLAGS_fuse_parameter_memory_size / _groups_size)",
       "sharding lays gradients out by owner, not by Paddle's groups");
  both(nccl_comm_num != 1, StrCat("nccl_comm_num=", nccl_comm_num),
       "sharding runs its reduce-scatter and broadcasts on ring 0 only");
}

void DistributedStrategy::ValidateFp16Allreduce() const {
  const char* s = "DistributedStrategy.";
  const DType t = fp16_allreduce_configs.dtype;
  if (!fp16_allreduce) {
    KEEL_ENFORCE(t == Fp16AllreduceConfigs().dtype, s,
                 "fp16_allreduce_configs.dtype=", DTypeName(t), " is set but ", s,
                 "fp16_allreduce=false, so it would have no effect; turn fp16_allreduce on or "
                 "leave fp16_allreduce_configs.dtype at its default");
    return;
  }
  KEEL_ENFORCE(t == DType::kFloat16 || t == DType::kBFloat16, s,
               "fp16_allreduce_configs.dtype must be float16 or bfloat16, got ", DTypeName(t));
  auto both = [&](bool conflict, const char* other, const char* why) {
    KEEL_ENFORCE(!conflict, s, "fp16_allreduce=true does not combine with ", s, other, ": ", why);
  };
  both(amp, "amp=true",
       "under AMP the gradients are already cast where they are made; fp16_allreduce is for "
       "float32 training");
  both(sharding, "sharding=true",
       "sharding reduce-scatters float32 gradients to their owners (a 16-bit reduce-scatter is "
       "not built)");
  both(use_local_sgd, "use_local_sgd=true",
       "LocalSGD averages parameters, not gradients, so there is no gradient all-reduce to cast");
  both(gradient_merge, "gradient_merge=true",
       "the merged buffers are all-reduced in float32 (a 16-bit all-reduce of merged gradients is "
       "not built)");
  both(use_hierarchical_allreduce, "use_hierarchical_allreduce=true",
       "the two-level all-reduce moves float32 buffers (16 bits there is not built)");
}

void DistributedStrategy::ValidatePipeline(const Role& role) const {
  const char* s = "DistributedStrategy.";
  const PipelineConfigs d;
  const PipelineConfigs& c = pipeline_configs;
  if (!pipeline) {
    auto off = [&](bool changed, const std::string& field) {
      KEEL_ENFORCE(!changed, s, field, " is set but ", s,
                   "pipeline=false, so it would have no effect; turn pipeline on or leave ", field,
                   " at its default");
    };
    off(c.pp_degree != d.pp_degree, StrCat("pipeline_configs.pp_degree=", c.pp_degree));
    off(c.accumulate_steps != d.accumulate_steps,
        StrCat("pipeline_configs.accumulate_steps=", c.accumulate_steps));
    off(c.micro_batch_size != d.micro_batch_size,
        StrCat("pipeline_configs.micro_batch_size=", c.micro_batch_size));
    off(c.schedule_mode != d.schedule_mode,
        StrCat("pipeline_configs.schedule_mode=", c.schedule_mode));
    return;
  }
  KEEL_ENFORCE(c.pp_degree >= 2, s, "pipeline_configs.pp_degree=", c.pp_degree,
               " must be >= 2 with ", s, "pipeline=true (1 stage is no pipeline)");
  KEEL_ENFORCE(role.world_size % c.pp_degree == 0, s, "pipeline_configs.pp_degree=", c.pp_degree,
               " does not divide world_size=", role.world_size,
               " (data parallelism fills world_size / pp_degree)");
  if (tensor_parallel) {
    const int tp = tensor_parallel_configs.tensor_parallel_degree;
    KEEL_ENFORCE(tp < 1 || role.world_size % (c.pp_degree * tp) == 0, s,
                 "pipeline_configs.pp_degree=", c.pp_degree, " times ", s,
                 "tensor_parallel_configs.tensor_parallel_degree=", tp,
                 " does not divide world_size=", role.world_size,
                 " (each stage is a tensor-parallel group; data parallelism fills the rest)");
  }
  KEEL_ENFORCE(c.accumulate_steps >= 1, s, "pipeline_configs.accumulate_steps=", c.accumulate_steps,
               " must be >= 1 (micro-batches per mini-batch)");
  KEEL_ENFORCE(c.micro_batch_size >= 0, s, "pipeline_configs.micro_batch_size=", c.micro_batch_size,
               " must be >= 0 (0: the mini-batch's rows / accumulate_steps)");
  KEEL_ENFORCE(c.schedule_mode == "1F1B" || c.schedule_mode == "F-then-B", s,
               "pipeline_configs.schedule_mode='", c.schedule_mode, "' must be 1F1B or F-then-B");
  auto both = [&](bool conflict, const std::string& other, const char* why) {
    KEEL_ENFORCE(!conflict, s, "pipeline=true does not combine with ", s, other, ": ", why);
  };
  both(use_local_sgd, "use_local_sgd=true",
       "LocalSGD's parameter averaging is not built for pipeline stages");
  both(gradient_merge, "gradient_merge=true",
       "the pipeline already accumulates gradients over pipeline_configs.accumulate_steps "
       "micro-batches; raise that instead");
  // Sync batch norm: each stage's replicas normalize each micro-batch together over their
  // data-parallel ring, which one replica does not have.
  KEEL_ENFORCE(!sync_batch_norm || role.world_size > c.pp_degree * TensorParallelDegree(), s,
               "sync_batch_norm=true with ", s, "pipeline_configs.pp_degree=", c.pp_degree,
               tensor_parallel ? StrCat(" and tensor_parallel_degree=", TensorParallelDegree())
                               : std::string(),
               " on ", role.world_size,
               " workers: there is one data-parallel replica, so no other batch to synchronize "
               "with (and no data-parallel ring); turn sync_batch_norm off, or add replicas");
  both(use_hierarchical_allreduce, "use_hierarchical_allreduce=true",
       "the data-parallel ranks of a pipeline job are not one node's consecutive ranks");
  both(exec_strategy.use_cuda_graph, "exec_strategy.use_cuda_graph=true",
       "point-to-point transfers cannot be captured in a CUDA graph");
}

void DistributedStrategy::ValidateParameterServer(const Role& role) const {
  const char* s = "DistributedStrategy.";
  const DistributedStrategy d;
  const int k = a_sync_configs.k_steps;
  if (!role.is_ps()) {
    KEEL_ENFORCE(ps_worker_memory_mb == 0, s, "ps_worker_memory_mb=", ps_worker_memory_mb,
                 " bounds parameter-server trainers, but this is a collective job; leave it 0");
    KEEL_ENFORCE(a_sync == d.a_sync && k == d.a_sync_configs.k_steps &&
                     a_sync_configs.send_queue_size == d.a_sync_configs.send_queue_size &&
                     a_sync_configs.max_merge_var_num == d.a_sync_configs.max_merge_var_num &&
                     a_sync_configs.max_staleness == d.a_sync_configs.max_staleness,
                 s, "a_sync=", Bool(a_sync), " / a_sync_configs.k_steps=", k,
                 " / a_sync_configs.send_queue_size=", a_sync_configs.send_queue_size,
                 " / a_sync_configs.max_merge_var_num=", a_sync_configs.max_merge_var_num,
                 " / a_sync_configs.max_staleness=", a_sync_configs.max_staleness,
                 " choose the parameter-server mode, but this is a collective job "
                 "(fleet::init(CloudRoleMaker(true))); leave them at their defaults or use "
                 "CloudRoleMaker(false)");
    return;
  }
  KEEL_ENFORCE(ps_worker_memory_mb >= 0, s, "ps_worker_memory_mb=", ps_worker_memory_mb,
               " must be >= 0 (0: no budget)");
  KEEL_ENFORCE(k >= -1, s, "a_sync_configs.k_steps=", k,
               " must be >= 0 (0: async, > 0: GEO every k steps; -1: unset)");
  KEEL_ENFORCE(a_sync || k <= 0, s, "a_sync_configs.k_steps=", k, " asks for GEO but ", s,
               "a_sync=false asks for synchronous training; set a_sync=true for GEO or leave "
               "k_steps unset");
  const ASyncConfigs& c = a_sync_configs;
  KEEL_ENFORCE(c.send_queue_size >= 0 && c.max_merge_var_num >= 1, s,
               "a_sync_configs.send_queue_size=", c.send_queue_size,
               " must be >= 0 (0: no communicator) and max_merge_var_num=", c.max_merge_var_num,
               " >= 1");
  KEEL_ENFORCE(c.max_staleness >= -1, s, "a_sync_configs.max_staleness=", c.max_staleness,
               " must be >= 0 (own steps a step may lack) or -1 (never wait)");
  KEEL_ENFORCE(c.max_staleness == d.a_sync_configs.max_staleness || c.send_queue_size > 0, s,
               "a_sync_configs.max_staleness=", c.max_staleness,
               " bounds the communicator's staleness, but send_queue_size=0 asks for none (each "
               "step pushes and pulls itself); leave it at its default");
  KEEL_ENFORCE((a_sync && k <= 0) || (c.send_queue_size == d.a_sync_configs.send_queue_size &&
                                      c.max_merge_var_num == d.a_sync_configs.max_merge_var_num &&
                                      c.max_staleness == d.a_sync_configs.max_staleness),
               s, "a_sync_configs.send_queue_size=", c.send_queue_size,
               " / max_merge_var_num=", c.max_merge_var_num, " / max_staleness=", c.max_staleness,
               " configure the asynchronous communicator, but this job is ",
               a_sync ? "GEO" : "synchronous", "; leave them at their defaults");
  auto refuse = [&](bool set, const std::string& field) {
    KEEL_ENFORCE(!set, s, field,
                 " is a collective (all-reduce) setting and has no meaning in parameter-server "
                 "mode, where trainers send gradients to servers; leave it at its default");
  };
  refuse(nccl_comm_num != d.nccl_comm_num, StrCat("nccl_comm_num=", nccl_comm_num));
  refuse(fuse_all_reduce_ops, "fuse_all_reduce_ops=true");
  refuse(fuse_grad_size_in_MB != d.fuse_grad_size_in_MB,
         StrCat("fuse_grad_size_in_MB=", fuse_grad_size_in_MB));
  refuse(fuse_grad_size_in_num != d.fuse_grad_size_in_num,
         StrCat("fuse_grad_size_in_num=", fuse_grad_size_in_num));
  refuse(paddle_fuse.given, "paddle_fuse (FLAGS_fuse_parameter_memory_size / _groups_size)");
  refuse(use_hierarchical_allreduce, "use_hierarchical_allreduce=true");
  refuse(use_local_sgd, "use_local_sgd=true");
  refuse(local_sgd_steps != d.local_sgd_steps, StrCat("local_sgd_steps=", local_sgd_steps));
  refuse(gradient_merge, "gradient_merge=true");
  refuse(sharding, "sharding=true");
  refuse(tensor_parallel, "tensor_parallel=true");
  refuse(sync_batch_norm, "sync_batch_norm=true");
  refuse(pipeline, "pipeline=true");
  refuse(fp16_allreduce, "fp16_allreduce=true");
  auto not_built = [&](bool set, const char* field) {
    KEEL_ENFORCE(!set, s, field,
                 " with parameter-server training is not built yet in keel; turn it off");
  };
  not_built(amp, "amp=true");
  not_built(recompute, "recompute=true");
  not_built(exec_strategy.use_cuda_graph, "exec_strategy.use_cuda_graph=true");
  KEEL_ENFORCE(role.selected_gpus.empty(),
               "parameter-server training runs on CPU in keel; "
               "this role selects GPU ",
               role.selected_gpus.empty() ? 0 : role.selected_gpus[0]);
}

void DistributedStrategy::ApplyFlagOverrides() {
  if (!FlagGiven("fuse_parameter_memory_size") && !FlagGiven("fuse_parameter_groups_size")) return;
  paddle_fuse.given = true;
  paddle_fuse.memory_size_mb = FLAGS_fuse_parameter_memory_size;
  paddle_fuse.groups_size = FLAGS_fuse_parameter_groups_size;
}

void DistributedStrategy::RequireImplemented(const DistributedStrategy& strategy) {
  std::string refused;
  for (const Setting& p : Settings()) {
    if (!p.requested(strategy) || p.implemented) continue;
    refused += StrCat(refused.empty() ? "" : "; ", "DistributedStrategy.", p.name,
                      " is not implemented in keel: ", p.why);
  }
  KEEL_ENFORCE(refused.empty(), refused, " (refused rather than ignored)");
}

}  // namespace fleet
}  // namespace keel
