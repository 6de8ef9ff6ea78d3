#include "tests/util/model_train.h"

#include <gtest/gtest.h>

#include <cmath>

#include "executor/executor.h"
#include "models/model_zoo.h"

namespace keel::testing {

std::vector<Tensor> TrainBuiltInModel(
    const std::string& name, int64_t batch, int threads, int steps, uint64_t seed,
    const std::function<void(const std::function<void()>& run)>& around_step) {
  models::ModelConfig cfg;
  cfg.name = name;
  cfg.seed = seed;
  cfg.batch_size = batch;
  models::TrainableModel m = models::BuildModel(cfg);
  ExecutionStrategy s;
  s.num_threads = threads;
  Executor exe(CPUPlace(), s);
  exe.Run(*m.startup);
  FeedMap feed;
  for (int step = 0; step < steps; ++step) {
    m.next_batch(cfg.batch_size, &feed);
    auto run = [&] { exe.Run(*m.main, feed); };
    if (around_step)
      around_step(run);
    else
      run();
  }
  std::vector<Tensor> out;
  for (const VarDesc* v : m.main->global_block().AllVars())
    if (v->persistable()) out.push_back(exe.scope().FindVar(v->name())->tensor().Clone());
  return out;
}

void ExpectSameParameters(const NamedTensors& got, const NamedTensors& ref) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t k = 0; k < ref.size(); ++k) {
    ASSERT_EQ(got[k].first, ref[k].first);
    const Tensor& a = ref[k].second;
    const Tensor& b = got[k].second;
    ASSERT_EQ(a.dims(), b.dims());
    for (int64_t i = 0; i < a.numel(); ++i) {
      float x = a.data<float>()[i], y = b.data<float>()[i];
      ASSERT_NEAR(y, x, 1e-5f * std::abs(x) + 1e-6f) << ref[k].first << "[" << i << "]";
    }
  }
}

}  // namespace keel::testing
