// Flags of `keel train` that choose the distributed strategy and the optimizer; shared with
// `keel inspect --strategy` and `keel bench`.
#include "python_free_cli/train_flags.h"

#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "framework/error.h"

// ---- distributed strategy (multi-worker)
DEFINE_int32(nccl_comm_num, 1, "Communication rings gradients are spread over (multi-worker).");
DEFINE_int32(local_sgd_steps, 0,
             "Multi-worker: LocalSGD (DistributedStrategy.use_local_sgd): each worker steps alone "
             "and parameters are averaged every this many steps; 0: synchronous training.");
DEFINE_int32(local_sgd_warmup_steps, 0,
             "LocalSGD: synchronous steps (parameters averaged every step) before the first local "
             "one.");
DEFINE_int32(hierarchical_allreduce_inter_nranks, 0,
             "Multi-worker: > 0 turns on hierarchical all-reduce (use_hierarchical_allreduce) "
             "with this many ranks per node: reduce-scatter inside a node, all-reduce across "
             "nodes, all-gather inside the node.");
DEFINE_bool(fuse_all_reduce_ops, true,
            "Multi-worker: all-reduce gradients in fused groups (DistributedStrategy."
            "fuse_all_reduce_ops; group limits from --fuse_parameter_memory_size and "
            "--fuse_parameter_groups_size, else 32 MB and 8 tensors); false: one by one.");
DEFINE_int32(gradient_merge_k, 1,
             "Gradient merge: steps per optimizer step and all-reduce; 1: off. The gradients of "
             "K steps accumulate and the optimizer steps on their mean every K-th, as one step on "
             "K times the batch (DistributedStrategy.gradient_merge); schedules count optimizer "
             "steps.");
DEFINE_int32(sharding_stage, 0,
             "Multi-worker: ZeRO sharding stage (DistributedStrategy.sharding); 1: each worker "
             "keeps the optimizer state of its own share of the parameters only (gradients "
             "reduce-scattered to their owners, parameters broadcast back); 0: off "
             "(docs/sharding.md).");

// ---- parameter-server training (docs/parameter-server.md), under keel launch --server_num
DEFINE_string(ps_mode, "sync",
              "Parameter-server jobs: sync | async | geo (docs/parameter-server.md).");
DEFINE_int32(geo_k, 100, "--ps_mode=geo: exchange with the servers every this many steps.");
DEFINE_int32(ps_max_staleness, 0,
             "--ps_mode=async: how many of its own latest steps a trainer's step may lack "
             "(a_sync_configs.max_staleness; -1: never wait, as Paddle's communicator).");

DEFINE_int32(tp_degree, 1,
             "Workers per tensor-parallel group (docs/tensor-parallel.md): transformer, resnet "
             "or mlp layers split Megatron-style, data parallelism fills the rest. 1: off.");

DEFINE_int32(pp_degree, 1,
             "Pipeline stages (docs/pipeline.md): mlp, lenet, resnet or transformer layers on "
             "pp_degree workers in a row, a mini-batch running as --micro_batches "
             "micro-batches; data parallelism fills the rest. 1: off.");
DEFINE_int32(micro_batches, 1,
             "With --pp_degree > 1: micro-batches per mini-batch (--batch_size must divide by "
             "it); gradients are summed over them and the optimizer steps once.");
DEFINE_string(pp_schedule, "1f1b",
              "With --pp_degree > 1: 1f1b (at most stages - stage micro-batches in flight) | "
              "fthenb (every forward, then every backward).");

// ---- the built-in models' settings
DEFINE_string(data_format, "NCHW",
              "resnet: NCHW | NHWC (channels last), its conv, batch norm and pooling layers' "
              "image layout (docs/channels-last.md).");
DEFINE_double(dropout, 0, "transformer: dropout after attention and feed-forward; 0: none.");
DEFINE_int32(vocab, 10, "transformer: vocabulary size; ctr: table rows (unset: 1000001).");
DEFINE_string(ctr_table, "",
              "ctr: its table: sparse (a gradient of the batch's rows) | dense | distributed "
              "(rows only on the parameter servers; --ps_mode sync or async). Unset: "
              "distributed under --ps_mode sync or async (as Paddle's servers keep the table), "
              "else sparse.");
