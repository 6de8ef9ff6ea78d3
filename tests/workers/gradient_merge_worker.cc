// Gradient merge under data parallelism: each of N ranks trains the MLP through fleet's
// distributed optimizer with DistributedStrategy::gradient_merge (k_steps = --k), taking, in run r
// of each accumulation, its 1/N share of rows [r * G / k, (r + 1) * G / k) of the step's global
// batch of G = --rows rows. Without --k (or under no launcher) it is the reference: one run per
// step on its share of all G rows. Prints a fingerprint of the parameters and, from the profile of
// the training runs, how many c_allreduce_sum ops ran; rank 0 saves to --out.
// tests/fleet/gradient_merge_dp_test.cc compares.
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <cstdio>
#include <memory>
#include <random>

#include "fleet/fleet.h"
#include "framework/profiler/profiler.h"

DEFINE_int32(k, 0, "gradient_merge_configs.k_steps (0: no gradient merge).");
DEFINE_int32(rows, 24, "Rows per optimizer step over all ranks and runs.");
DEFINE_int32(steps, 6, "Optimizer steps (each --k runs with gradient merge).");
DEFINE_int32(rings, 1, "nccl_comm_num.");
DEFINE_string(opt, "sgd", "sgd | momentum | adam.");
DEFINE_double(clip_norm, 0, "> 0: clip gradients by this global norm.");
DEFINE_bool(lr_decay, false, "A piecewise schedule: the rate / 5 from optimizer step 3 on.");
DEFINE_bool(amp, false, "Mixed precision, float16 with loss scaling (2^10, power of two).");
DEFINE_string(out, "", "Directory rank 0 saves the persistables to.");

using namespace keel;

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init();
    const int rank = fleet::worker_index(), n = fleet::worker_num();
    const int k = FLAGS_k > 0 ? FLAGS_k : 1;
    KEEL_ENFORCE(FLAGS_rows % (n * k) == 0, "--rows must divide by ranks x k = ", n * k);
    const int64_t local = FLAGS_rows / (n * k);  // rows per rank and run
    Program main, startup;
    startup.set_random_seed(11);
    {
      ProgramGuard g(main, startup);
      Var x = layers::data("x", {-1, 8});
      Var y = layers::data("y", {-1, 1}, DType::kInt64);
      Var h = layers::fc(x, 16, "tanh");
      h = layers::fc(h, 16, "relu");
      Var loss = layers::mean(layers::softmax_with_cross_entropy(layers::fc(h, 3), y));
      fleet::DistributedStrategy strategy;
      strategy.nccl_comm_num = FLAGS_rings;
      strategy.gradient_merge = FLAGS_k > 0;
      if (FLAGS_k > 0) strategy.gradient_merge_configs.k_steps = FLAGS_k;
      strategy.amp = FLAGS_amp;
      if (FLAGS_amp) {
        strategy.amp_configs.dtype = DType::kFloat16;
        strategy.amp_configs.init_loss_scaling = 1024.0f;
        // The products stay float32: float16 ones round differently on 4-row and 24-row
        // batches, and this worker compares the merge and the scaling decisions, not that.
        strategy.amp_configs.custom_black_list = {"mul"};
      }
      const float base = FLAGS_opt == "adam" ? 0.01f : 0.5f;
      LearningRate lr = base;
      if (FLAGS_lr_decay) lr = lr_schedule::Piecewise({3}, {base, base / 5});
      std::unique_ptr<optimizer::Optimizer> opt;
      if (FLAGS_opt == "momentum") {
        opt = std::make_unique<optimizer::Momentum>(lr, 0.9f);
      } else if (FLAGS_opt == "adam") {
        opt = std::make_unique<optimizer::Adam>(lr);
      } else {
        KEEL_ENFORCE(FLAGS_opt == "sgd", "--opt must be sgd, momentum or adam");
        opt = std::make_unique<optimizer::SGD>(lr);
      }
      if (FLAGS_clip_norm > 0) opt->set_grad_clip({static_cast<float>(FLAGS_clip_norm)});
      fleet::DistributedOptimizer(opt->Clone(), strategy).minimize(loss, &startup);
    }
    Executor exe(fleet::worker_place());
    exe.Run(startup);
    std::mt19937_64 rng(321);
    std::uniform_real_distribution<float> u(-1, 1);
    profiler::Start();
    int runs = 0;
    for (int step = 0; step < FLAGS_steps; ++step) {
      // The same global batch on every rank: k chunks, each split over the ranks.
      std::vector<float> gx(FLAGS_rows * 8);
      std::vector<int64_t> gy(FLAGS_rows);
      for (auto& v : gx) v = u(rng);
      for (auto& v : gy) v = static_cast<int64_t>(rng() % 3);
      for (int r = 0; r < k; ++r, ++runs) {
        const int64_t first = (r * n + rank) * local;
        std::vector<float> lx(gx.begin() + first * 8, gx.begin() + (first + local) * 8);
        std::vector<int64_t> ly(gy.begin() + first, gy.begin() + first + local);
        exe.Run(fleet::main_program(), {{"x", Tensor::FromVector(lx, {local, 8})},
                                        {"y", Tensor::FromVector(ly, {local, 1})}});
      }
    }
    profiler::Stop();
    int allreduces = 0;
    for (const profiler::Event& e : profiler::Events()) allreduces += e.name == "c_allreduce_sum";
    std::printf("rank %d allreduces %d runs %d\n", rank, allreduces, runs);
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
    if (!FLAGS_out.empty()) fleet::save_persistables(exe, FLAGS_out);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
