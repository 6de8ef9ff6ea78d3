// Scheduler and thread-pool executor: the dependency graph has the hazard edges (and a run goes
// wrong when one is removed), stream ops are issued in program order, results are the same bits
// for 1, 2 and 4 threads, errors stop the run, and FLAGS_check_nan_inf names the first bad op.
#include "executor/scheduler.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "executor/executor.h"
#include "executor/stream.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/runtime/cpu_threads.h"
#include "models/model_zoo.h"
#include "tests/util/model_train.h"
#include "tests/util/op_test_util.h"

DECLARE_bool(check_nan_inf);

namespace keel {
namespace {

using testing::ErrorOf;
using testing::SameBits;
using Access = DependencyGraph::OpAccess;

// A budget of 4 threads (a pool of 3), whatever the machine has: enough for 4 workers.
class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { cpu_threads::SetBudget(4); }
  void TearDown() override { cpu_threads::SetBudget(1); }
};

TEST(DependencyGraph, ReadAfterWriteWriteAfterReadAndWriteAfterWrite) {
  DependencyGraph g({Access{{}, {"a"}},      // 0: a =
                     Access{{"a"}, {"b"}},   // 1: b = f(a)     RAW on a
                     Access{{"c"}, {"a"}},   // 2: a = g(c)     WAR after 1, WAW after 0
                     Access{{"c"}, {"d"}}},  // 3: d = h(c)     independent of all
                    {});
  EXPECT_TRUE(g.HasEdge(0, 1));
  EXPECT_TRUE(g.HasEdge(1, 2));
  EXPECT_TRUE(g.HasEdge(0, 2));
  EXPECT_FALSE(g.HasEdge(2, 3));
  EXPECT_EQ(g.num_predecessors(3), 0);
  EXPECT_EQ(g.MaxWidth(), 2);  // {0, 3} at depth 0
}

TEST(DependencyGraph, SlicesOfAFusedBufferConflictWithTheBufferNotWithEachOther) {
  // coalesce_tensor made g1, g2 slices of F; two grad ops write them; the all-reduce of F runs
  // after both; the optimizer reads g1 after the all-reduce.
  DependencyGraph g({Access{{"g1", "g2"}, {"g1", "g2", "F"}},  // 0: coalesce_tensor
                     Access{{"x"}, {"g1"}},                    // 1: writes slice g1
                     Access{{"y"}, {"g2"}},                    // 2: writes slice g2
                     Access{{"F"}, {"F"}},                     // 3: c_allreduce_sum(F)
                     Access{{"g1", "w"}, {"w"}}},              // 4: sgd reads g1
                    {{"g1", "F"}, {"g2", "F"}});
  EXPECT_TRUE(g.HasEdge(0, 1));
  EXPECT_TRUE(g.HasEdge(0, 2));
  EXPECT_FALSE(g.HasEdge(1, 2));  // different slices run at once
  EXPECT_TRUE(g.HasEdge(1, 3));   // the buffer's all-reduce waits for every slice writer
  EXPECT_TRUE(g.HasEdge(2, 3));
  EXPECT_TRUE(g.HasEdge(3, 4));  // a slice's reader waits for the buffer's writer
}

TEST(DependencyGraph, ABarrierOrdersEverything) {
  DependencyGraph g({Access{{}, {"a"}}, Access{{}, {"b"}}, Access{{}, {}, true}, Access{{}, {"c"}},
                     Access{{}, {"d"}}},
                    {});
  for (int i : {0, 1}) EXPECT_TRUE(g.HasEdge(i, 2));
  for (int j : {3, 4}) EXPECT_TRUE(g.HasEdge(2, j));
  EXPECT_FALSE(g.HasEdge(3, 4));
}

TEST_F(SchedulerTest, StreamOpsAreIssuedInProgramOrderWhateverBecomesReadyFirst) {
  // Op 1 (slow compute) feeds stream op 2; stream op 3 is ready at once. The stream must still
  // run 2 before 3, as every rank would.
  DependencyGraph g(
      {Access{{}, {"a"}}, Access{{"a"}, {"b"}}, Access{{"b"}, {"b"}}, Access{{}, {"c"}}}, {});
  CpuStream stream("test-ring");
  Scheduler::StreamOf on = {nullptr, nullptr, &stream, &stream};
  std::vector<int> order;
  std::mutex mu;
  Scheduler::Run(g, on, 2, [&](int i) {
    if (i == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(i);
  });
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

// On a budget of two cores (the caller and one pool thread), the threads that ran the two pieces
// of a kernel's ParallelFor.
std::set<std::thread::id> PieceThreads(const DependencyGraph& g, int slow_op) {
  cpu_threads::SetBudget(2);
  std::mutex mu;
  std::set<std::thread::id> threads;
  Scheduler::Run(g, {}, 2, [&](int i) {
    if (i != slow_op) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      return;
    }
    cpu_threads::ParallelFor(2, [&](int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
    });
  });
  return threads;
}

// Op 0 (quick) runs on the caller, op 1 (a kernel in two pieces) on the pool thread: the caller,
// with nothing left to run, takes the second piece instead of sleeping.
TEST_F(SchedulerTest, AnIdleWorkerRunsPiecesOfAKernelRunningElsewhere) {
  DependencyGraph g({Access{{}, {"a"}}, Access{{}, {"b"}}}, {});
  EXPECT_EQ(PieceThreads(g, 1).size(), 2u);
}

// Op 0 (a kernel in two pieces) runs on the caller while a hundred quick independent ops keep the
// pool thread's worker busy: that worker hands its thread back to the kernel's piece after the
// op it is running, rather than keeping the core while the caller runs both pieces alone.
TEST_F(SchedulerTest, APoolWorkerGivesItsThreadToAKernelsPieces) {
  std::vector<Access> ops = {Access{{}, {"k"}}};
  for (int i = 0; i < 100; ++i) ops.push_back(Access{{}, {"t" + std::to_string(i)}});
  DependencyGraph g(ops, {});
  EXPECT_EQ(PieceThreads(g, 0).size(), 2u);
}

TEST_F(SchedulerTest, AFailureStopsTheRunAndIsRethrown) {
  DependencyGraph g({Access{{}, {"a"}}, Access{{"a"}, {"b"}}, Access{{"b"}, {"c"}}}, {});
  std::atomic<int> ran{0};
  std::string e = ErrorOf([&] {
    Scheduler::Run(g, {}, 4, [&](int i) {
      ++ran;
      if (i == 1) KEEL_THROW("op one failed");
    });
  });
  EXPECT_NE(e.find("op one failed"), std::string::npos) << e;
  EXPECT_EQ(ran.load(), 2);  // op 2 never started
}

// x: [n, n]; u = matmul(x, x) (slow); out = u + v; then v *= 2 in place. The graph orders the
// in-place scale after the add that reads v (write after read).
struct HazardNet {
  Program main, startup;
  HazardNet() {
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, -1});
    Var v = layers::data("v", {-1, -1});
    Var u = layers::matmul(x, x);
    layers::elementwise_add(u, v);
    Block& b = main.global_block();
    AppendOp(b, "scale", {{"X", {v.name()}}}, {{"Out", {v.name()}}}, {{"scale", 2.0f}});
  }
};

