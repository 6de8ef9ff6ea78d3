// Data-parallel equivalence: each of N ranks trains the MLP on its B/N rows of a global batch of B,
// through fleet's distributed optimizer; rank 0 saves the parameters to --out. Run without a
// launcher it is the 1-rank reference on all B rows. tests/fleet/data_parallel_test.cc compares.
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <random>

#include "fleet/fleet.h"

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
      strategy.fuse_all_reduce_ops = FLAGS_fuse;
      strategy.fuse_grad_size_in_num = FLAGS_fuse_num;
      strategy.use_local_sgd = FLAGS_local_sgd_steps > 0;
      if (strategy.use_local_sgd) strategy.local_sgd_steps = FLAGS_local_sgd_steps;
      strategy.local_sgd_warmup_steps = FLAGS_local_sgd_warmup;
      strategy.use_hierarchical_allreduce = FLAGS_hier > 0;
      strategy.hierarchical_allreduce_inter_nranks = FLAGS_hier;
      fleet::distributed_optimizer(optimizer::SGD(0.5f), strategy).minimize(loss, &startup);
    }
    Executor exe;
    exe.Run(startup);
    std::mt19937_64 rng(123);
    std::uniform_real_distribution<float> u(-1, 1);
    for (int step = 0; step < FLAGS_steps; ++step) {
      // The same global batch on every rank; each keeps its rows.
      std::vector<float> gx(FLAGS_global_batch * 8);
      std::vector<int64_t> gy(FLAGS_global_batch);
      for (auto& v : gx) v = u(rng);
      for (auto& v : gy) v = static_cast<int64_t>(rng() % 3);
      std::vector<float> lx(gx.begin() + rank * local * 8, gx.begin() + (rank + 1) * local * 8);
      std::vector<int64_t> ly(gy.begin() + rank * local, gy.begin() + (rank + 1) * local);
      exe.Run(fleet::main_program(),
              {{"x", Tensor::FromVector(lx, {local, 8})}, {"y", Tensor::FromVector(ly, {local, 1})}});
    }
    // A fingerprint of this rank's parameters, to compare ranks by.
    double sum = 0, weighted = 0;
    int64_t k = 0;
    for (VarDesc* v : fleet::main_program().global_block().AllVars()) {
      if (!v->is_parameter()) continue;
      const Tensor& t = exe.scope().FindVar(v->name())->tensor();
      for (int64_t i = 0; i < t.numel(); ++i, ++k) {
        sum += t.data<float>()[i];
        weighted += t.data<float>()[i] * static_cast<double>(k % 7 + 1);
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
