// The built-in models that `keel train --model=NAME` and `keel bench NAME` run without user C++:
// each builds (main, startup, test) programs with its optimizer and brings its data.
//   mlp          the seed MLP on its synthetic data
//   lenet        LeNet-5 on MNIST (--data=mnist:DIR: first 8,000 images train, last 2,000 test)
//   resnet       ResNet-20 on synthetic 32x32x3 images
//   transformer  a 2-layer encoder on the synthetic sequence-reversal task
//   ctr          the CTR-DNN (26 sparse slots sharing one is_sparse table of 1,000,001 x 10, 13
//                dense features) on its synthetic click rule, or --data=criteo:FILE
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/ir/program.h"
#include "models/ctr/ctr_model.h"
#include "models/transformer/transformer_model.h"

namespace keel {
namespace models {

// Appends backward and update ops for `loss` with `opt` (default: opt.minimize). fleet passes a
// distributed optimizer here.
using MinimizeFn = std::function<void(Var loss, Program* startup, const optimizer::Optimizer& opt)>;

struct ModelConfig {
  std::string name = "mlp";
  std::string optimizer;   // "" : the model's default; sgd | momentum | adam | adamw
  float lr = 0;            // 0 : the model's default
  uint64_t seed = 0;       // 0: nondeterministic initialization and data
  uint64_t data_seed = 0;  // synthetic streams; 0: the same as seed; ranks pass distinct ones
  // Shuffle order of a finite training set (lenet); every rank must pass the same value so that
  // the ranks' shards of one permutation are disjoint. 0: seed (0 again: nondeterministic, which
  // only one rank may use).
  uint64_t shuffle_seed = 0;
  int hidden = 1280;                 // mlp: width of the two hidden layers
  int pp_degree = 1;                 // mlp, transformer: > 1 places their layers on pipeline stages
  std::string data_format = "NCHW";  // resnet: NCHW or NHWC, its layers' image layout
  TransformerConfig transformer;     // transformer: sizes and dropout
  CtrConfig ctr;                     // ctr: the table's rows
  std::string data;                  // lenet: "mnist:DIR"; ctr: "criteo:FILE" (default: synthetic)
  int64_t batch_size = 128;
  int rank = 0, nranks = 1;    // data sharding for models with a finite training set
  MinimizeFn minimize;         // empty: plain opt.minimize
  bool programs_only = false;  // build the programs, load no data (keel inspect)
  // The mlp and the transformer are built tensor-parallel inside a TensorParallelGuard
  // (framework/dsl/tensor_parallel.h); then rank/nranks above are the data-parallel replica's
  // and data_seed must be the same on every rank of a tensor-parallel group.
  // Makes the optimizer from the model's default name and rate (keel train's flags); empty:
  // MakeOptimizer(optimizer or the default, lr or the default).
  std::function<std::unique_ptr<optimizer::Optimizer>(const std::string& default_optimizer,
                                                      float default_lr)>
      make_optimizer;
  // Called with the dataset indices of every training batch a finite-set model draws (a debug
  // and test hook: `keel train --log_sample_ids`).
  std::function<void(int64_t epoch, const std::vector<int64_t>& indices)> on_train_batch;
  // Sums each value over the ranks in place (fleet::all_reduce). Set with nranks > 1: evaluation
  // then runs this rank's shard of the test data and evaluate() returns the global metric.
  std::function<void(std::vector<double>* values)> all_reduce_sum;
  // Runs the test program on one batch (default: exe.Run(test, feed, fetch)). A pipeline stage
  // runs its part instead (keel train --pp_degree); an empty result means this rank computes no
  // metric (a stage before the last): its counts stay zero, and the stage that computes the
  // metric counts the batch.
  std::function<std::vector<Tensor>(Executor& exe, const Program& test, const FeedMap& feed,
                                    const std::vector<std::string>& fetch)>
      run_test;
};

struct Evaluation {
  double accuracy = 0;
  double auc = -1;      // ctr: the area under the ROC curve of P(click); -1: the model has none
  int64_t samples = 0;  // test samples evaluated, over all ranks
};

struct TrainableModel {
  std::unique_ptr<Program> main, startup;
  std::unique_ptr<Program> test;  // main.clone_for_test(): inference mode, no backward/update
  std::string loss, accuracy;     // accuracy: "" when the model has none
  // What an inference model takes and gives: input vars and the prediction var.
  std::vector<std::string> inputs;
  std::string prediction;
  // Fills `feed` with the next training batch of `batch` samples (models with a finite training
  // set cycle through epochs and need batch == config.batch_size).
  std::function<void(int64_t batch, FeedMap* feed)> next_batch;
  int64_t batches_per_epoch = 0;  // 0: an endless synthetic stream
  // Accuracy of the test program on the model's test data (run in `exe`'s scope). With
  // config.all_reduce_sum each rank evaluates its shard and every rank must call it: the result
  // covers the whole test data, all ranks together.
  std::function<Evaluation(Executor& exe)> evaluate;
  std::string optimizer;  // what was used, e.g. "adam lr=0.001"
  // The [1] learning-rate var of main (fetch it to log the rate; it follows a schedule).
  std::string learning_rate;
};

// Builds a model by name; an unknown name is a keel::Error listing the known ones.
TrainableModel BuildModel(const ModelConfig& config);
std::vector<std::string> ModelNames();

// "sgd" | "momentum" | "adam" | "adamw" at learning rate `lr`.
std::unique_ptr<optimizer::Optimizer> MakeOptimizer(const std::string& name, float lr);

}  // namespace models
}  // namespace keel
