// The seed's program as a user writes it outside keel's tree (examples/CMakeLists.txt builds it
// with find_package(Keel)): a 3-layer MLP on synthetic data, made data-parallel by the four fleet
// lines, logging its loss to TensorBoard with --logdir. It runs alone or under
//   keel launch --nproc_per_node=2 ./fit_mlp
// and exits 1 when the loss did not fall.
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <cstdio>
#include <random>

DEFINE_int32(steps, 60, "Training steps.");
DEFINE_int32(batch_size, 64, "Samples per step and worker.");
DEFINE_string(logdir, "", "Write TensorBoard event files here (rank 0).");
DEFINE_string(save_dir, "", "Save the trained parameters here.");

using namespace keel;

Var mlp(Var x, Var y, int hid = 128, int classes = 2) {
  Var h1 = layers::fc(x, hid, "tanh");
  Var h2 = layers::fc(h1, hid, "tanh");
  Var pred = layers::fc(h2, classes, "softmax");
  return layers::mean(layers::cross_entropy(pred, y));
}

// x uniform in [0, 1)^32; y = 1 when the first half of x outweighs the second.
void NextBatch(std::mt19937_64& rng, int64_t batch, Tensor* x, Tensor* y) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  float* xs = static_cast<float*>(x->Alloc(DType::kFloat32, {batch, 32}));
  int64_t* ys = static_cast<int64_t*>(y->Alloc(DType::kInt64, {batch, 1}));
  for (int64_t n = 0; n < batch; ++n) {
    float first = 0, second = 0;
    for (int i = 0; i < 32; ++i) (i < 16 ? first : second) += xs[n * 32 + i] = u(rng);
    ys[n] = first > second ? 1 : 0;
  }
}

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    Program main_program, startup_program;
    main_program.set_random_seed(1);
    startup_program.set_random_seed(1);
    ProgramGuard guard(main_program, startup_program);
    Var x = layers::data("x", {-1, 32}, DType::kFloat32);
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    Var cost = mlp(x, y);

    fleet::init(fleet::CloudRoleMaker(/*is_collective=*/true));  // role from the environment
    fleet::DistributedStrategy strategy;
    auto opt = fleet::distributed_optimizer(optimizer::Momentum(0.1f, 0.9f), strategy);
    opt.minimize(cost, &startup_program);

    Executor exe(fleet::worker_place());
    exe.Run(startup_program);
    std::unique_ptr<SummaryWriter> tb;
    if (!FLAGS_logdir.empty() && fleet::is_first_worker())
      tb = std::make_unique<SummaryWriter>(FLAGS_logdir);
    std::mt19937_64 rng(7 + fleet::worker_index());  // each worker its own data
    Tensor bx, by;
    float first = 0, last = 0;
    for (int step = 0; step < FLAGS_steps; ++step) {
      NextBatch(rng, FLAGS_batch_size, &bx, &by);
      auto out = exe.Run(fleet::main_program(), {{"x", bx}, {"y", by}}, {cost});
      last = out[0].item<float>();
      if (step == 0) first = last;
      if (tb) tb->AddScalar("train/loss", last, step);
      if (fleet::is_first_worker() && step % 10 == 0)
        std::printf("step %d loss %.4f\n", step, last);
    }
    if (fleet::is_first_worker()) std::printf("loss %.4f -> %.4f\n", first, last);
    if (!FLAGS_save_dir.empty()) fleet::save_persistables(exe, FLAGS_save_dir);
    return last < first ? 0 : 1;
  } catch (const keel::Error& e) {
    std::fprintf(stderr, "fit_mlp: %s\n", e.what());
    return 1;
  }
}