DEFINE_int32(seq_len, 8, "transformer: tokens per sequence.");
DEFINE_int32(d_model, 32, "transformer: model width (a multiple of --heads).");
DEFINE_int32(heads, 2, "transformer: attention heads.");
DEFINE_int32(d_ff, 64, "transformer: feed-forward width.");
DEFINE_int32(layers, 2, "transformer: encoder layers.");

DEFINE_string(amp, "off", "Mixed precision: off | bf16 | fp16 (docs/mixed-precision.md).");
DEFINE_string(amp_level, "O1",
              "--amp: O1 (casts around matmuls and convolutions, float32 parameters) | O2 "
              "(low-precision parameters, float32 master weights in the optimizer).");
DEFINE_string(fp16_allreduce, "off",
              "Multi-worker, float32 training: off | fp16 | bf16 all-reduces the gradients in "
              "that 16-bit type, half the bytes (DistributedStrategy.fp16_allreduce, "
              "docs/mixed-precision.md).");
DEFINE_bool(recompute, false, "Recompute activations in backward (resnet, transformer).");
DEFINE_bool(sync_batch_norm, false,
            "Batch norm normalizes with the statistics of every worker's batch together "
            "(DistributedStrategy.sync_batch_norm, docs/sync-batch-norm.md; resnet).");
DEFINE_bool(fuse_gemm_epilogue, true,
            "Each fully connected layer's matrix product and bias add run as one op, forward and "
            "backward (DistributedStrategy.fuse_gemm_epilogue, docs/performance.md): the same "
            "values bit for bit, less memory traffic; false: separate mul and elementwise_add.");

// ---- optimizer
DEFINE_string(optimizer, "", "sgd | momentum | adam | adamw; empty: the model's default.");
DEFINE_double(lr, 0, "Learning rate (the base of a schedule); 0: the model's default.");
DEFINE_double(momentum, 0.9, "--optimizer=momentum: the velocity's decay mu.");
DEFINE_bool(nesterov, false, "--optimizer=momentum: Nesterov momentum.");
DEFINE_double(beta1, 0.9, "--optimizer=adam|adamw: decay of the first moment.");
DEFINE_double(beta2, 0.999, "--optimizer=adam|adamw: decay of the second moment.");
DEFINE_double(epsilon, 1e-8, "--optimizer=adam|adamw: added to the second moment's root.");
DEFINE_double(weight_decay, -1,
              "Weight decay: decoupled for adamw (default 0.01), L2 regularization (grad + "
              "wd * param) for sgd, momentum and adam (default 0).");
DEFINE_double(clip_global_norm, 0,
              "Scale all gradients together so their global L2 norm is at most this; 0: off.");
DEFINE_string(lr_schedule, "constant",
              "constant | piecewise (--lr_boundaries, --lr_values) | cosine (--lr from step 0 "
              "down to --min_lr at --lr_decay_steps).");
DEFINE_string(lr_boundaries, "", "piecewise: steps where the rate changes, e.g. 1000,2000.");
DEFINE_string(lr_values, "", "piecewise: one more rate than boundaries, e.g. 0.1,0.01,0.001.");
DEFINE_int32(lr_decay_steps, 0, "cosine: steps from --lr down to --min_lr; 0: the whole run.");
DEFINE_double(min_lr, 0, "cosine: the rate at --lr_decay_steps and after.");
DEFINE_int32(warmup_steps, 0,
             "Linear warm-up from --warmup_start_lr over this many steps before the schedule "
             "(any schedule); 0: none.");
DEFINE_double(warmup_start_lr, 0, "The rate at step 0 of the warm-up.");

