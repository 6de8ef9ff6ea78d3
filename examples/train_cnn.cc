// A model of your own trained with keel::Trainer (docs/trainer.md): a small CNN that tells four
// kinds of shapes apart in 12x12 images (a horizontal bar, a vertical bar, a diagonal, a square),
// on a synthetic data set held in memory (TensorDataset). The Trainer brings the loop: progress
// with ETA, evaluation after each epoch with the metrics of all workers together, checkpoints,
// resuming, TensorBoard and a callback. It runs alone or under
//   keel launch --nproc_per_node=2 ./train_cnn --save_dir=ckpt --save_every=10
// and, killed and restarted (keel launch --max_restarts=1), or run again with --auto_resume,
// continues from its last checkpoint with the parameters of an uninterrupted run. It exits 1
// when a run to the end did not learn the shapes.
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <cstdio>
#include <random>

DEFINE_int32(epochs, 4, "Passes over the training images.");
DEFINE_int32(batch_size, 32, "Images per step and worker.");
DEFINE_double(lr, 0.05, "Learning rate (momentum 0.9).");
DEFINE_uint64(seed, 1, "Seed of the data, its order, the initialization and dropout.");
DEFINE_string(save_dir, "", "Checkpoints go here (and a run resumes from here).");
DEFINE_int32(save_every, 0, "Also save a checkpoint every this many steps.");
DEFINE_bool(auto_resume, false, "Resume from --save_dir's checkpoint when there is one.");
DEFINE_string(logdir, "", "TensorBoard event files go here.");
DEFINE_int32(eval_every, 0, "Also evaluate every this many steps.");
DEFINE_int32(stop_at_step, -1, "Stop after this step (a callback does it); -1: train to the end.");

using namespace keel;

namespace {

constexpr int kSide = 12, kClasses = 4;

// `n` images [n, 1, 12, 12] and labels [n, 1]: each image one shape at a random place, plus
// noise.
TensorDataset MakeShapes(int64_t n, std::mt19937_64& rng) {
  Tensor images(DType::kFloat32, {n, 1, kSide, kSide}), labels(DType::kInt64, {n, 1});
  std::uniform_int_distribution<int> where(0, kSide - 5);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  for (int64_t i = 0; i < n; ++i) {
    float* x = images.data<float>() + i * kSide * kSide;
    const int cls = static_cast<int>(rng() % kClasses), r = where(rng), c = where(rng);
    for (int p = 0; p < kSide * kSide; ++p) x[p] = noise(rng);
    for (int k = 0; k < 5; ++k) {
      if (cls == 0) x[r * kSide + c + k] += 1;        // horizontal bar
      if (cls == 1) x[(r + k) * kSide + c] += 1;      // vertical bar
      if (cls == 2) x[(r + k) * kSide + c + k] += 1;  // diagonal
      if (cls == 3 && k < 3)                          // 3x3 square
        for (int j = 0; j < 3; ++j) x[(r + k) * kSide + c + j] += 1;
    }
    labels.data<int64_t>()[i] = cls;
  }
  return TensorDataset({"image", "label"}, {images, labels});
}

struct Cnn {
  Var loss, accuracy;
};

// conv 3x3 (8) -> max pool -> conv 3x3 (16) -> max pool -> fc 32 -> dropout -> fc 4.
Cnn SmallCnn(Var image, Var label) {
  Var h = layers::conv2d(image, 8, 3, 1, 1, 1, 1, "relu");  // [N, 8, 12, 12]
  h = layers::pool2d(h, 2, "max", 2);                       // [N, 8, 6, 6]
  h = layers::conv2d(h, 16, 3, 1, 1, 1, 1, "relu");         // [N, 16, 6, 6]
  h = layers::pool2d(h, 2, "max", 2);                       // [N, 16, 3, 3]
  h = layers::dropout(layers::fc(h, 32, "relu"), 0.1f);
  Var logits = layers::fc(h, kClasses);
  Var loss = layers::mean(layers::softmax_with_cross_entropy(logits, label));
  return {loss, layers::accuracy(layers::softmax(logits), label)};
}

// Stops training after a given step: what a callback can do (here to interrupt a run on purpose;
// early stopping on an evaluation metric works the same from on_eval_end).
class StopAtStep : public Callback {
 public:
  explicit StopAtStep(int64_t step) : step_(step) {}
  void on_step_end(Trainer& trainer, const StepInfo& s) override {
    if (s.step == step_) trainer.stop();
  }
  void on_save(Trainer&, const SaveInfo& save) override {
    if (save.final && fleet::is_first_worker())
      std::printf("final checkpoint at step %lld\n", static_cast<long long>(save.step));
  }