TEST_F(SchedulerTest, HazardEdgeKeepsTheAnswerAndRemovingItBreaksIt) {
  const int n = 512;
  Tensor x(DType::kFloat32, {n, n}), v(DType::kFloat32, {n, n});
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.data<float>()[i] = static_cast<float>(i % 7) * 0.01f;
    v.data<float>()[i] = 1.0f;
  }
  // Returns how many elements of u + v came out wrong.
  auto run = [&](bool remove_edge) -> int64_t {
    HazardNet net;
    ExecutionStrategy s;
    s.num_threads = 2;
    Executor exe(CPUPlace(), s);
    const Block& b = net.main.global_block();
    EXPECT_EQ(b.num_ops(), 3u);
    DependencyGraph& g = exe.DependencyGraphForTesting(net.main);
    EXPECT_TRUE(g.HasEdge(1, 2));  // the add reads v before the scale writes it
    if (remove_edge) g.RemoveEdge(1, 2);
    // A fresh copy of v each run: the program scales it in place.
    auto out = exe.Run(net.main, {{"x", x}, {"v", v.Clone()}},
                       {b.op(1)->Output("Out")[0], b.op(0)->Output("Out")[0]});
    const float* sum = out[0].data<float>();
    const float* u = out[1].data<float>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < out[0].numel(); ++i) wrong += sum[i] != u[i] + 1.0f;
    return wrong;
  };
  for (int i = 0; i < 5; ++i) EXPECT_EQ(run(false), 0) << i;
  // Without the edge the second worker takes the scale while the first multiplies, and the add
  // sees v = 2. Which thread gets there first is up to the OS, so try a few times.
  int64_t wrong = 0;
  for (int i = 0; i < 20 && wrong == 0; ++i) wrong = run(true);
  EXPECT_GT(wrong, 0) << "removing the write-after-read edge never changed the answer";
}

