// keel train --model=NAME: trains a built-in model, printing step, loss and samples/s.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <chrono>
#include <cstdio>

#include "executor/executor.h"
#include "framework/io/io.h"
#include "models/model_zoo.h"
#include "python_free_cli/commands.h"

DEFINE_string(model, "mlp", "Built-in model to train (keel train) or time (keel bench).");
DEFINE_int32(steps, 100, "Training steps.");
DEFINE_int32(batch_size, 128, "Samples per step.");
DEFINE_double(lr, 0.01, "Learning rate.");
DEFINE_uint64(seed, 0, "Seed of initialization and synthetic data; 0 means nondeterministic.");
DEFINE_string(save_dir, "", "Save the persistables here after training.");
DEFINE_string(save_inference_dir, "",
              "Save the inference model (pruned __model__ + params.safetensors) here after training.");
DEFINE_string(load_dir, "", "Resume from the persistables saved here.");
DEFINE_int32(fetch_frequency, 1, "Fetch and print the loss every this many steps.");
DEFINE_int32(num_iteration_per_drop_scope, 100, "Release temporaries every this many steps.");

namespace keel {
namespace cli {

int Train(const std::vector<std::string>& args) {
  KEEL_ENFORCE(args.empty(), "train takes no positional arguments, got '", args[0], "'");
  KEEL_ENFORCE(FLAGS_steps >= 0, "--steps must be >= 0, got ", FLAGS_steps);
  KEEL_ENFORCE(FLAGS_batch_size > 0, "--batch_size must be positive, got ", FLAGS_batch_size);
  KEEL_ENFORCE(FLAGS_fetch_frequency > 0, "--fetch_frequency must be positive, got ",
               FLAGS_fetch_frequency);

  models::ModelConfig cfg;
  cfg.name = FLAGS_model;
  cfg.lr = static_cast<float>(FLAGS_lr);
  cfg.seed = FLAGS_seed;
  models::TrainableModel m = models::BuildModel(cfg);

  ExecutionStrategy strategy;
  strategy.fetch_frequency = FLAGS_fetch_frequency;
  strategy.num_iteration_per_drop_scope = FLAGS_num_iteration_per_drop_scope;
  Executor exe(CPUPlace(), strategy);
  exe.Run(*m.startup);
  if (!FLAGS_load_dir.empty()) {
    load_persistables(exe, FLAGS_load_dir, *m.main);
    std::printf("resumed from %s\n", FLAGS_load_dir.c_str());
  }

  FeedMap feed;
  auto last = std::chrono::steady_clock::now();
  int64_t samples_since = 0;
  for (int step = 0; step < FLAGS_steps; ++step) {
    m.next_batch(FLAGS_batch_size, &feed);
    auto out = exe.Run(*m.main, feed, {m.loss});
    samples_since += FLAGS_batch_size;
    if (!out.empty()) {
      auto now = std::chrono::steady_clock::now();
      double s = std::chrono::duration<double>(now - last).count();
      std::printf("step %d loss %.6f samples/s %.1f\n", step, out[0].item<float>(),
                  s > 0 ? samples_since / s : 0.0);
      std::fflush(stdout);
      last = now;
      samples_since = 0;
    }
  }
  if (!FLAGS_save_dir.empty()) {
    save_persistables(exe, FLAGS_save_dir, *m.main);
    std::printf("saved persistables to %s/%s\n", FLAGS_save_dir.c_str(), kPersistablesFile.c_str());
  }
  if (!FLAGS_save_inference_dir.empty()) {
    save_inference_model(FLAGS_save_inference_dir, m.inputs, {m.prediction}, exe, *m.main);
    std::printf("saved inference model to %s\n", FLAGS_save_inference_dir.c_str());
  }
  return 0;
}

}  // namespace cli
}  // namespace keel
