// keel::Trainer on several workers, for tests/trainer/trainer_fleet_test.cc (run under keel
// launch). Every rank prints its lines:
//   --case=eval_global   evaluation on uneven shards of 7 values (each rank's metric differs):
//                        "rank R fit_eval V samples N" (from fit's eval_every) and
//                        "rank R evaluate V samples N" (Trainer::evaluate after fit)
//   --case=stop          rank --stop_rank asks to stop after step --stop_at; every rank prints
//                        "rank R steps_done N stopped S"
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <cstdio>

#include "tests/trainer/tiny_model.h"

DEFINE_string(case, "", "eval_global | stop");
DEFINE_int32(stop_rank, 1, "stop: the rank whose callback asks to stop.");
DEFINE_int32(stop_at, 3, "stop: the step after which it asks.");
DEFINE_int32(stop_check_every, 1, "stop: TrainerOptions::stop_check_every.");

using namespace keel;

namespace {

int EvalGlobal(int rank, int world) {
  auto t = testing::MakeTinyModel(32, 4, rank, world, /*data_parallel=*/true);
  // The metric is the mean of v over the evaluation rows; v = 0, 1, 4, ..., 36: 13 over all seven,
  // while rank 0 of 2 holds 0, 4, 16, 36 (mean 14) and rank 1 holds 1, 9, 25.
  Program test, test_startup;
  std::string mean;
  {
    ProgramGuard guard(test, test_startup);
    mean = layers::mean(layers::data("v", {-1, 1})).name();
  }
  Tensor v(DType::kFloat32, {7, 1});
  for (int i = 0; i < 7; ++i) v.data<float>()[i] = static_cast<float>(i * i);
  LoaderOptions eo;
  eo.batch_size = 2;
  eo.rank = rank;
  eo.nranks = world;
  eo.even_shards = false;
  t->model.test = &test;
  t->model.eval_data = std::make_shared<DataLoader>(
      std::make_shared<TensorDataset>(std::vector<std::string>{"v"}, std::vector<Tensor>{v}), eo);
  t->model.metrics = {{"square", mean}};
  TrainerOptions o;
  o.steps = 2;
  o.eval_every = 2;
  o.progress = "none";
  Trainer trainer(o);
  TrainResult r = trainer.fit(t->model);
  std::printf("rank %d fit_eval %.6f samples %lld\n", rank, r.last_eval->metric("square"),
              static_cast<long long>(r.last_eval->samples));
  EvalResult e = trainer.evaluate(t->model);
  std::printf("rank %d evaluate %.6f samples %lld\n", rank, e.metric("square"),
              static_cast<long long>(e.samples));
  return 0;
}

int Stop(int rank, int world) {
  auto t = testing::MakeTinyModel(64, 4, rank, world, /*data_parallel=*/true);
  TrainerOptions o;
  o.steps = 40;
  o.progress = "none";
  o.stop_check_every = FLAGS_stop_check_every;
  Trainer trainer(o);
  auto cb = std::make_shared<LambdaCallback>();
  cb->step_end = [rank](Trainer& tr, const StepInfo& s) {
    if (rank == FLAGS_stop_rank && s.step == FLAGS_stop_at) tr.stop();
  };
  trainer.add_callback(cb);
  TrainResult r = trainer.fit(t->model);
  std::printf("rank %d steps_done %lld stopped %d\n", rank, static_cast<long long>(r.steps_done),
              r.stopped ? 1 : 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init();
    const int rank = fleet::worker_index(), world = fleet::worker_num();
    if (FLAGS_case == "eval_global") return EvalGlobal(rank, world);
    if (FLAGS_case == "stop") return Stop(rank, world);
    std::fprintf(stderr, "trainer_worker: unknown --case='%s'\n", FLAGS_case.c_str());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "trainer_worker: %s\n", e.what());
    return 1;
  }
}
