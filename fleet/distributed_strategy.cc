#include "fleet/distributed_strategy.h"

#include <gflags/gflags.h>

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

std::string DistributedStrategy::ToString() const {
  return StrCat(
      "DistributedStrategy{nccl_comm_num=", nccl_comm_num,
      ", fuse_all_reduce_ops=", Bool(fuse_all_reduce_ops),
      ", fuse_grad_size_in_MB=", fuse_grad_size_in_MB,
      ", fuse_grad_size_in_num=", fuse_grad_size_in_num,
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
      ", use_cuda_graph=", Bool(exec_strategy.use_cuda_graph), "}}");
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
  }
  KEEL_ENFORCE(comm_timeout_s > 0, s, "comm_timeout_s=", comm_timeout_s, " must be > 0");
  KEEL_ENFORCE(exec_strategy.num_threads >= 0, s,
               "exec_strategy.num_threads=", exec_strategy.num_threads,
               " must be >= 0 (0: one worker per core of the budget)");
  KEEL_ENFORCE(exec_strategy.num_iteration_per_drop_scope >= 1, s,
               "exec_strategy.num_iteration_per_drop_scope=",
               exec_strategy.num_iteration_per_drop_scope, " must be >= 1");
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
