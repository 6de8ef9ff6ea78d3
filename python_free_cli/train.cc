// keel train --model=NAME: trains a built-in model, printing step, loss and samples/s.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "executor/executor.h"
#include "fleet/fleet.h"
#include "framework/profiler/profiler.h"
#include "framework/io/io.h"
#include "models/model_zoo.h"
#include "python_free_cli/commands.h"

DEFINE_string(model, "mlp", "Built-in model to train (keel train) or time (keel bench).");
DEFINE_int32(steps, 100, "Training steps.");
DEFINE_int32(batch_size, 128, "Samples per step.");
DEFINE_double(lr, 0, "Learning rate; 0: the model's default.");
DEFINE_string(optimizer, "", "sgd | momentum | adam | adamw; empty: the model's default.");
DEFINE_string(data, "", "The model's dataset, e.g. mnist:DIR for lenet.");
DEFINE_int32(epochs, 0,
             "Train this many epochs, evaluating on the test split after each (models with a "
             "finite training set; synthetic ones count --steps as an epoch). 0: --steps only.");
DEFINE_uint64(seed, 0, "Seed of initialization and synthetic data; 0 means nondeterministic.");
DEFINE_string(save_dir, "", "Save the persistables here after training.");
DEFINE_string(save_inference_dir, "",
              "Save the inference model (pruned __model__ + params.safetensors) here after training.");
DEFINE_string(load_dir, "", "Resume from the persistables saved here.");
DEFINE_int32(fetch_frequency, 1, "Fetch and print the loss every this many steps.");
DEFINE_int32(num_iteration_per_drop_scope, 100, "Release temporaries every this many steps.");
DEFINE_int32(mlp_hidden, 1280, "Width of the mlp model's hidden layers.");
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
DEFINE_bool(log_all_ranks, false, "Print training lines from every worker, not only rank 0.");
DEFINE_bool(log_sample_ids, false,
            "Debug: every worker prints the dataset indices of each training batch it draws "
            "('samples epoch E rank R: i j ...'; models with a finite training set).");