 private:
  int64_t step_;
};

}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init(fleet::CloudRoleMaker(/*is_collective=*/true));  // role from the environment

    TrainerOptions opts;
    opts.epochs = FLAGS_epochs;
    opts.seed = FLAGS_seed;
    opts.save_dir = FLAGS_save_dir;
    opts.save_every = FLAGS_save_every;
    opts.auto_resume = FLAGS_auto_resume;
    opts.logdir = FLAGS_logdir;
    opts.eval_every = FLAGS_eval_every;
    opts.fetch_frequency = 5;
    opts.option_prefix = "--";  // the flags above have the options' names
    Trainer trainer(opts);

    Program main_program, startup_program;
    main_program.set_random_seed(static_cast<int64_t>(FLAGS_seed));
    startup_program.set_random_seed(static_cast<int64_t>(FLAGS_seed));
    ProgramGuard guard(main_program, startup_program);
    Var image = layers::data("image", {-1, 1, kSide, kSide});
    Var label = layers::data("label", {-1, 1}, DType::kInt64);
    Cnn cnn = SmallCnn(image, label);
    std::unique_ptr<Program> test_program = main_program.clone_for_test();  // before minimize
    fleet::DistributedStrategy strategy;
    auto opt = fleet::distributed_optimizer(optimizer::Momentum(static_cast<float>(FLAGS_lr), 0.9f),
                                            strategy);
    opt.minimize(cnn.loss, &startup_program);

    // Every worker makes the same images and takes its shard of them.
    std::mt19937_64 rng(FLAGS_seed);
    auto train_set = std::make_shared<TensorDataset>(MakeShapes(1024, rng));
    auto eval_set = std::make_shared<TensorDataset>(MakeShapes(300, rng));
    LoaderOptions train_opts;
    train_opts.batch_size = FLAGS_batch_size;
    train_opts.shuffle = true;
    train_opts.seed = FLAGS_seed;  // one order per epoch, the same on every worker
    train_opts.drop_last = true;
    train_opts.rank = fleet::worker_index();
    train_opts.nranks = fleet::worker_num();
    LoaderOptions eval_opts;
    eval_opts.batch_size = 100;
    eval_opts.rank = fleet::worker_index();
    eval_opts.nranks = fleet::worker_num();
    eval_opts.even_shards = false;  // every image exactly once in the job

    TrainerModel model;
    model.main = &main_program;
    model.startup = &startup_program;
    model.test = test_program.get();
    model.loss = cnn.loss.name();
    model.learning_rate = opt.learning_rate_var();
    model.train_data = std::make_shared<DataLoader>(train_set, train_opts);
    model.eval_data = std::make_shared<DataLoader>(eval_set, eval_opts);
    model.metrics = {{"accuracy", cnn.accuracy.name()}, {"loss", cnn.loss.name()}};
    trainer.add_callback(std::make_shared<StopAtStep>(FLAGS_stop_at_step));

    TrainResult result = trainer.fit(model);
    if (result.stopped || !result.last_eval) return 0;
    const double accuracy = result.last_eval->metric("accuracy");
    if (fleet::is_first_worker())
      std::printf("trained %lld steps: test accuracy %.4f\n",
                  static_cast<long long>(result.steps_done), accuracy);
    return accuracy > 0.6 ? 0 : 1;
  } catch (const keel::Error& e) {
    std::fprintf(stderr, "train_cnn: %s\n", e.what());
    return 1;
  }
}
