// keel train --model=NAME: trains a built-in model, printing step, loss and samples/s.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>

#include "executor/executor.h"
#include "fleet/fleet.h"
#include "fleet/pipeline_runner.h"
#include "fleet/transpile.h"
#include "framework/comm/store.h"
#include "framework/io/checkpoint.h"
#include "framework/profiler/profiler.h"
#include "models/model_zoo.h"
#include "python_free_cli/commands.h"
#include "python_free_cli/train_flags.h"
#include "trainer/trainer.h"

DEFINE_string(model, "mlp", "Built-in model: mlp, lenet, resnet, transformer or ctr.");
DEFINE_int32(steps, 100, "Training steps.");
DEFINE_int32(batch_size, 128, "Samples per step.");
DEFINE_string(data, "", "The model's dataset, e.g. mnist:DIR for lenet.");
DEFINE_int32(epochs, 0,
             "Train this many epochs, evaluating on the test split after each (models with a "
             "finite training set; synthetic ones count --steps as an epoch). 0: --steps only.");
DEFINE_uint64(seed, 0, "Seed of initialization and synthetic data; 0 means nondeterministic.");
DEFINE_string(save_dir, "",
              "Save a checkpoint here after training (and every --save_every steps): the "
              "persistables with the training state; checked for writability before step 0.");
DEFINE_string(
    save_inference_dir, "",
    "Save the inference model (pruned __model__ + params.safetensors) here after training.");
DEFINE_string(load_dir, "",
              "Resume from the checkpoint saved here: parameters, optimizer state, step, data "
              "position and random draws continue where it was saved.");
DEFINE_int32(save_every, 0,
             "Also save a checkpoint to --save_dir every this many steps (parameters, optimizer "
             "state, step, data position, RNG); with keel launch --max_restarts a restarted job "
             "resumes from the last one. 0: only after training.");
DEFINE_bool(auto_resume, false,
            "Resume from --save_dir's checkpoint when it holds one: for schedulers that restart or "
            "requeue a job (Kubernetes, Slurm). Restarts by keel launch --max_restarts always do.");
DEFINE_int32(fetch_frequency, 1, "Fetch and print the loss every this many steps.");
DEFINE_string(progress, "auto",
              "bar (redrawn in place) | lines (one per fetched step) | none | auto: a bar on a "
              "terminal, else lines.");
DEFINE_string(logdir, "",
              "Write TensorBoard event files here: loss, learning rate, samples/s, step time, "
              "eval accuracy.");
DEFINE_bool(logdir_all_ranks, false,
            "With --logdir: every worker writes its own DIR/rank_N (default: rank 0 writes DIR).");
DEFINE_int32(eval_every, 0,
             "Evaluate on the test data every this many steps (and at the end); 0: only after "
             "each epoch with --epochs.");
DEFINE_int32(num_iteration_per_drop_scope, 100,
             "ExecutionStrategy.num_iteration_per_drop_scope: release temporaries every this many "
             "steps.");
DEFINE_int32(num_threads, 0,
             "ExecutionStrategy.num_threads: workers running ready ops at once, sharing "
             "--cpu_math_threads cores with the kernels; 0: one per core the program can use.");
DEFINE_bool(cuda_graph, false,
            "ExecutionStrategy.use_cuda_graph (GPU workers): after two warm-up steps, capture the "
            "training step into a CUDA graph once and replay it; new feed shapes capture again.");
DEFINE_int32(mlp_hidden, 1280, "Width of the mlp model's hidden layers.");
DECLARE_bool(fuse_all_reduce_ops);  // train_flags.cc
DEFINE_bool(log_all_ranks, false, "Print training lines from every worker, not only rank 0.");
DEFINE_bool(log_sample_ids, false,
            "Debug: every worker prints the dataset indices of each training batch it draws "
            "('samples epoch E rank R: i j ...'; models with a finite training set).");