namespace keel {
namespace cli {

models::TrainableModel BuildDistributedModel(const std::string& name, float lr, uint64_t seed) {
  fleet::init();  // one worker unless a launcher's environment says otherwise
  models::ModelConfig cfg;
  cfg.name = name;
  cfg.lr = lr;
  cfg.optimizer = FLAGS_optimizer;
  cfg.seed = seed;
  cfg.hidden = FLAGS_mlp_hidden;
  cfg.data = FLAGS_data;
  cfg.batch_size = FLAGS_batch_size;
  cfg.rank = fleet::worker_index();
  cfg.nranks = fleet::worker_num();
  // Every rank draws its own synthetic data; initialization comes from rank 0 by broadcast.
  if (seed) cfg.data_seed = seed + 1000003ull * static_cast<uint64_t>(fleet::worker_index());
  // A finite training set is shuffled alike on every rank, each taking a disjoint shard; without
  // --seed the ranks agree on the largest of their random draws.
  cfg.shuffle_seed = seed;
  if (!seed && fleet::worker_num() > 1)
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
  if (fleet::worker_num() > 1)
    cfg.all_reduce_sum = [](std::vector<double>* v) {
      Tensor t(DType::kFloat64, DDim({static_cast<int64_t>(v->size())}));
      std::copy(v->begin(), v->end(), t.data<double>());
      fleet::all_reduce(&t);
      std::copy(t.data<double>(), t.data<double>() + v->size(), v->begin());
    };
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
  // LocalSGD all-reduces parameters, not gradients: fusion (on by default here) steps aside.
  if (strategy.use_local_sgd) strategy.fuse_all_reduce_ops = false;
  if (strategy.use_local_sgd) strategy.local_sgd_steps = FLAGS_local_sgd_steps;
  strategy.local_sgd_warmup_steps = FLAGS_local_sgd_warmup_steps;
  cfg.minimize = [strategy](Var loss, Program* startup, const optimizer::Optimizer& opt) {
    fleet::DistributedOptimizer(opt.Clone(), strategy).minimize(loss, startup);
  };
  return models::BuildModel(cfg);
}

void FinishProfile() {
  if (!profiler::Enabled()) return;
  profiler::Stop();
  std::string path = profiler::ProfilePathForRank(fleet::worker_index(), fleet::worker_num());
  if (path.empty()) return;
  profiler::WriteChromeTrace(path, fleet::worker_index());
  std::fprintf(stderr, "profile of rank %d: %s\n%s", fleet::worker_index(), path.c_str(),
               profiler::Summary().c_str());
}

int Train(const std::vector<std::string>& args) {
  KEEL_ENFORCE(args.empty(), "train takes no positional arguments, got '", args[0], "'");
  KEEL_ENFORCE(FLAGS_steps >= 0, "--steps must be >= 0, got ", FLAGS_steps);
  KEEL_ENFORCE(FLAGS_batch_size > 0, "--batch_size must be positive, got ", FLAGS_batch_size);
  KEEL_ENFORCE(FLAGS_fetch_frequency > 0, "--fetch_frequency must be positive, got ",
               FLAGS_fetch_frequency);

  KEEL_ENFORCE(FLAGS_epochs >= 0, "--epochs must be >= 0, got ", FLAGS_epochs);
  models::TrainableModel m = BuildDistributedModel(FLAGS_model, static_cast<float>(FLAGS_lr),
                                                   FLAGS_seed);
  const bool quiet = fleet::worker_index() != 0 && !FLAGS_log_all_ranks;

  ExecutionStrategy strategy;
  strategy.fetch_frequency = FLAGS_fetch_frequency;
  strategy.num_iteration_per_drop_scope = FLAGS_num_iteration_per_drop_scope;
  Executor exe(fleet::worker_place(), strategy);
  exe.Run(*m.startup);
  if (!FLAGS_load_dir.empty()) {
    load_persistables(exe, FLAGS_load_dir, *m.main);
    if (!quiet) std::printf("resumed from %s\n", FLAGS_load_dir.c_str());
  }

  const int epochs = std::max(1, FLAGS_epochs);
  const int64_t steps_per_epoch = FLAGS_epochs > 0 && m.batches_per_epoch > 0
                                      ? m.batches_per_epoch
                                      : static_cast<int64_t>(FLAGS_steps);
  if (!quiet)
    std::printf("model %s, optimizer %s, %d worker(s), %lld steps per epoch\n",
                FLAGS_model.c_str(), m.optimizer.c_str(), fleet::worker_num(),
                static_cast<long long>(steps_per_epoch));
  FeedMap feed;
  profiler::StartFromFlags();
  auto last = std::chrono::steady_clock::now();
  int64_t samples_since = 0, step = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (int64_t i = 0; i < steps_per_epoch; ++i, ++step) {
      m.next_batch(FLAGS_batch_size, &feed);
      auto out = exe.Run(*m.main, feed, {m.loss});
      samples_since += static_cast<int64_t>(FLAGS_batch_size) * fleet::worker_num();  // all workers
      if (!out.empty() && !quiet) {
        auto now = std::chrono::steady_clock::now();
        double s = std::chrono::duration<double>(now - last).count();
        std::printf("step %lld loss %.6f samples/s %.1f\n", static_cast<long long>(step),
                    out[0].item<float>(), s > 0 ? samples_since / s : 0.0);
        std::fflush(stdout);
        last = now;
        samples_since = 0;
      }
    }
    if (FLAGS_epochs > 0 && m.evaluate) {
      models::Evaluation e = m.evaluate(exe);  // on every rank: a collective
      if (!quiet)
        std::printf("epoch %d test_accuracy %.4f (%lld test samples)\n", epoch, e.accuracy,
                    static_cast<long long>(e.samples));
      std::fflush(stdout);
    }
  }
  FinishProfile();
  if (!FLAGS_save_dir.empty()) {
    fleet::save_persistables(exe, FLAGS_save_dir, m.main.get());
    if (!quiet)
      std::printf("saved persistables to %s/%s\n", FLAGS_save_dir.c_str(), kPersistablesFile.c_str());
  }
  if (!FLAGS_save_inference_dir.empty()) {
    fleet::save_inference_model(exe, FLAGS_save_inference_dir, m.inputs, {m.prediction},
                                m.main.get());
    if (!quiet) std::printf("saved inference model to %s\n", FLAGS_save_inference_dir.c_str());
  }
  return 0;
}

}  // namespace cli
}  // namespace keel
