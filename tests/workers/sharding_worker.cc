// ZeRO-1 sharding against plain data parallelism: each of N ranks trains a 6-layer MLP (32 wide,
// every layer the same size, so that owners can be balanced exactly) with Adam through fleet's
// distributed optimizer, with DistributedStrategy::sharding when --sharding, on its 1/N share of
// each step's global batch of --rows rows (the same global batch whatever N). Prints a fingerprint
// of the parameters and the bytes of optimizer state its scope holds after startup; every rank
// calls fleet::save_persistables to --out (rank 0 writes). --load resumes from a checkpoint at
// step --first_step. Under no launcher it is one process. tests/fleet/sharding_test.cc compares.
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <cstdio>
#include <random>
#include <string>

#include "fleet/fleet.h"
#include "tests/workers/worker_util.h"

DEFINE_bool(sharding, false, "DistributedStrategy::sharding (ZeRO-1).");
DEFINE_int32(rows, 24, "Rows per step over all ranks.");
DEFINE_int32(steps, 5, "Steps to train.");
DEFINE_int32(first_step, 0, "The step the run starts at (with --load: the checkpoint's).");
DEFINE_string(load, "", "Directory to load persistables from after startup.");
DEFINE_string(out, "", "Directory rank 0 saves the persistables to.");
DEFINE_double(clip_norm, 0, "> 0: clip gradients by this global norm.");
DEFINE_double(loss_scale, 0,
              "> 0: mixed precision, float16, with dynamic loss scaling from this scale.");

using namespace keel;

namespace {
constexpr int kWidth = 32, kLayers = 6;
}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init();
    const int rank = fleet::worker_index(), n = fleet::worker_num();
    KEEL_ENFORCE(FLAGS_rows % n == 0, "--rows must divide by the ranks, ", n);
    const int64_t local = FLAGS_rows / n;
    Program main, startup;
    startup.set_random_seed(5);
    std::string found_inf, loss_scale;  // with --loss_scale
    {
      ProgramGuard g(main, startup);
      Var x = layers::data("x", {-1, kWidth});
      Var y = layers::data("y", {-1, 1}, DType::kInt64);
      Var h = x;
      for (int l = 0; l + 1 < kLayers; ++l) h = layers::fc(h, kWidth, "tanh");
      Var loss = layers::mean(layers::softmax_with_cross_entropy(layers::fc(h, kWidth), y));
      fleet::DistributedStrategy strategy;
      strategy.sharding = FLAGS_sharding;
      if (FLAGS_loss_scale > 0) {
        strategy.amp = true;
        strategy.amp_configs.dtype = DType::kFloat16;
        strategy.amp_configs.init_loss_scaling = static_cast<float>(FLAGS_loss_scale);
      }
      optimizer::Adam opt(0.01f);
      if (FLAGS_clip_norm > 0) opt.set_grad_clip({static_cast<float>(FLAGS_clip_norm)});
      fleet::DistributedOptimizer dist(opt.Clone(), strategy);
      dist.minimize(loss, &startup);
      if (auto amp = dist.amp_optimizer()) {
        found_inf = amp->found_inf_var();
        loss_scale = amp->loss_scaling_var();
      }
    }
    Executor exe(fleet::worker_place());
    exe.Run(startup);
    std::printf(
        "rank %d state_bytes %lld\n", rank,
        static_cast<long long>(testing::OptimizerStateBytes(exe.scope(), fleet::main_program())));
    if (!FLAGS_load.empty()) {
      fleet::load_persistables(exe, FLAGS_load);
      std::printf(
          "rank %d state_bytes_loaded %lld\n", rank,
          static_cast<long long>(testing::OptimizerStateBytes(exe.scope(), fleet::main_program())));
    }
    std::mt19937_64 rng(99);
    std::uniform_real_distribution<float> u(-1, 1);
    for (int step = 0; step < FLAGS_first_step + FLAGS_steps; ++step) {
      std::vector<float> gx(static_cast<size_t>(FLAGS_rows) * kWidth);
      std::vector<int64_t> gy(FLAGS_rows);
      for (auto& v : gx) v = u(rng);
      for (auto& v : gy) v = static_cast<int64_t>(rng() % kWidth);
      if (step < FLAGS_first_step) continue;  // the checkpoint's steps: the data stream only
      const int64_t first = rank * local;
      std::vector<float> lx(gx.begin() + first * kWidth, gx.begin() + (first + local) * kWidth);
      std::vector<int64_t> ly(gy.begin() + first, gy.begin() + first + local);
      FeedMap feed = {{"x", Tensor::FromVector(lx, {local, kWidth})},
                      {"y", Tensor::FromVector(ly, {local, 1})}};
      if (found_inf.empty()) {
        exe.Run(fleet::main_program(), feed);
      } else {
        const bool found = exe.Run(fleet::main_program(), feed, {found_inf})[0].data<bool>()[0];
        // Whether the step was skipped, and the loss scale after it.
        std::printf("rank %d step %d found_inf %d loss_scale %g\n", rank, step,
                    static_cast<int>(found),
                    exe.scope().FindVar(loss_scale)->tensor().data<float>()[0]);
      }
    }
    double sum = 0, weighted = 0;
    int64_t i = 0;
    for (VarDesc* v : fleet::main_program().global_block().AllVars()) {
      if (!v->is_parameter()) continue;
      const Tensor t = exe.scope().FindVar(v->name())->tensor().Clone(CPUPlace());
      for (int64_t j = 0; j < t.numel(); ++j, ++i) {
        sum += t.data<float>()[j];
        weighted += t.data<float>()[j] * static_cast<double>(i % 7 + 1);
      }
    }
    std::printf("rank %d params %.9g %.9g\n", rank, sum, weighted);
    std::printf(
        "rank %d state_bytes_after %lld\n", rank,
        static_cast<long long>(testing::OptimizerStateBytes(exe.scope(), fleet::main_program())));
    if (!FLAGS_out.empty()) fleet::save_persistables(exe, FLAGS_out);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
