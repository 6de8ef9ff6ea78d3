// Data-parallel equivalence: each of N ranks trains the MLP on its B/N rows of a global batch of B,
// through fleet's distributed optimizer (SGD, Momentum or Adam, with gradient clipping and a
// learning-rate schedule on demand); rank 0 saves the parameters to --out. Run without a launcher
// it is the 1-rank reference on all B rows. tests/fleet/data_parallel_test.cc compares.
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <thread>

#include "fleet/fleet.h"
#include "framework/comm/communicator.h"

DEFINE_int32(global_batch, 24, "Rows per step over all ranks.");
DEFINE_int32(steps, 20, "Training steps.");
DEFINE_int32(rings, 1, "nccl_comm_num.");
DEFINE_bool(fuse, false, "fuse_all_reduce_ops.");
DEFINE_int32(fuse_num, 8, "fuse_grad_size_in_num.");
DEFINE_int32(local_sgd_steps, 0, "use_local_sgd with these local_sgd_steps (0: off).");
DEFINE_int32(local_sgd_warmup, 0, "local_sgd_warmup_steps.");
DEFINE_int32(hier, 0, "use_hierarchical_allreduce with this many ranks per node (0: off).");
DEFINE_string(out, "", "Directory rank 0 saves the parameters to.");
DEFINE_int32(hidden, 16, "Hidden width.");
DEFINE_string(opt, "sgd", "sgd | momentum | adam.");
DEFINE_double(clip_norm, 0, "> 0: clip gradients by this global norm.");
DEFINE_bool(lr_decay, false, "A piecewise learning-rate schedule: the rate / 5 after 10 steps.");
DEFINE_double(fuse_mb, 0, "> 0: fuse_all_reduce_ops with groups of at most this many MB.");
DEFINE_int32(strategy_timeout_s, 0, "> 0: DistributedStrategy::comm_timeout_s.");
DEFINE_int32(stall_rank, -1, "This rank sleeps --stall_s seconds before its first step.");
DEFINE_int32(stall_s, 0, "How long --stall_rank sleeps.");
DEFINE_string(load_dir, "", "Resume from this checkpoint (fleet::load_persistables).");
DEFINE_bool(cuda_graph, false, "exec_strategy.use_cuda_graph (GPU workers).");
DEFINE_string(fp16_allreduce, "off", "off | fp16 | bf16: DistributedStrategy::fp16_allreduce.");
DEFINE_bool(amp_o1, false, "AMP O1 in bfloat16 (strategy.amp).");
DEFINE_bool(amp_o2, false, "AMP O2 in bfloat16 (strategy.amp, amp_configs.level=O2).");