// Eight independent branches from one input, summed: ops that can run at once.
struct ManyBranches {
  Program main, startup;
  Var loss;
  ManyBranches() {
    startup.set_random_seed(11);
    main.set_random_seed(11);
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, 96});
    std::vector<Var> heads;
    for (int b = 0; b < 8; ++b) heads.push_back(layers::fc(layers::fc(x, 160, "tanh"), 8));
    loss = layers::mean(layers::sums(heads));
    optimizer::SGD(0.05f).minimize(loss, &startup);
  }
};

std::vector<Tensor> Persistables(Executor& exe, const Program& p) {
  std::vector<Tensor> out;
  for (VarDesc* v : p.global_block().AllVars())
    if (v->persistable()) out.push_back(exe.scope().FindVar(v->name())->tensor().Clone());
  return out;
}

TEST_F(SchedulerTest, ManyBranchesGiveTheSameBitsWithOneTwoAndFourThreads) {
  Tensor x(DType::kFloat32, {256, 96});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::sin(0.37f * i);
  auto train = [&](int threads) {
    ManyBranches net;
    ExecutionStrategy s;
    s.num_threads = threads;
    Executor exe(CPUPlace(), s);
    exe.Run(net.startup);
    for (int step = 0; step < 4; ++step) exe.Run(net.main, {{"x", x}});
    EXPECT_EQ(exe.WorkersFor(net.main), threads);
    return Persistables(exe, net.main);
  };
  std::vector<Tensor> one = train(1);
  EXPECT_TRUE(SameBits(one, train(2)));
  EXPECT_TRUE(SameBits(one, train(4)));
  EXPECT_TRUE(SameBits(one, train(4)));  // and again
  EXPECT_TRUE(SameBits(one, train(1)));
}

// A built-in model trained 2 steps with `threads` workers; its parameters.
std::vector<Tensor> TrainModel(const std::string& name, int64_t batch, int threads) {
  return testing::TrainBuiltInModel(name, batch, threads, /*steps=*/2, /*seed=*/3);
}

TEST_F(SchedulerTest, TransformerGivesTheSameBitsWithOneTwoAndFourThreads) {
  std::vector<Tensor> one = TrainModel("transformer", 128, 1);
  EXPECT_TRUE(SameBits(one, TrainModel("transformer", 128, 1))) << "not reproducible";
  EXPECT_TRUE(SameBits(one, TrainModel("transformer", 128, 2)));
  EXPECT_TRUE(SameBits(one, TrainModel("transformer", 128, 4)));
}

TEST_F(SchedulerTest, ResNetConvPiecesGiveTheSameBitsOnOneAndFourThreads) {
  // Batch 16: the convs split the batch into pieces that run on the pool.
  std::vector<Tensor> one = TrainModel("resnet", 16, 1);
  EXPECT_TRUE(SameBits(one, TrainModel("resnet", 16, 4)));
  cpu_threads::SetBudget(1);
  EXPECT_TRUE(SameBits(one, TrainModel("resnet", 16, 1))) << "a budget of 1 thread differs";
}

TEST_F(SchedulerTest, NumThreadsZeroUsesTheBudgetUpToTheProgramsWidth) {
  ManyBranches net;
  Executor exe;
  exe.Run(net.startup);
  EXPECT_EQ(exe.WorkersFor(net.main), 4);  // 8 branches, budget 4
  HazardNet chain;
  EXPECT_EQ(exe.WorkersFor(chain.main), 1);  // a chain: one op at a time
  cpu_threads::SetBudget(1);
  EXPECT_EQ(exe.WorkersFor(net.main), 1);
}

