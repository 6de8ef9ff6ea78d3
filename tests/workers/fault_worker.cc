// A data-parallel MLP worker that misbehaves on request, for the launcher's and the straggler
// monitor's fault tests (tests/cli/worker_faults_test.cc, tests/cli/launch_security_test.cc):
// a rank that exits 0 before fleet::init, a rank whose training thread sleeps while its process
// lives, a rank that fails after joining on the first attempt, and a rank 0 that starts its
// rendezvous late on a restart, and a rank 0 that leaves first while its peers still use the
// rendezvous store. It prints "rank R step N" after every step, with the straggler
// monitor running (fleet/straggler_monitor.h).
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

#include "fleet/fleet.h"
#include "fleet/straggler_monitor.h"
#include "framework/comm/comm_context.h"

DEFINE_int32(steps, 10, "Training steps.");
DEFINE_int32(exit0_before_init_rank, -1, "This rank returns 0 from main before fleet::init.");
DEFINE_int32(hang_rank, -1, "This rank's training thread sleeps --hang_s after --hang_after.");
DEFINE_int32(hang_after, 5, "Steps --hang_rank finishes before it sleeps.");
DEFINE_int32(hang_s, 120, "How long --hang_rank sleeps.");
DEFINE_int32(fail_rank, -1,
             "On the first attempt (KEEL_RESTART_COUNT 0) this rank exits 3 after "
             "its first step.");
DEFINE_double(rank0_late_on_restart_s, 0,
              "On a restart rank 0 sleeps this long before fleet::init (its peers wait in the "
              "rendezvous meanwhile).");
DEFINE_int32(step_ms, 0, "Each step also sleeps this long (a slower job).");
DEFINE_bool(rank0_leaves_first, false,
            "After training rank 0 posts its pid in the rendezvous store and returns; the other "
            "ranks wait until that process is gone, then use the store again.");

using namespace keel;

namespace {

int RankFromEnvironment() {
  const char* r = std::getenv("RANK");
  return r ? std::atoi(r) : 0;
}

int RestartCount() {
  const char* c = std::getenv("KEEL_RESTART_COUNT");
  return c ? std::atoi(c) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  const int env_rank = RankFromEnvironment();
  if (env_rank == FLAGS_exit0_before_init_rank) {
    std::printf("rank %d leaves before fleet::init\n", env_rank);
    return 0;
  }
  if (env_rank == 0 && RestartCount() > 0 && FLAGS_rank0_late_on_restart_s > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_rank0_late_on_restart_s));
  try {
    fleet::init();
    const int rank = fleet::worker_index(), n = fleet::worker_num();
    Program main, startup;
    startup.set_random_seed(7);
    {
      ProgramGuard g(main, startup);
      Var x = layers::data("x", {-1, 8});
      Var y = layers::data("y", {-1, 1}, DType::kInt64);
      Var h = layers::fc(x, 16, "tanh");
      Var loss = layers::mean(layers::cross_entropy(layers::fc(h, 3, "softmax"), y));
      fleet::DistributedStrategy strategy;
      fleet::DistributedOptimizer(std::make_unique<optimizer::SGD>(0.1f), strategy)
          .minimize(loss, &startup);
    }
    Executor exe(fleet::worker_place());
    exe.Run(startup);
    fleet::StragglerMonitor monitor;
    std::mt19937_64 rng(123 + rank);
    std::uniform_real_distribution<float> u(-1, 1);
    const int64_t rows = 4;
    for (int step = 0; step < FLAGS_steps; ++step) {
      if (rank == FLAGS_hang_rank && step == FLAGS_hang_after) {
        std::printf("rank %d hangs after %d steps\n", rank, step);
        std::fflush(stdout);
        std::this_thread::sleep_for(std::chrono::seconds(FLAGS_hang_s));
      }
      std::vector<float> x(rows * 8);
      std::vector<int64_t> y(rows);
      for (auto& v : x) v = u(rng);
      for (auto& v : y) v = static_cast<int64_t>(rng() % 3);
      exe.Run(fleet::main_program(),
              {{"x", Tensor::FromVector(x, {rows, 8})}, {"y", Tensor::FromVector(y, {rows, 1})}});
      if (FLAGS_step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(FLAGS_step_ms));
      monitor.StepDone();
      std::printf("rank %d step %d\n", rank, step);
      std::fflush(stdout);
      if (rank == FLAGS_fail_rank && RestartCount() == 0) {
        std::printf("rank %d fails on purpose\n", rank);
        return 3;
      }
    }
    std::printf("rank %d of %d done\n", rank, n);
    if (FLAGS_rank0_leaves_first) {
      StoreClient& store = CommContext::Get().store("fault_worker");
      if (rank == 0) {
        store.Set("fault_worker/rank0_pid", std::to_string(::getpid()));
        std::printf("rank 0 leaves first\n");
        return 0;
      }
      const pid_t first = static_cast<pid_t>(std::stol(store.Get("fault_worker/rank0_pid")));
      // Reaped by the launcher: then kill(2) finds no such process.
      for (int i = 0; i < 400 && !(::kill(first, 0) != 0 && errno == ESRCH); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int64_t after = store.Add("fault_worker/after_rank0", 1);
      std::printf("rank %d used the store after rank 0 (pid %d) %s: add -> %lld\n", rank,
                  static_cast<int>(first),
                  ::kill(first, 0) != 0 && errno == ESRCH ? "was gone" : "was still there",
                  static_cast<long long>(after));
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