namespace keel {
namespace cli {

namespace {

template <typename T>
std::vector<T> ParseList(const std::string& flag, const std::string& text) {
  std::vector<T> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::istringstream is(item);
    T v;
    KEEL_ENFORCE(!item.empty() && (is >> v) && is.eof(), "--", flag, "='", text, "': '", item,
                 "' is not a number");
    out.push_back(v);
  }
  return out;
}

// Refuses a set flag that the chosen optimizer or schedule ignores.
void RefuseUnless(bool applies, const char* flag, const std::string& why) {
  KEEL_ENFORCE(applies || !FlagIsSet(flag), "--", flag, " applies only to ", why);
}

lr_schedule::Schedule Copy(const LearningRate& lr) { return lr.schedule(); }

}  // namespace

bool FlagIsSet(const char* name) {
  gflags::CommandLineFlagInfo info;
  return gflags::GetCommandLineFlagInfo(name, &info) && !info.is_default;
}

fleet::DistributedStrategy StrategyFromFlags() {
  fleet::DistributedStrategy strategy;
  strategy.nccl_comm_num = FLAGS_nccl_comm_num;
  strategy.fuse_all_reduce_ops = FLAGS_fuse_all_reduce_ops;
  KEEL_ENFORCE(FLAGS_hierarchical_allreduce_inter_nranks >= 0,
               "--hierarchical_allreduce_inter_nranks must be >= 0, got ",
               FLAGS_hierarchical_allreduce_inter_nranks);
  strategy.use_hierarchical_allreduce = FLAGS_hierarchical_allreduce_inter_nranks > 0;
  strategy.hierarchical_allreduce_inter_nranks = FLAGS_hierarchical_allreduce_inter_nranks;
  KEEL_ENFORCE(FLAGS_local_sgd_steps >= 0, "--local_sgd_steps must be >= 0, got ",
               FLAGS_local_sgd_steps);
  strategy.use_local_sgd = FLAGS_local_sgd_steps > 0;
  RefuseUnless(strategy.use_local_sgd, "local_sgd_warmup_steps",
               "LocalSGD (--local_sgd_steps > 0)");
  // LocalSGD all-reduces parameters, not gradients: fusion (on by default here) steps aside.
  if (strategy.use_local_sgd) strategy.fuse_all_reduce_ops = false;
  if (strategy.use_local_sgd) strategy.local_sgd_steps = FLAGS_local_sgd_steps;
  strategy.local_sgd_warmup_steps = FLAGS_local_sgd_warmup_steps;
  KEEL_ENFORCE(FLAGS_gradient_merge_k >= 1, "--gradient_merge_k must be >= 1, got ",
               FLAGS_gradient_merge_k);
  strategy.gradient_merge = FLAGS_gradient_merge_k > 1;
  if (strategy.gradient_merge) {
    strategy.gradient_merge_configs.k_steps = FLAGS_gradient_merge_k;
    // The merged gradients are all-reduced one by one: fusion (on by default here) steps aside,
    // and asking for it is refused by the strategy, naming both.
    if (!FlagIsSet("fuse_all_reduce_ops")) strategy.fuse_all_reduce_ops = false;
  }
  KEEL_ENFORCE(FLAGS_sharding_stage >= 0, "--sharding_stage must be 0 (off) or 1, got ",
               FLAGS_sharding_stage);
  strategy.sharding = FLAGS_sharding_stage > 0;
  if (strategy.sharding) {
    // The strategy refuses stages other than 1, naming sharding_configs.stage.
    strategy.sharding_configs.stage = FLAGS_sharding_stage;
    // Sharding fuses the gradients by owner itself: fusion (on by default here) steps aside, and
    // asking for it is refused by the strategy, naming both.
    if (!FlagIsSet("fuse_all_reduce_ops")) strategy.fuse_all_reduce_ops = false;
  }
  KEEL_ENFORCE(FLAGS_amp == "off" || FLAGS_amp == "bf16" || FLAGS_amp == "fp16",
               "--amp must be off, bf16 or fp16, got '", FLAGS_amp, "'");
  strategy.amp = FLAGS_amp != "off";
  RefuseUnless(strategy.amp, "amp_level", "mixed precision (--amp=bf16|fp16)");
  if (strategy.amp) {
    strategy.amp_configs.dtype = FLAGS_amp == "fp16" ? DType::kFloat16 : DType::kBFloat16;
    strategy.amp_configs.level = FLAGS_amp_level;
  }
  KEEL_ENFORCE(FLAGS_fp16_allreduce == "off" || FLAGS_fp16_allreduce == "fp16" ||
                   FLAGS_fp16_allreduce == "bf16",
               "--fp16_allreduce must be off, fp16 or bf16, got '", FLAGS_fp16_allreduce, "'");
  strategy.fp16_allreduce = FLAGS_fp16_allreduce != "off";
  if (FLAGS_fp16_allreduce == "bf16") strategy.fp16_allreduce_configs.dtype = DType::kBFloat16;
  strategy.recompute = FLAGS_recompute;
  KEEL_ENFORCE(FLAGS_tp_degree >= 1, "--tp_degree must be >= 1, got ", FLAGS_tp_degree);
  strategy.tensor_parallel = FLAGS_tp_degree > 1;
  if (strategy.tensor_parallel)
    strategy.tensor_parallel_configs.tensor_parallel_degree = FLAGS_tp_degree;
  strategy.sync_batch_norm = FLAGS_sync_batch_norm;
  strategy.fuse_gemm_epilogue = FLAGS_fuse_gemm_epilogue;
  KEEL_ENFORCE(FLAGS_pp_degree >= 1, "--pp_degree must be >= 1, got ", FLAGS_pp_degree);
  RefuseUnless(FLAGS_pp_degree > 1, "micro_batches", "pipelines (--pp_degree > 1)");
  RefuseUnless(FLAGS_pp_degree > 1, "pp_schedule", "pipelines (--pp_degree > 1)");
  KEEL_ENFORCE(FLAGS_pp_schedule == "1f1b" || FLAGS_pp_schedule == "fthenb",
               "--pp_schedule must be 1f1b or fthenb, got '", FLAGS_pp_schedule, "'");
  if (FLAGS_pp_degree > 1) {
    strategy.pipeline = true;
    strategy.pipeline_configs.pp_degree = FLAGS_pp_degree;
    strategy.pipeline_configs.accumulate_steps = FLAGS_micro_batches;
    strategy.pipeline_configs.schedule_mode = FLAGS_pp_schedule == "1f1b" ? "1F1B" : "F-then-B";
  }
  return strategy;
}

void ModelSettingsFromFlags(models::ModelConfig* cfg, bool parameter_server) {
  const std::string& model = cfg->name;
  const int tp = FLAGS_tp_degree;
  auto divides = [&](int value, const char* flag) {
    KEEL_ENFORCE(value % tp == 0, "--", flag, "=", value, " must divide by --tp_degree=", tp,
                 " (tensor parallelism splits it over the group)");
  };
  KEEL_ENFORCE(tp == 1 || model == "transformer" || model == "mlp" || model == "resnet",
               "--tp_degree=", tp, ": model ", model,
               " has no tensor-parallel variant (transformer, resnet and mlp have)");
  KEEL_ENFORCE(model != "resnet" || 16 % tp == 0, "--tp_degree=", tp,
               ": resnet's narrowest blocks have 16 channels, which must divide by it");
  if (model == "mlp" && tp > 1) divides(cfg->hidden, "mlp_hidden");
  KEEL_ENFORCE(FLAGS_pp_degree == 1 || model != "ctr", "--pp_degree=", FLAGS_pp_degree, ": model ",
               model, " places no pipeline stages (mlp, lenet, resnet and transformer do)");
  cfg->pp_degree = FLAGS_pp_degree;
  KEEL_ENFORCE(FLAGS_data_format == "NCHW" || FLAGS_data_format == "NHWC",
               "--data_format=", FLAGS_data_format, ": NCHW or NHWC");
  KEEL_ENFORCE(!FlagIsSet("data_format") || model == "resnet",
               "--data_format is a setting of the resnet model; model ", model,
               " has no such setting");
  cfg->data_format = FLAGS_data_format;
  const char* sizes[] = {"vocab", "seq_len", "d_model", "heads", "d_ff", "layers", "dropout"};
  KEEL_ENFORCE(!FlagIsSet("ctr_table") || model == "ctr",
               "--ctr_table is a setting of the ctr "
               "model; model ",
               model, " has no such setting");
  if (model == "ctr") {
    // Unset: the table lives on the servers in a parameter-server job that can hold it there.
    const std::string table = FlagIsSet("ctr_table")                       ? FLAGS_ctr_table
                              : parameter_server && FLAGS_ps_mode != "geo" ? "distributed"
                                                                           : "sparse";
    KEEL_ENFORCE(table == "sparse" || table == "dense" || table == "distributed",
                 "--ctr_table=", table, ": sparse, dense or distributed");
    cfg->ctr.is_sparse = table != "dense";
    cfg->ctr.is_distributed = table == "distributed";
  }
  if (model == "ctr" && FlagIsSet("vocab")) {  // the rows of the CTR model's table
    KEEL_ENFORCE(FLAGS_vocab >= 1, "--vocab=", FLAGS_vocab, " must be >= 1");
    cfg->ctr.vocab = FLAGS_vocab;
  }
  if (model != "transformer") {
    for (const char* f : sizes)
      if (model != "ctr" || std::string(f) != "vocab")
        KEEL_ENFORCE(!FlagIsSet(f), "--", f, " is a setting of the transformer model; model ",
                     model, " has no such setting");
    return;
  }
  models::TransformerConfig& c = cfg->transformer;
  const std::pair<const char*, int*> ints[] = {{"vocab", &c.vocab},     {"seq_len", &c.seq_len},
                                               {"d_model", &c.d_model}, {"heads", &c.heads},
                                               {"d_ff", &c.d_ff},       {"layers", &c.layers}};
  const int values[] = {FLAGS_vocab, FLAGS_seq_len, FLAGS_d_model,
                        FLAGS_heads, FLAGS_d_ff,    FLAGS_layers};
  for (size_t i = 0; i < 6; ++i) {
    KEEL_ENFORCE(values[i] >= 1, "--", ints[i].first, "=", values[i], " must be >= 1");
    *ints[i].second = values[i];
  }
  KEEL_ENFORCE(FLAGS_dropout >= 0 && FLAGS_dropout < 1, "--dropout=", FLAGS_dropout,
               " must be in [0, 1)");
  c.dropout = static_cast<float>(FLAGS_dropout);
  KEEL_ENFORCE(c.d_model % c.heads == 0, "--d_model=", c.d_model,
               " must divide by --heads=", c.heads);
  if (tp > 1) {
    divides(c.heads, "heads");
    divides(c.d_ff, "d_ff");
    divides(c.vocab, "vocab");
  }
  models::ValidateTransformerConfig(c, tp);  // the model's own checks, after the flags'
}

void PsStrategyFromFlags(const fleet::Role& role, fleet::DistributedStrategy* strategy) {
  if (!role.is_ps()) {
    for (const char* f : {"ps_mode", "geo_k", "ps_max_staleness"})
      KEEL_ENFORCE(!FlagIsSet(f), "--", f,
                   " is a setting of parameter-server training: run under keel launch "
                   "--server_num=S --worker_num=W");
    return;
  }
  KEEL_ENFORCE(FLAGS_ps_mode == "sync" || FLAGS_ps_mode == "async" || FLAGS_ps_mode == "geo",
               "--ps_mode='", FLAGS_ps_mode, "' is not one of sync, async, geo");
  KEEL_ENFORCE(FLAGS_ps_mode == "geo" || !FlagIsSet("geo_k"), "--geo_k goes with --ps_mode=geo");
  KEEL_ENFORCE(FLAGS_ps_mode == "async" || !FlagIsSet("ps_max_staleness"),
               "--ps_max_staleness goes with --ps_mode=async");
  KEEL_ENFORCE(FLAGS_ps_mode != "geo" || FLAGS_geo_k >= 1, "--ps_mode=geo needs --geo_k >= 1, got ",
               FLAGS_geo_k);
  // Collective settings have no place in a parameter-server job: refused by flag name (the
  // strategy would name its field).
  for (const char* f :
       {"nccl_comm_num", "fuse_all_reduce_ops", "hierarchical_allreduce_inter_nranks",
        "local_sgd_steps", "local_sgd_warmup_steps", "gradient_merge_k", "sharding_stage",
        "tp_degree", "pp_degree", "amp", "fp16_allreduce", "recompute", "sync_batch_norm",
        "clip_global_norm"})
    KEEL_ENFORCE(!FlagIsSet(f), "--", f,
                 " does not combine with parameter-server training (--ps_mode=", FLAGS_ps_mode,
                 ", keel launch --server_num)");
  // Trainers send gradients to servers: fusion (on by default for collectives) steps aside.
  strategy->fuse_all_reduce_ops = false;
  strategy->a_sync = FLAGS_ps_mode != "sync";
  strategy->a_sync_configs.k_steps = FLAGS_ps_mode == "geo" ? FLAGS_geo_k : 0;
  if (FLAGS_ps_mode == "async") strategy->a_sync_configs.max_staleness = FLAGS_ps_max_staleness;
}

std::unique_ptr<optimizer::Optimizer> OptimizerFromFlags(const std::string& default_name,
                                                         float default_lr, int64_t total_steps) {
  const std::string name = FLAGS_optimizer.empty() ? default_name : FLAGS_optimizer;
  KEEL_ENFORCE(FLAGS_lr >= 0, "--lr must be >= 0, got ", FLAGS_lr);
  const float base = FLAGS_lr > 0 ? static_cast<float>(FLAGS_lr) : default_lr;

  // The learning rate: a constant or a schedule, optionally warmed up.
  const std::string& sched = FLAGS_lr_schedule;
  RefuseUnless(sched == "piecewise", "lr_boundaries", "--lr_schedule=piecewise");
  RefuseUnless(sched == "piecewise", "lr_values", "--lr_schedule=piecewise");
  RefuseUnless(sched == "cosine", "lr_decay_steps", "--lr_schedule=cosine");
  RefuseUnless(sched == "cosine", "min_lr", "--lr_schedule=cosine");
  RefuseUnless(FLAGS_warmup_steps > 0, "warmup_start_lr", "a warm-up (--warmup_steps > 0)");
  LearningRate lr = base;
  if (sched == "piecewise") {
    KEEL_ENFORCE(!FLAGS_lr_values.empty(),
                 "--lr_schedule=piecewise needs --lr_values (and --lr_boundaries)");
    KEEL_ENFORCE(!FlagIsSet("lr"),
                 "--lr_schedule=piecewise takes its rates from --lr_values; drop --lr");
    lr = lr_schedule::Piecewise(ParseList<int>("lr_boundaries", FLAGS_lr_boundaries),
                                ParseList<float>("lr_values", FLAGS_lr_values));
  } else if (sched == "cosine") {
    // The schedule counts optimizer steps: with gradient merge, one per --gradient_merge_k.
    int64_t steps = FLAGS_lr_decay_steps > 0 ? FLAGS_lr_decay_steps
                                             : total_steps / std::max(1, FLAGS_gradient_merge_k);
    KEEL_ENFORCE(steps > 0,
                 "--lr_schedule=cosine needs --lr_decay_steps (the run's length is "
                 "not known before training with --epochs)");
    KEEL_ENFORCE(FLAGS_min_lr >= 0 && FLAGS_min_lr <= base, "--min_lr must be in [0, ", base,
                 "], got ", FLAGS_min_lr);
    lr = lr_schedule::Cosine(base, static_cast<int>(steps), static_cast<float>(FLAGS_min_lr));
  } else {
    KEEL_ENFORCE(sched == "constant", "--lr_schedule='", sched,
                 "' is not one of constant, piecewise, cosine");
  }
  KEEL_ENFORCE(FLAGS_warmup_steps >= 0, "--warmup_steps must be >= 0, got ", FLAGS_warmup_steps);
  if (FLAGS_warmup_steps > 0)
    lr = lr_schedule::LinearWarmup(lr, FLAGS_warmup_steps,
                                   static_cast<float>(FLAGS_warmup_start_lr));

  // The optimizer and its settings.
  RefuseUnless(name == "momentum", "momentum", "--optimizer=momentum");
  RefuseUnless(name == "momentum", "nesterov", "--optimizer=momentum");
  const bool adam = name == "adam" || name == "adamw";
  for (const char* f : {"beta1", "beta2", "epsilon"})
    RefuseUnless(adam, f, "--optimizer=adam|adamw");
  KEEL_ENFORCE(FLAGS_beta1 >= 0 && FLAGS_beta1 < 1, "--beta1 must be in [0, 1), got ", FLAGS_beta1);
  KEEL_ENFORCE(FLAGS_beta2 >= 0 && FLAGS_beta2 < 1, "--beta2 must be in [0, 1), got ", FLAGS_beta2);
  KEEL_ENFORCE(FLAGS_epsilon > 0, "--epsilon must be > 0, got ", FLAGS_epsilon);
  KEEL_ENFORCE(FLAGS_momentum >= 0 && FLAGS_momentum < 1, "--momentum must be in [0, 1), got ",
               FLAGS_momentum);
  KEEL_ENFORCE(!FlagIsSet("weight_decay") || FLAGS_weight_decay >= 0,
               "--weight_decay must be >= 0, got ", FLAGS_weight_decay);
  const float b1 = static_cast<float>(FLAGS_beta1), b2 = static_cast<float>(FLAGS_beta2),
              eps = static_cast<float>(FLAGS_epsilon);
  const bool wd_set = FlagIsSet("weight_decay");
  std::unique_ptr<optimizer::Optimizer> opt;
  if (name == "sgd") {
    opt = std::make_unique<optimizer::SGD>(lr);
  } else if (name == "momentum") {
    opt = std::make_unique<optimizer::Momentum>(lr, static_cast<float>(FLAGS_momentum),
                                                FLAGS_nesterov);
  } else if (name == "adam") {
    opt = std::make_unique<optimizer::Adam>(lr, b1, b2, eps);
  } else if (name == "adamw") {
    opt = std::make_unique<optimizer::AdamW>(
        lr, wd_set ? static_cast<float>(FLAGS_weight_decay) : 0.01f, b1, b2, eps);
  } else {
    KEEL_THROW("--optimizer='", name, "' is not one of sgd, momentum, adam, adamw");
  }
  if (name != "adamw" && wd_set) opt->set_weight_decay(static_cast<float>(FLAGS_weight_decay));
  KEEL_ENFORCE(FLAGS_clip_global_norm >= 0, "--clip_global_norm must be >= 0, got ",
               FLAGS_clip_global_norm);
  if (FLAGS_clip_global_norm > 0) opt->set_grad_clip({static_cast<float>(FLAGS_clip_global_norm)});
  return opt;
}

std::string DescribeOptimizer(const optimizer::Optimizer& opt) {
  std::ostringstream os;
  os << opt.type();
  if (opt.type() == "momentum")
    os << "(mu=" << FLAGS_momentum << (FLAGS_nesterov ? ", nesterov" : "") << ")";
  if (opt.type() == "adam" || opt.type() == "adamw")
    os << "(beta1=" << FLAGS_beta1 << ", beta2=" << FLAGS_beta2 << ", epsilon=" << FLAGS_epsilon
       << ")";
  lr_schedule::Schedule s = Copy(opt.lr());
  if (s.type == "constant") os << " lr=" << s.base_lr;
  if (s.type == "cosine")
    os << " lr=cosine(" << s.base_lr << " -> " << s.min_lr << " over " << s.total_steps
       << " steps)";
  if (s.type == "piecewise")
    os << " lr=piecewise(" << FLAGS_lr_values << " at " << FLAGS_lr_boundaries << ")";
  if (s.warmup_steps > 0)
    os << " warm-up " << s.warmup_steps << " steps from " << s.warmup_start_lr;
  if (opt.weight_decay() > 0) os << " l2_decay=" << opt.weight_decay();
  if (opt.type() == "adamw")
    os << " weight_decay=" << (FlagIsSet("weight_decay") ? FLAGS_weight_decay : 0.01);
  if (FLAGS_clip_global_norm > 0) os << " clip_global_norm=" << FLAGS_clip_global_norm;
  return os.str();
}

}  // namespace cli
}  // namespace keel
