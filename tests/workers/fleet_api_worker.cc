// fleet's user-facing API across real processes; tests/fleet/fleet_api_test.cc starts it under
// `keel launch` with --case=NAME:
//   two_programs      two programs, each minimized by its own distributed optimizer, both train
//   all_reduce        fleet::all_reduce and fleet::metrics give the global values on every rank
//   save_rank0_only   `if (worker_index() == 0) save_persistables(...)`: rank 0 saves, nobody waits
//   barrier_peer_gone rank 1 exits at once; rank 0's barrier_worker fails naming it
//   barrier_peer_late rank 1 arrives long after the comm timeout; rank 0's barrier names it
//   segfault          rank 1 prints a line, then dereferences a null pointer
// Prints "<case> ok" and exits 0 when the rank's checks hold; a keel::Error exits 1.
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <cmath>
#include <map>
#include <thread>

#include "models/mlp/mlp_model.h"

DEFINE_string(case, "", "Which scenario to run (see the file comment).");
DEFINE_string(dir, "", "save_rank0_only: where rank 0 saves.");

using namespace keel;

// Outside the anonymous namespace: a global symbol, so the stack trace can name it.
__attribute__((noinline)) void CrashNow(volatile int* p);
void CrashNow(volatile int* p) {
  asm volatile("nop");  // the faulting store is not the first byte: traces symbolize pc - 1
  *p = 1;
}

namespace {

struct Model {
  Program main, startup;
  Var loss;
};

// A small MLP, minimized by a distributed SGD; `hidden` makes programs differ.
std::unique_ptr<Model> BuildModel(int hidden) {
  auto m = std::make_unique<Model>();
  m->startup.set_random_seed(3);
  ProgramGuard g(m->main, m->startup);
  Var x = layers::data("x", {-1, 32});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  m->loss = models::mlp(x, y, hidden);
  fleet::distributed_optimizer(optimizer::SGD(0.1f)).minimize(m->loss, &m->startup);
  return m;
}

float Train(Model& m, Executor& exe, int steps) {
  exe.Run(m.startup);
  models::SyntheticMlpData data(11 + fleet::worker_index());
  Tensor x, y;
  float loss = 0;
  for (int i = 0; i < steps; ++i) {
    data.Next(16, &x, &y);
    loss = exe.Run(m.main, {{"x", x}, {"y", y}}, {m.loss.name()})[0].item<float>();
  }
  return loss;
}

void Expect(bool ok, const std::string& what) { KEEL_ENFORCE(ok, "check failed: ", what); }

void TwoPrograms() {
  auto a = BuildModel(8);
  // Rank 0 publishes its second program late: a check that reused the first one's store keys
  // would read rank 0's first program here.
  if (fleet::worker_index() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto b = BuildModel(12);
  Executor ea, eb;  // both programs name their parameters fc_0.w_0, ...
  float la = Train(*a, ea, 3), lb = Train(*b, eb, 3);
  Expect(std::isfinite(la) && std::isfinite(lb), "finite losses");
  // Each program's parameters are equal on every rank after training.
  for (Executor* exe : {&ea, &eb}) {
    for (const char* p : {"fc_0.w_0", "fc_2.w_0"}) {
      Variable* v = exe->scope().FindVar(p);
      Expect(v != nullptr, std::string(p) + " exists");
      Tensor mine = v->tensor().Clone(CPUPlace());
      Tensor sum = mine.Clone(CPUPlace());
      fleet::all_reduce(&sum);
      const float* s = sum.data<float>();
      const float* x = mine.data<float>();
      for (int64_t i = 0; i < mine.numel(); ++i)
        Expect(std::fabs(s[i] - fleet::worker_num() * x[i]) <= 1e-5f * (1 + std::fabs(s[i])),
               std::string(p) + " equal on every rank");
    }
  }
}

void AllReduce() {
  const int r = fleet::worker_index(), n = fleet::worker_num();
  Tensor t(DType::kFloat32, DDim({3}));
  t.data<float>()[0] = static_cast<float>(r);
  t.data<float>()[1] = 2.0f * r;
  t.data<float>()[2] = 1.0f;
  fleet::all_reduce(&t);
  const float tri = n * (n - 1) / 2.0f;
  Expect(t.data<float>()[0] == tri && t.data<float>()[1] == 2 * tri &&
             t.data<float>()[2] == static_cast<float>(n),
         "all_reduce sum");
  Tensor m(DType::kInt64, DDim({1}));
  *m.data<int64_t>() = 10 + r;
  fleet::all_reduce(&m, ReduceOp::kMax);
  Expect(*m.data<int64_t>() == 10 + n - 1, "all_reduce max of int64");
  Expect(fleet::metrics::sum(r + 0.5) == tri + 0.5 * n, "metrics::sum");
  Expect(fleet::metrics::max(r) == n - 1, "metrics::max");
  Expect(fleet::metrics::min(r) == 0, "metrics::min");
  // Rank r got r + 1 of its 10 samples right: (sum of r + 1) / (10 n).
  double acc = fleet::metrics::acc(r + 1, 10);
  Expect(std::fabs(acc - (tri + n) / (10.0 * n)) < 1e-12, "metrics::acc");
}

void SaveRank0Only() {
  auto m = BuildModel(8);
  Executor exe;
  Train(*m, exe, 2);
  if (fleet::worker_index() == 0) fleet::save_persistables(exe, FLAGS_dir);
}

void BarrierPeerGone() {
  if (fleet::worker_index() == 1) return;  // exits without meeting anyone
  fleet::barrier_worker();
}

void BarrierPeerLate() {
  if (fleet::worker_index() == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
  fleet::barrier_worker();
}

void Segfault() {
  if (fleet::worker_index() != 1) {
    fleet::barrier_worker();  // fails as soon as rank 1 is gone
    return;
  }
  std::printf("rank 1 about to crash\n");  // no flush: stdout must be line-buffered
  volatile int* null = nullptr;
  CrashNow(null);
}

}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init();
    const std::map<std::string, void (*)()> cases = {
        {"two_programs", TwoPrograms},          {"all_reduce", AllReduce},
        {"save_rank0_only", SaveRank0Only},     {"barrier_peer_gone", BarrierPeerGone},
        {"barrier_peer_late", BarrierPeerLate}, {"segfault", Segfault}};
    auto it = cases.find(FLAGS_case);
    KEEL_ENFORCE(it != cases.end(), "unknown --case '", FLAGS_case, "'");
    it->second();
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", fleet::initialized() ? fleet::worker_index() : -1,
                 e.what());
    return 1;
  }
  std::printf("%s ok\n", FLAGS_case.c_str());
  return 0;
}
