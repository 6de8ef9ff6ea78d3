#include "tests/util/model_train.h"

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

}  // namespace keel::testing
