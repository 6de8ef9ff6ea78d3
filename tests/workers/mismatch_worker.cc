// Collectives that only some ranks make, across real processes; tests/fleet/
// collective_mismatch_test.cc starts it under `keel launch` (2 workers) with --case=NAME:
//   sum_vs_barrier       rank 0 calls fleet::metrics::sum (fleet's eager ring not set up yet),
//                        rank 1 fleet::barrier_worker
//   warm_sum_vs_barrier  the same after one metric on every rank (the eager ring exists)
//   sum_vs_step          after two training steps and a metric on every rank, rank 0 calls
//                        fleet::metrics::sum while rank 1 runs a training step
//   sum_after_peer_exit  rank 0 calls fleet::metrics::sum, rank 1 returns from main instead
//   slow_peer            no mismatch: rank 1 is seconds late to a barrier, a metric and a step
// Prints "<case> ok" and exits 0 when its calls complete; a keel::Error is printed as
// "rank R: <message>", and the worker waits a few seconds before it exits 1 so that the other
// rank reports its own error before keel launch stops it.
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

#include "models/mlp/mlp_model.h"

DEFINE_string(case, "", "Which scenario to run (see the file comment).");

using namespace keel;

namespace {

struct Model {
  Program main, startup;
  Var loss;
  Executor exe;
  models::SyntheticMlpData data{17};
};

std::unique_ptr<Model> BuildModel() {
  auto m = std::make_unique<Model>();
  m->startup.set_random_seed(5);
  ProgramGuard g(m->main, m->startup);
  Var x = layers::data("x", {-1, 32});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  m->loss = models::mlp(x, y, 8);
  fleet::distributed_optimizer(optimizer::SGD(0.1f)).minimize(m->loss, &m->startup);
  m->exe.Run(m->startup);
  return m;
}

void Step(Model& m) {
  Tensor x, y;
  m.data.Next(8, &x, &y);
  m.exe.Run(m.main, {{"x", x}, {"y", y}}, {m.loss.name()});
}

bool First() { return fleet::is_first_worker(); }

void SumVsBarrier() {
  if (First())
    fleet::metrics::sum(1.0);
  else
    fleet::barrier_worker();
}

void WarmSumVsBarrier() {
  fleet::metrics::sum(1.0);
  SumVsBarrier();
}

void SumVsStep() {
  auto m = BuildModel();
  Step(*m);
  Step(*m);
  fleet::metrics::sum(1.0);
  if (First())
    fleet::metrics::sum(2.0);
  else
    Step(*m);
}

void SumAfterPeerExit() {
  if (First()) fleet::metrics::sum(1.0);
}

void SlowPeer() {
  auto late = [] {
    if (!First()) std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  };
  late();
  fleet::barrier_worker();
  late();
  KEEL_ENFORCE(fleet::metrics::sum(1.0) == fleet::worker_num(), "metrics::sum");
  auto m = BuildModel();
  Step(*m);
  late();
  Step(*m);
}

}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init();
    const std::map<std::string, void (*)()> cases = {{"sum_vs_barrier", SumVsBarrier},
                                                     {"warm_sum_vs_barrier", WarmSumVsBarrier},
                                                     {"sum_vs_step", SumVsStep},
                                                     {"sum_after_peer_exit", SumAfterPeerExit},
                                                     {"slow_peer", SlowPeer}};
    auto it = cases.find(FLAGS_case);
    KEEL_ENFORCE(it != cases.end(), "unknown --case '", FLAGS_case, "'");
    it->second();
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", fleet::initialized() ? fleet::worker_index() : -1,
                 e.what());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::seconds(4));
    return 1;
  }
  std::printf("%s ok\n", FLAGS_case.c_str());
  return 0;
}