TEST(ExecutionStrategy, OutOfRangeFieldsAreErrorsNamingThem) {
  ExecutionStrategy s;
  s.num_threads = -1;
  std::string e = ErrorOf([&] { Executor exe(CPUPlace(), s); });
  EXPECT_NE(e.find("num_threads=-1"), std::string::npos) << e;
  s = {};
  s.num_iteration_per_drop_scope = 0;
  Executor exe;
  e = ErrorOf([&] { exe.set_strategy(s); });
  EXPECT_NE(e.find("num_iteration_per_drop_scope=0"), std::string::npos) << e;
}

TEST(CheckNanInf, StopsAtTheFirstOpProducingInfAndNamesIt) {
  Program main, startup;
  Var q, out;
  {
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1});
    Var y = layers::data("y", {-1});
    q = layers::elementwise_div(x, y);
    out = layers::scale(q, 2.0f);
  }
  Executor exe;
  FeedMap feed{{"x", Tensor::FromVector<float>({1, 2}, {2})},
               {"y", Tensor::FromVector<float>({1, 0}, {2})}};
  EXPECT_EQ(exe.Run(main, feed, {out})[0].data<float>()[1], INFINITY);  // off: runs through
  FLAGS_check_nan_inf = true;
  exe.local_scope().FindVar(out.name())->mutable_tensor()->clear();
  std::string e = ErrorOf([&] { exe.Run(main, feed); });
  FLAGS_check_nan_inf = false;
  EXPECT_NE(e.find("elementwise_div"), std::string::npos) << e;
  EXPECT_NE(e.find("'" + q.name() + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("Inf (element 1"), std::string::npos) << e;
  EXPECT_FALSE(exe.local_scope().FindVar(out.name())->tensor().initialized());  // scale never ran
}

// 16-bit outputs are checked too (AMP's, and gradients fp16_allreduce makes bfloat16 where they
// are computed): a cast whose bfloat16 result overflows to Inf is named.
TEST(CheckNanInf, NamesA16BitOutputHoldingInf) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(dt));
    Program main, startup;
    Var low;
    {
      ProgramGuard g(main, startup);
      Var x = layers::data("x", {-1});
      low = layers::cast(x, dt);
    }
    Executor exe;
    // 3.4e38 is a finite float32 above bfloat16's largest finite value (3.3895e38), so both casts
    // round it to Inf.
    FeedMap feed{{"x", Tensor::FromVector<float>({1, 3.4e38f}, {2})}};
    FLAGS_check_nan_inf = true;
    const std::string e = ErrorOf([&] { exe.Run(main, feed); });
    FLAGS_check_nan_inf = false;
    EXPECT_NE(e.find("'" + low.name() + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("Inf (element 1"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace keel

namespace keel {
namespace {

// Pool threads spin briefly before sleeping only when the budget does not oversubscribe the CPUs
// (the budget times the node's workers at most the CPUs), never with no pool.
TEST(CpuThreads, PoolThreadsSpinOnlyWhenTheBudgetFitsTheCpus) {
  EXPECT_TRUE(cpu_threads::ShouldSpin(2, 1, 2));
  EXPECT_TRUE(cpu_threads::ShouldSpin(4, 2, 8));
  EXPECT_FALSE(cpu_threads::ShouldSpin(3, 1, 2));  // more threads than CPUs
  EXPECT_FALSE(cpu_threads::ShouldSpin(2, 2, 2));  // two workers of 2 threads on 2 CPUs
  EXPECT_FALSE(cpu_threads::ShouldSpin(1, 1, 2));  // no pool
  cpu_threads::SetBudget(2, true);
  EXPECT_TRUE(cpu_threads::SpinWhenIdle());
  cpu_threads::SetBudget(2, false);
  EXPECT_FALSE(cpu_threads::SpinWhenIdle());
  cpu_threads::SetBudget(1, true);
  EXPECT_FALSE(cpu_threads::SpinWhenIdle());
}

}  // namespace
}  // namespace keel
