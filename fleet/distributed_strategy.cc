#include "fleet/distributed_strategy.h"

#include <gflags/gflags.h>

#include <vector>

#include "framework/error.h"

DEFINE_bool(sync_nccl_allreduce, true,
            "Wait for each gradient all-reduce before running the next op (default of "
            "DistributedStrategy::sync_nccl_allreduce).");
DEFINE_int32(comm_timeout_s, 300,
             "Seconds the rendezvous store, communicator setup and each collective may take "
             "before failing (default of DistributedStrategy::comm_timeout_s).");
DEFINE_double(fuse_parameter_memory_size, -1.0,
              "MB of gradients per fused all-reduce group; overrides "
              "DistributedStrategy::fuse_grad_size_in_MB when set. -1 = unset.");
DEFINE_int32(fuse_parameter_groups_size, -1,
             "Gradients per fused all-reduce group; overrides "
             "DistributedStrategy::fuse_grad_size_in_num when set. -1 = unset.");

namespace keel {
namespace fleet {
namespace {

// A strategy switch and whether keel has the transpiler pass behind it. Implementing a pass
// flips its `implemented` here and nothing else.
struct StrategyPass {
  const char* field;
  bool (*enabled)(const DistributedStrategy&);
  bool implemented;
};

const StrategyPass kStrategyPasses[] = {
    {"fuse_all_reduce_ops", [](const DistributedStrategy& s) { return s.fuse_all_reduce_ops; },
     true},
    {"use_hierarchical_allreduce",
     [](const DistributedStrategy& s) { return s.use_hierarchical_allreduce; }, true},
    {"use_local_sgd", [](const DistributedStrategy& s) { return s.use_local_sgd; }, true},
};

const char* Bool(bool b) { return b ? "true" : "false"; }

}  // namespace

DistributedStrategy::DistributedStrategy()
    : sync_nccl_allreduce(FLAGS_sync_nccl_allreduce), comm_timeout_s(FLAGS_comm_timeout_s) {}

int DistributedStrategy::HierarchicalInterNranks(const Role& role) const {
  return hierarchical_allreduce_inter_nranks == 0 ? role.local_world_size
                                                  : hierarchical_allreduce_inter_nranks;
}

std::string DistributedStrategy::ToString() const {
  return StrCat("DistributedStrategy{nccl_comm_num=", nccl_comm_num,
                ", fuse_all_reduce_ops=", Bool(fuse_all_reduce_ops),
                ", fuse_grad_size_in_MB=", fuse_grad_size_in_MB,
                ", fuse_grad_size_in_num=", fuse_grad_size_in_num,
                ", use_hierarchical_allreduce=", Bool(use_hierarchical_allreduce),
                ", hierarchical_allreduce_inter_nranks=", hierarchical_allreduce_inter_nranks,
                ", use_local_sgd=", Bool(use_local_sgd), ", local_sgd_steps=", local_sgd_steps,
                ", local_sgd_warmup_steps=", local_sgd_warmup_steps,
                ", sync_nccl_allreduce=", Bool(sync_nccl_allreduce),
                ", comm_timeout_s=", comm_timeout_s,
                ", exec_strategy={num_threads=", exec_strategy.num_threads,
                ", num_iteration_per_drop_scope=", exec_strategy.num_iteration_per_drop_scope,
                "}}");
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
  KEEL_ENFORCE(comm_timeout_s > 0, s, "comm_timeout_s=", comm_timeout_s, " must be > 0");
  KEEL_ENFORCE(exec_strategy.num_threads >= 0, s, "exec_strategy.num_threads=",
               exec_strategy.num_threads, " must be >= 0 (0: one worker per core of the budget)");
  KEEL_ENFORCE(exec_strategy.num_iteration_per_drop_scope >= 1, s,
               "exec_strategy.num_iteration_per_drop_scope=",
               exec_strategy.num_iteration_per_drop_scope, " must be >= 1");
}

void DistributedStrategy::ApplyFlagOverrides() {
  const double mb = FLAGS_fuse_parameter_memory_size;
  KEEL_ENFORCE(mb == -1.0 || mb > 0, "FLAGS_fuse_parameter_memory_size=", mb,
               " must be > 0 (MB per fused all-reduce group) or -1 (unset)");
  if (mb > 0) fuse_grad_size_in_MB = mb;
  const int num = FLAGS_fuse_parameter_groups_size;
  KEEL_ENFORCE(num == -1 || num > 0, "FLAGS_fuse_parameter_groups_size=", num,
               " must be > 0 (gradients per fused all-reduce group) or -1 (unset)");
  if (num > 0) fuse_grad_size_in_num = num;
}

void DistributedStrategy::RequireImplemented(const DistributedStrategy& strategy) {
  std::vector<std::string> refused;
  for (const StrategyPass& p : kStrategyPasses) {
    if (p.enabled(strategy) && !p.implemented) refused.push_back(p.field);
  }
  if (refused.empty()) return;
  std::string list;
  for (const auto& f : refused)
    list += (list.empty() ? "" : ", ") + ("DistributedStrategy." + f + "=true");
  KEEL_THROW(list, ": not implemented yet in keel; ", refused.size() == 1 ? "it is" : "they are",
             " refused rather than ignored. Turn ", refused.size() == 1 ? "it" : "them", " off.");
}

}  // namespace fleet
}  // namespace keel
