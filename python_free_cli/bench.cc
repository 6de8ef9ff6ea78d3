// keel bench NAME: times a built-in model's training step; prints one JSON line.
// Timed steps fetch nothing (as a training loop between log lines), so the loop measures compute.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "executor/executor.h"
#include "fleet/fleet.h"
#include "framework/runtime/blas.h"
#include "models/model_zoo.h"
#include "python_free_cli/commands.h"

DECLARE_int32(batch_size);
DECLARE_double(lr);
DECLARE_int32(cpu_math_threads);
DEFINE_int32(bench_steps, 200, "Timed steps for keel bench.");
DEFINE_int32(bench_warmup, 10, "Untimed warm-up steps for keel bench.");

namespace keel {
namespace cli {

int Bench(const std::vector<std::string>& args) {
  KEEL_ENFORCE(args.size() == 1, "bench takes one model name (", [] {
    std::string s;
    for (auto& n : models::ModelNames()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }(), "), got ", args.size(), " arguments");
  KEEL_ENFORCE(FLAGS_bench_steps > 0, "--bench_steps must be positive");
  models::TrainableModel m = BuildDistributedModel(args[0], static_cast<float>(FLAGS_lr), 1);
  const int world = fleet::worker_num();
  Executor exe(fleet::worker_place());
  exe.Run(*m.startup);
  FeedMap feed;
  m.next_batch(FLAGS_batch_size, &feed);  // one batch, reused, as the torch anchor does
  for (int i = 0; i < FLAGS_bench_warmup; ++i) exe.Run(*m.main, feed);
  fleet::barrier_worker();
  std::vector<double> ms;
  ms.reserve(FLAGS_bench_steps);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < FLAGS_bench_steps; ++i) {
    auto a = std::chrono::steady_clock::now();
    exe.Run(*m.main, feed);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fleet::barrier_worker();
  float loss = exe.Run(*m.main, feed, {m.loss})[0].item<float>();
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double median = sorted[sorted.size() / 2];
  double mean = total * 1e3 / FLAGS_bench_steps;
  if (fleet::worker_index() != 0) return 0;
  std::printf(
      "{\"system\": \"keel\", \"model\": \"%s\", \"world\": %d, \"threads\": %d, "
      "\"blas\": \"%s\", \"batch\": %d, \"steps\": %d, \"step_ms\": %.3f, "
      "\"step_ms_mean\": %.3f, \"samples_per_s\": %.1f, \"loss\": %.5f}\n",
      args[0].c_str(), world, FLAGS_cpu_math_threads, blas::Backend(), FLAGS_batch_size,
      FLAGS_bench_steps, median, mean, world * FLAGS_batch_size / (median / 1e3), loss);
  return 0;
}

}  // namespace cli
}  // namespace keel