using namespace keel;

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init();
    const int rank = fleet::worker_index(), n = fleet::worker_num();
    KEEL_ENFORCE(FLAGS_global_batch % n == 0, "--global_batch must divide by ", n, " ranks");
    const int64_t local = FLAGS_global_batch / n;
    Program main, startup;
    startup.set_random_seed(7);
    Var loss;
    {
      ProgramGuard g(main, startup);
      Var x = layers::data("x", {-1, 8});
      Var y = layers::data("y", {-1, 1}, DType::kInt64);
      Var h = layers::fc(x, FLAGS_hidden, "tanh");
      h = layers::fc(h, FLAGS_hidden, "relu");
      loss = layers::mean(layers::cross_entropy(layers::fc(h, 3, "softmax"), y));
      fleet::DistributedStrategy strategy;
      strategy.nccl_comm_num = FLAGS_rings;
      strategy.fuse_all_reduce_ops = FLAGS_fuse || FLAGS_fuse_mb > 0;
      if (strategy.fuse_all_reduce_ops) strategy.fuse_grad_size_in_num = FLAGS_fuse_num;
      if (FLAGS_fuse_mb > 0) strategy.fuse_grad_size_in_MB = FLAGS_fuse_mb;
      if (FLAGS_strategy_timeout_s > 0) strategy.comm_timeout_s = FLAGS_strategy_timeout_s;
      strategy.use_local_sgd = FLAGS_local_sgd_steps > 0;
      if (strategy.use_local_sgd) strategy.local_sgd_steps = FLAGS_local_sgd_steps;
      strategy.local_sgd_warmup_steps = FLAGS_local_sgd_warmup;
      strategy.use_hierarchical_allreduce = FLAGS_hier > 0;
      strategy.hierarchical_allreduce_inter_nranks = FLAGS_hier;
      strategy.exec_strategy.use_cuda_graph = FLAGS_cuda_graph;
      strategy.fp16_allreduce = FLAGS_fp16_allreduce != "off";
      if (FLAGS_fp16_allreduce == "bf16") strategy.fp16_allreduce_configs.dtype = DType::kBFloat16;
      strategy.amp = FLAGS_amp_o1 || FLAGS_amp_o2;
      if (FLAGS_amp_o2) strategy.amp_configs.level = "O2";
      // Adam's step is about lr whatever the gradient's size: it gets a smaller rate.
      const float base = FLAGS_opt == "adam" ? 0.01f : 0.5f;
      LearningRate lr = base;
      if (FLAGS_lr_decay) lr = lr_schedule::Piecewise({10}, {base, base / 5});
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
    Executor exe(fleet::worker_place());  // CUDAPlace under --selected_gpus
    exe.Run(startup);
    if (!FLAGS_load_dir.empty()) {
      fleet::load_persistables(exe, FLAGS_load_dir);
      // LocalSGD's snapshots must be the loaded parameters: the largest difference.
      double gap = 0;
      for (VarDesc* v : fleet::main_program().global_block().AllVars()) {
        const Variable* snap = exe.scope().FindVar(v->name() + "@LOCAL_SGD_SNAPSHOT");
        if (!v->is_parameter() || snap == nullptr) continue;
        const Tensor p = exe.scope().FindVar(v->name())->tensor().Clone(CPUPlace());
        const Tensor s = snap->tensor().Clone(CPUPlace());
        for (int64_t i = 0; i < p.numel(); ++i)
          gap = std::max<double>(gap, std::abs(p.data<float>()[i] - s.data<float>()[i]));
      }
      std::printf("rank %d snapshot_gap %g\n", rank, gap);
    }
    std::mt19937_64 rng(123);
    std::uniform_real_distribution<float> u(-1, 1);
    if (rank == FLAGS_stall_rank) std::this_thread::sleep_for(std::chrono::seconds(FLAGS_stall_s));
    for (int step = 0; step < FLAGS_steps; ++step) {
      // The same global batch on every rank; each keeps its rows.
      std::vector<float> gx(FLAGS_global_batch * 8);
      std::vector<int64_t> gy(FLAGS_global_batch);
      for (auto& v : gx) v = u(rng);
      for (auto& v : gy) v = static_cast<int64_t>(rng() % 3);
      std::vector<float> lx(gx.begin() + rank * local * 8, gx.begin() + (rank + 1) * local * 8);
      std::vector<int64_t> ly(gy.begin() + rank * local, gy.begin() + (rank + 1) * local);
      exe.Run(fleet::main_program(), {{"x", Tensor::FromVector(lx, {local, 8})},
                                      {"y", Tensor::FromVector(ly, {local, 1})}});
    }
    // A fingerprint of this rank's parameters, to compare ranks by.
    double sum = 0, weighted = 0;
    int64_t k = 0;
    for (VarDesc* v : fleet::main_program().global_block().AllVars()) {
      // The float32 parameters, and AMP O2's float32 masters of the 16-bit ones.
      const bool master =
          v->name().size() > 7 && v->name().compare(v->name().size() - 7, 7, ".master") == 0;
      if (!(v->is_parameter() && v->dtype() == DType::kFloat32) && !master) continue;
      const Tensor t = exe.scope().FindVar(v->name())->tensor().Clone(CPUPlace());
      for (int64_t i = 0; i < t.numel(); ++i, ++k) {
        sum += t.data<float>()[i];
        weighted += t.data<float>()[i] * static_cast<double>(k % 7 + 1);
      }
    }
    std::printf("rank %d params %.9g %.9g\n", rank, sum, weighted);
    int groups = 0, casts = 0;
    for (const auto& op : fleet::main_program().global_block().ops()) {
      groups += op->type() == "coalesce_tensor";
      casts += op->type() == "cast";
    }
    std::printf("rank %d fused_groups %d\n", rank, groups);
    std::printf("rank %d casts %d\n", rank, casts);
    int64_t zero_copy = 0;
    for (int ring = 0; ring < FLAGS_rings; ++ring)
      if (RingRegistry::Get().Has(ring))
        zero_copy += RingRegistry::Get().At(ring, "mlp_dp_worker").zero_copy_collectives();
    std::printf("rank %d zero_copy_allreduces %lld\n", rank, static_cast<long long>(zero_copy));
    std::printf("rank %d allreduce_bytes %lld\n", rank,
                static_cast<long long>(RingRegistry::Get().TotalAllReduceBytes()));
    if (!FLAGS_out.empty()) fleet::save_persistables(exe, FLAGS_out);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
