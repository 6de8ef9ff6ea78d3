// A small classifier for the Trainer's tests: fc -> dropout -> fc softmax on 4 features, its
// programs, a shuffled training DataLoader and an evaluation one over TensorDatasets, and the
// TrainerModel that points at them. Built the same from the same arguments, so two builds train
// to the same bits.
#pragma once

#include <memory>
#include <random>
#include <string>

#include "fleet/fleet.h"
#include "framework/data/data_loader.h"
#include "framework/data/tensor_dataset.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/dsl/tensor_layers.h"
#include "trainer/trainer.h"

namespace keel::testing {

struct TinyModel {
  std::unique_ptr<Program> main, startup, test;
  std::string loss, accuracy;
  TrainerModel model;
};

// rows training examples (batches of `batch`, shuffled with a fixed seed), 20 evaluation ones;
// `rank` of `nranks` shards both loaders; `data_parallel`: minimized by fleet's distributed
// optimizer (its gradients all-reduced under several workers).
inline std::unique_ptr<TinyModel> MakeTinyModel(int64_t rows = 32, int64_t batch = 8, int rank = 0,
                                                int nranks = 1, bool data_parallel = false) {
  auto t = std::make_unique<TinyModel>();
  t->main = std::make_unique<Program>();
  t->startup = std::make_unique<Program>();
  t->main->set_random_seed(3);
  t->startup->set_random_seed(3);
  {
    ProgramGuard guard(*t->main, *t->startup);
    Var x = layers::data("x", {-1, 4});
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    Var h = layers::dropout(layers::fc(x, 16, "relu"), 0.25f);
    Var prob = layers::fc(h, 2, "softmax");
    Var loss = layers::mean(layers::cross_entropy(prob, y));
    Var acc = layers::accuracy(prob, y);
    t->test = t->main->clone_for_test();
    if (data_parallel)
      fleet::distributed_optimizer(optimizer::Momentum(0.1f, 0.9f))
          .minimize(loss, t->startup.get());
    else
      optimizer::Momentum(0.1f, 0.9f).minimize(loss, t->startup.get());
    t->loss = loss.name();
    t->accuracy = acc.name();
  }
  auto make = [](int64_t n, std::mt19937_64& rng) {
    Tensor x(DType::kFloat32, {n, 4}), y(DType::kInt64, {n, 1});
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      float* r = x.data<float>() + 4 * i;
      for (int j = 0; j < 4; ++j) r[j] = u(rng);
      y.data<int64_t>()[i] = r[0] + r[1] > r[2] + r[3] ? 1 : 0;
    }
    return std::make_shared<TensorDataset>(std::vector<std::string>{"x", "y"},
                                           std::vector<Tensor>{x, y});
  };
  std::mt19937_64 rng(11);
  auto train = make(rows, rng), eval = make(20, rng);
  LoaderOptions to;
  to.batch_size = batch;
  to.shuffle = true;
  to.seed = 5;
  to.rank = rank;
  to.nranks = nranks;
  LoaderOptions eo;
  eo.batch_size = 6;
  eo.rank = rank;
  eo.nranks = nranks;
  eo.even_shards = false;
  TrainerModel& m = t->model;
  m.main = t->main.get();
  m.startup = t->startup.get();
  m.test = t->test.get();
  m.loss = t->loss;
  m.train_data = std::make_shared<DataLoader>(train, to);
  m.eval_data = std::make_shared<DataLoader>(eval, eo);
  m.metrics = {{"accuracy", t->accuracy}, {"loss", t->loss}};
  return t;
}

}  // namespace keel::testing
