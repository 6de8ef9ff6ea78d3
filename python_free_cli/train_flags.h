// What `keel train` (and `keel inspect --strategy`, `keel bench`) build from flags: the
// DistributedStrategy and the optimizer with its settings and learning-rate schedule. A flag that
// does not apply to the chosen optimizer or schedule is a keel::Error naming it.
#pragma once

#include <gflags/gflags.h>

#include <memory>
#include <string>

#include "fleet/distributed_strategy.h"
#include "framework/dsl/optimizer.h"
#include "models/model_zoo.h"

DECLARE_string(optimizer);
DECLARE_double(lr);
DECLARE_int32(tp_degree);
DECLARE_int32(pp_degree);
DECLARE_int32(micro_batches);
DECLARE_string(ps_mode);
DECLARE_string(ctr_table);
DECLARE_int32(geo_k);

namespace keel {
namespace cli {

// --nccl_comm_num, --fuse_all_reduce_ops, --hierarchical_allreduce_inter_nranks,
// --local_sgd_steps, --local_sgd_warmup_steps, --tp_degree (not yet validated against a role).
fleet::DistributedStrategy StrategyFromFlags();

// Parameter-server training: --ps_mode and --geo_k into `strategy` (a_sync,
// a_sync_configs.k_steps) when `role` is a parameter-server job's; collective flags set there are
// refused by name. Outside such a job, setting --ps_mode or --geo_k is a keel::Error naming it.
void PsStrategyFromFlags(const fleet::Role& role, fleet::DistributedStrategy* strategy);

// The built-in models' settings into cfg (whose name is set): --tp_degree's divisibility
// (--mlp_hidden; --heads, --d_ff, --vocab) and, for the transformer, --vocab --seq_len --d_model
// --heads --d_ff --layers --dropout. A setting the model does not have, or a value that cannot
// work, is a keel::Error naming the flag.
void ModelSettingsFromFlags(models::ModelConfig* cfg, bool parameter_server = false);

// --optimizer (empty: default_name), --lr (0: default_lr), --momentum, --nesterov, --beta1,
// --beta2, --epsilon, --weight_decay, --clip_global_norm, --lr_schedule and its flags.
// `total_steps` is the run's length, the default span of a cosine schedule (0: unknown).
std::unique_ptr<optimizer::Optimizer> OptimizerFromFlags(const std::string& default_name,
                                                         float default_lr, int64_t total_steps);

// One line for logs, e.g. "momentum(mu=0.9) lr=cosine(0.1 -> 0 over 1000 steps)".
std::string DescribeOptimizer(const optimizer::Optimizer& opt);

// True when the flag was given on the command line or as FLAGS_name in the environment.
bool FlagIsSet(const char* name);

}  // namespace cli
}  // namespace keel