namespace keel {
namespace cli {

namespace {

// Given on the command line or as FLAGS_name in the environment.
bool Given(const char* name) {
  gflags::CommandLineFlagInfo info;
  return gflags::GetCommandLineFlagInfo(name, &info) && !info.is_default;
}

}  // namespace

ExecutionStrategy CliExecutionStrategy() {
  ExecutionStrategy s;
  s.num_threads = FLAGS_num_threads;
  s.num_iteration_per_drop_scope = FLAGS_num_iteration_per_drop_scope;
  s.use_cuda_graph = FLAGS_cuda_graph;
  ValidateExecutionStrategy(s, "keel train/bench: ");
  return s;
}

namespace {

// --pp_degree: this rank's stage runner (training steps and evaluation share it), made on first
// use from fleet's minimized program.
const fleet::PipelineRunOptions& StageRunOptions() {
  static const fleet::PipelineRunOptions o =
      fleet::PipelineRunOptionsFor(StrategyFromFlags(), fleet::role());
  return o;
}

fleet::PipelineRunner& StageRunner(Executor& exe) {
  static std::unique_ptr<fleet::PipelineRunner> runner;
  if (!runner)
    runner = std::make_unique<fleet::PipelineRunner>(exe, fleet::main_program(), StageRunOptions());
  return *runner;
}

}  // namespace

models::TrainableModel BuildDistributedModel(const std::string& name, float lr, uint64_t seed) {
  // One worker unless a launcher's environment says otherwise; a parameter-server job's when it
  // lists the servers (keel launch --server_num, Paddle's PADDLE_PSERVERS_IP_PORT_LIST).
  const char* servers = std::getenv("PADDLE_PSERVERS_IP_PORT_LIST");
  fleet::init(fleet::CloudRoleMaker(/*is_collective=*/servers == nullptr || *servers == '\0'));
  models::ModelConfig cfg;
  cfg.name = name;
  cfg.lr = lr;
  cfg.optimizer = FLAGS_optimizer;
  cfg.seed = seed;
  cfg.hidden = FLAGS_mlp_hidden;
  cfg.data = FLAGS_data;
  cfg.batch_size = FLAGS_batch_size;
  fleet::DistributedStrategy strategy = StrategyFromFlags();
  PsStrategyFromFlags(fleet::role(), &strategy);
  const bool ps = fleet::role().is_ps();
  // Parameter-server jobs train the mlp and the CTR model (docs/parameter-server.md).
  KEEL_ENFORCE(!ps || name == "mlp" || name == "ctr", "--model=", name,
               " in parameter-server training (--ps_mode) is not built: the mlp and ctr are");
  KEEL_ENFORCE(fleet::worker_num() % FLAGS_tp_degree == 0, "--tp_degree=", FLAGS_tp_degree,
               " does not divide the ", fleet::worker_num(),
               " workers (data parallelism fills workers / tp_degree)");
  KEEL_ENFORCE(
      FLAGS_pp_degree >= 1 && fleet::worker_num() % (FLAGS_tp_degree * FLAGS_pp_degree) == 0,
      "--pp_degree=", FLAGS_pp_degree, " does not divide the ", fleet::worker_num(),
      " workers (data parallelism fills workers / pp_degree)");
  // With tensor or pipeline parallelism the ranks of a group are one data-parallel replica: they
  // read the same data, and the replicas shard it.
  const int tp = FLAGS_tp_degree, pp = FLAGS_pp_degree;
  // (A parameter server reads no data.)
  const int replica = fleet::is_server() ? 0 : fleet::worker_index() / (tp * pp);
  cfg.rank = replica;
  cfg.nranks = fleet::worker_num() / (tp * pp);
  ModelSettingsFromFlags(&cfg, ps);
  // Checkpoints and inference models of pipelines and tensor-parallel groups are complete (rank 0
  // gathers the stages and shards, fleet/model_parallel_checkpoint.h).
  // Every replica draws its own synthetic data; initialization comes from rank 0 by broadcast.
  if (seed) cfg.data_seed = seed + 1000003ull * static_cast<uint64_t>(replica);
  // A finite training set is shuffled alike on every rank, each taking a disjoint shard; without
  // --seed the ranks agree on the largest of their random draws.
  cfg.shuffle_seed = seed;
  if (!seed && fleet::worker_num() > 1 && !fleet::is_server())
    cfg.shuffle_seed = static_cast<uint64_t>(
        fleet::metrics::max(static_cast<double>(std::random_device{}() & ((1u << 31) - 1)) + 1));
  if (FLAGS_log_sample_ids)
    cfg.on_train_batch = [](int64_t epoch, const std::vector<int64_t>& ids) {
      std::string line = "samples epoch " + std::to_string(epoch) + " rank " +
                         std::to_string(fleet::worker_index()) + ":";
      for (int64_t id : ids) line += " " + std::to_string(id);
      std::printf("%s\n", line.c_str());
    };
  // Evaluation: each rank its shard of the test data, the counts summed over the ranks.
  // (The ranks of a tensor-parallel group evaluate the same shard: each count is theirs / tp.)
  if (fleet::worker_num() > 1 && !fleet::is_server())
    cfg.all_reduce_sum = [tp](std::vector<double>* v) {
      Tensor t(DType::kFloat64, DDim({static_cast<int64_t>(v->size())}));
      std::copy(v->begin(), v->end(), t.data<double>());
      fleet::all_reduce(&t);
      std::transform(t.data<double>(), t.data<double>() + v->size(), v->begin(),
                     [tp](double x) { return x / tp; });
    };
  const int64_t total_steps = FLAGS_epochs > 0 ? 0 : FLAGS_steps;  // unknown with --epochs
  auto described = std::make_shared<std::string>();
  cfg.make_optimizer = [total_steps, described](const std::string& default_name, float default_lr) {
    auto opt = OptimizerFromFlags(default_name, default_lr, total_steps);
    *described = DescribeOptimizer(*opt);
    return opt;
  };
  strategy.exec_strategy = CliExecutionStrategy();
  // LocalSGD all-reduces parameters, not gradients: fusion (on by default here) steps aside, and
  // asking for it is refused.
  KEEL_ENFORCE(
      !strategy.use_local_sgd || !Given("fuse_all_reduce_ops") || !FLAGS_fuse_all_reduce_ops,
      "--fuse_all_reduce_ops does not combine with --local_sgd_steps: LocalSGD averages "
      "parameters and all-reduces no gradients");
  KEEL_ENFORCE(name == "mlp" || !Given("mlp_hidden"), "--mlp_hidden=", FLAGS_mlp_hidden,
               " is the width of the mlp model; model ", name, " has no such setting");
  if (fleet::worker_num() == 1) {
    std::string unused;
    for (const char* f : {"nccl_comm_num", "local_sgd_steps", "local_sgd_warmup_steps",
                          "hierarchical_allreduce_inter_nranks", "fuse_all_reduce_ops"})
      if (Given(f)) unused += std::string(unused.empty() ? "" : ", ") + "--" + f;
    if (!unused.empty())
      std::fprintf(stderr,
                   "warning: %s: multi-worker settings, with no effect on a single worker (run "
                   "under keel launch for several)\n",
                   unused.c_str());
  }
  // Periodic checkpoints must land where the ranks have just averaged: between two averages rank
  // 0's checkpoint holds its own parameters, from which a resume is refused.
  if (strategy.use_local_sgd && fleet::worker_num() > 1 && FLAGS_save_every > 0) {
    const int64_t k = strategy.local_sgd_steps, w = strategy.LocalSgdWarmupSteps();
    KEEL_ENFORCE(k <= 1 || (FLAGS_save_every % k == 0 && w % k == 0),
                 "--save_every=", FLAGS_save_every, " with --local_sgd_steps=", k,
                 " and a warm-up of ", w,
                 " steps: a checkpoint resumes exactly only where the ranks have just averaged "
                 "(during the warm-up, then every ",
                 k,
                 " steps); make --save_every and "
                 "--local_sgd_warmup_steps multiples of ",
                 k);
  }
  cfg.minimize = [strategy](Var loss, Program* startup, const optimizer::Optimizer& opt) {
    fleet::DistributedOptimizer(opt.Clone(), strategy).minimize(loss, startup);
  };
  // A pipeline evaluates stage by stage: the last computes the metric (and alone counts it).
  if (pp > 1)
    cfg.run_test = [](Executor& exe, const Program&, const FeedMap& feed,
                      const std::vector<std::string>& fetch) {
      fleet::PipelineRunner& runner = StageRunner(exe);
      const fleet::PipelineRunOptions& o = StageRunOptions();
      if (o.stage == o.stages - 1) return runner.Evaluate(feed, fetch);
      runner.Evaluate(feed, {});
      return std::vector<Tensor>();
    };
  TensorParallelGuard tp_group(fleet::tensor_parallel_config(strategy));
  models::TrainableModel m = models::BuildModel(cfg);
  m.optimizer = *described;
  return m;
}

void FinishProfile() { profiler::FinishFromFlags(); }

int RunParameterServer(const std::string& load_dir) {
  Executor exe(CPUPlace());
  fleet::run_server(exe, load_dir);
  LOG(INFO) << "server " << fleet::server_index() << ": every trainer stopped";
  return 0;
}

namespace {

// A training step of this rank's pipeline stage (docs/pipeline.md): the mini-batch as
// --micro_batches micro-batches. The loss lives on the last stage of each replica (on each rank
// of its tensor-parallel group, which all hold the same value): every rank gets the global batch's
// mean loss through an all-reduce of the last stages' tensor-parallel rank 0s (each fetching step,
// on every rank).
std::function<std::vector<Tensor>(Executor&, const FeedMap&, const std::vector<std::string>&)>
PipelineStep(const models::TrainableModel& m) {
  KEEL_ENFORCE(FLAGS_batch_size % FLAGS_micro_batches == 0, "--batch_size=", FLAGS_batch_size,
               " must divide by --micro_batches=", FLAGS_micro_batches);
  const fleet::PipelineRunOptions o = StageRunOptions();
  const int replicas = fleet::worker_num() / (FLAGS_tp_degree * FLAGS_pp_degree);
  const bool counts =
      fleet::TopologyFor(StrategyFromFlags(), fleet::role()).Coord(fleet::role().rank).tp == 0;
  const std::string loss = m.loss;
  return [=](Executor& exe, const FeedMap& feed, const std::vector<std::string>& fetch) {
    const bool last = o.stage == o.stages - 1;
    std::vector<std::string> mine;
    for (const std::string& f : fetch)
      if (f != loss || last) mine.push_back(f);
    std::vector<Tensor> got = StageRunner(exe).Step(feed, mine);
    std::vector<Tensor> out;
    size_t k = 0;
    for (const std::string& f : fetch) {
      if (f != loss) {
        out.push_back(got[k++]);
        continue;
      }
      double l = last ? got[k++].item<double>() : 0.0;
      l = fleet::metrics::sum(counts ? l : 0.0) / replicas;
      out.push_back(Tensor::FromVector(std::vector<float>{static_cast<float>(l)}, {1}));
    }
    return out;
  };
}

}  // namespace

TrainingStepFn TrainingStep(const models::TrainableModel& m) {
  if (FLAGS_pp_degree > 1) return PipelineStep(m);
  const Program* main = m.main.get();  // m outlives the step
  return [main](Executor& exe, const FeedMap& feed, const std::vector<std::string>& fetch) {
    return exe.Run(*main, feed, fetch);
  };
}

namespace {

// Where a parameter server resumes from: as the Trainer picks it on the trainers (a restart or
// --auto_resume: --save_dir's checkpoint when it holds one; else --load_dir). Parameter-server
// jobs run on one node (keel launch --server_num), so every process reads the same folder.
std::string ServerLoadDir() {
  if ((RestartGenerationFromEnvironment() > 0 || FLAGS_auto_resume) && !FLAGS_save_dir.empty() &&
      HasCheckpoint(FLAGS_save_dir))
    return FLAGS_save_dir;
  return FLAGS_load_dir;
}

// The Trainer's options from keel train's flags; its messages then name the flags ("--" and the
// field's name is the flag's).
TrainerOptions OptionsFromFlags() {
  TrainerOptions o;
  o.steps = FLAGS_epochs > 0 ? 0 : FLAGS_steps;  // with --epochs, the model's epochs
  o.epochs = FLAGS_epochs;
  o.fetch_frequency = FLAGS_fetch_frequency;
  o.progress = FLAGS_progress;
  o.log_all_ranks = FLAGS_log_all_ranks;
  o.logdir = FLAGS_logdir;
  o.logdir_all_ranks = FLAGS_logdir_all_ranks;
  o.eval_every = FLAGS_eval_every;
  o.save_dir = FLAGS_save_dir;
  o.save_every = FLAGS_save_every;
  o.auto_resume = FLAGS_auto_resume;
  o.load_dir = FLAGS_load_dir;
  o.save_inference_dir = FLAGS_save_inference_dir;
  o.seed = FLAGS_seed;
  o.exec_strategy = CliExecutionStrategy();
  // The built-in models stop only at their end: no collective per step to agree on a stop.
  o.stop_check_every = 0;
  o.option_prefix = "--";
  o.name = "keel train";
  return o;
}

}  // namespace

int Train(const std::vector<std::string>& args) {
  KEEL_ENFORCE(args.empty(), "train takes no positional arguments, got '", args[0], "'");
  KEEL_ENFORCE(FLAGS_steps >= 0, "--steps must be >= 0, got ", FLAGS_steps);
  KEEL_ENFORCE(FLAGS_batch_size > 0, "--batch_size must be positive, got ", FLAGS_batch_size);
  KEEL_ENFORCE(FLAGS_fetch_frequency > 0, "--fetch_frequency must be positive, got ",
               FLAGS_fetch_frequency);

  KEEL_ENFORCE(FLAGS_epochs >= 0, "--epochs must be >= 0, got ", FLAGS_epochs);
  Trainer trainer(OptionsFromFlags());
  // A run without --seed resuming a checkpoint builds its model with the checkpoint's seed.
  models::TrainableModel m =
      BuildDistributedModel(FLAGS_model, static_cast<float>(FLAGS_lr), trainer.seed());
  if (fleet::is_server()) return RunParameterServer(ServerLoadDir());
  const bool quiet = fleet::worker_index() != 0 && !FLAGS_log_all_ranks;

  KEEL_ENFORCE(FLAGS_epochs == 0 || m.batches_per_epoch == 0 || !Given("steps"),
               "--steps=", FLAGS_steps, " with --epochs=", FLAGS_epochs, ": model ", FLAGS_model,
               " has a finite training set, so an epoch is ", m.batches_per_epoch,
               " steps of --batch_size=", FLAGS_batch_size,
               " and --steps would be ignored; give "
               "one of them");
  KEEL_ENFORCE(FLAGS_eval_every >= 0, "--eval_every must be >= 0, got ", FLAGS_eval_every);
  KEEL_ENFORCE(FLAGS_eval_every == 0 || m.evaluate, "--eval_every: model ", FLAGS_model,
               " has no test data to evaluate on");
  // A distributed table's rows live on the servers: the test program fetches them as training does.
  if (m.test && fleet::role().is_ps()) fleet::ps_program_for_test(*m.main, m.test.get());
  TrainerModel model;
  if (FLAGS_pp_degree > 1) model.run_step = PipelineStep(m);
  model.main = m.main.get();
  model.startup = m.startup.get();
  model.test = m.test.get();
  model.loss = m.loss;
  model.learning_rate = m.learning_rate;
  const int64_t batch = FLAGS_batch_size;
  model.next_batch = [&m, batch](FeedMap* feed) { m.next_batch(batch, feed); };
  // With --epochs, a synthetic model's epoch is --steps steps.
  model.batches_per_epoch =
      m.batches_per_epoch > 0 ? m.batches_per_epoch : (FLAGS_epochs > 0 ? FLAGS_steps : 0);
  model.batch_size = batch;
  // Every rank evaluates its shard (the model sums the counts over the ranks).
  if (m.evaluate)
    model.evaluate = [&m](Executor& exe) {
      models::Evaluation e = m.evaluate(exe);
      EvalResult r;
      r.metrics = {{"accuracy", e.accuracy}};
      if (e.auc >= 0) r.metrics.push_back({"auc", e.auc});
      r.samples = e.samples;
      return r;
    };
  model.inference_feeds = m.inputs;
  model.inference_targets = {m.prediction};
  auto header = std::make_shared<LambdaCallback>();
  header->train_begin = [&m, quiet](Trainer&, const FitInfo& info) {
    if (!quiet)
      std::printf("model %s, optimizer %s, %d worker(s), %lld steps per epoch\n",
                  FLAGS_model.c_str(), m.optimizer.c_str(), info.world_size,
                  static_cast<long long>(info.steps_per_epoch));
  };
  trainer.add_callback(header);
  trainer.fit(model);
  // A parameter-server trainer tells the servers it is done (they stop once every trainer is).
  if (fleet::role().is_ps()) fleet::stop_worker();
  return 0;
}

}  // namespace cli
}  // namespace keel
