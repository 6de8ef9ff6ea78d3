// Eager deletion (FLAGS_eager_delete_tensor_gb) and the CPU caching allocator (--cpu_allocator):
// which temporaries a plan frees and when, that freeing changes no bit on any number of threads
// while it lowers the step's peak memory, and that steady-state steps take no memory from the
// system while a scope drop gives it back.
#include "executor/eager_deletion.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include "executor/executor.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/runtime/allocator.h"
#include "framework/runtime/cpu_threads.h"
#include "models/model_zoo.h"
#include "tests/util/model_train.h"
#include "tests/util/op_test_util.h"

DECLARE_double(eager_delete_tensor_gb);
DECLARE_string(cpu_allocator);

namespace keel {
namespace {

using Access = DependencyGraph::OpAccess;
using testing::ErrorOf;
using testing::SameBits;

TEST(EagerDeletionPlan, CollectsOnlyTemporariesEveryRunWritesBeforeReading) {
  Variable a, b, c, d, e, buf, g0, out;
  const std::map<std::string, Variable*> owned = {{"a", &a},   {"b", &b},    {"c", &c},
                                                  {"d", &d},   {"e", &e},    {"buf", &buf},
                                                  {"g0", &g0}, {"out", &out}};
  std::vector<Access> ops(6);
  ops[0].writes = {"a"};                                   // a: written first
  ops[1].reads = {"a", "c"}, ops[1].writes = {"b"};        // c: read before any write (a feed)
  ops[2].reads = {"d"}, ops[2].writes = {"d"};             // d: updated in place, read first
  ops[3].reads = {"b", "a", "p"}, ops[3].writes = {"g0"};  // p: not the plan's (a parameter)
  ops[4].reads = {"g0"}, ops[4].writes = {"buf", "e"};     // buf: a fused buffer, g0 its slice
  ops[5].reads = {"buf", "e"}, ops[5].writes = {"out"};
  const std::map<std::string, std::string> slices = {{"g0", "buf"}};
  EagerDeletionPlan plan(ops, owned, slices);
  EXPECT_EQ(plan.Names(), (std::vector<std::string>{"a", "b", "e", "out"}));
  EXPECT_TRUE(plan.FreedAfter(0).empty());
  EXPECT_TRUE(plan.FreedAfter(1).empty());
  EXPECT_EQ(plan.FreedAfter(3), (std::vector<std::string>{"a", "b"}));  // their last reader
  EXPECT_EQ(plan.FreedAfter(5), (std::vector<std::string>{"e", "out"}));

  // An op that runs a sub-block touches names the plan cannot see: nothing is collected.
  ops[2].barrier = ops[2].hidden_accesses = true;
  EXPECT_TRUE(EagerDeletionPlan(ops, owned, slices).empty());
  // A barrier that hides nothing (a collective with use_calc_stream) changes nothing.
  ops[2].hidden_accesses = false;
  EXPECT_EQ(EagerDeletionPlan(ops, owned, slices).size(), 4u);
}

TEST(EagerDeletionRun, FreesAVariableWhenItsLastToucherFinishesInAnyOrder) {
  Variable a, b;
  std::vector<Access> ops(3);
  ops[0].writes = {"a"};
  ops[1].reads = {"a"}, ops[1].writes = {"b"};
  ops[2].reads = {"a"};  // two readers of a, unordered between them
  EagerDeletionPlan plan(ops, {{"a", &a}, {"b", &b}}, {});
  for (Variable* v : {&a, &b}) v->mutable_tensor()->Alloc(DType::kFloat32, DDim{4});
  const std::set<const Variable*> keep = {&b};
  EagerDeletionRun run(plan, keep, 0);
  run.OpDone(0);
  run.OpDone(2);  // the later reader finishes first
  EXPECT_TRUE(a.tensor().initialized()) << "freed while op 1 still reads it";
  run.OpDone(1);
  EXPECT_FALSE(a.tensor().initialized());
  EXPECT_TRUE(b.tensor().initialized()) << "a kept (fetched) variable was freed";
}

TEST(EagerDeletionRun, AThresholdHoldsFreedVariablesUntilThatManyBytesAreDue) {
  Variable a, b, c;
  std::vector<Access> ops(3);
  ops[0].writes = {"a"};
  ops[1].writes = {"b"};
  ops[2].writes = {"c"};
  EagerDeletionPlan plan(ops, {{"a", &a}, {"b", &b}, {"c", &c}}, {});
  for (Variable* v : {&a, &b, &c}) v->mutable_tensor()->Alloc(DType::kFloat32, DDim{256});
  const std::set<const Variable*> keep;
  EagerDeletionRun run(plan, keep, 2 * 1024);  // two of the 1 KiB tensors
  run.OpDone(0);
  EXPECT_TRUE(a.tensor().initialized()) << "1 KiB due, below the threshold";
  run.OpDone(1);
  EXPECT_FALSE(a.tensor().initialized());
  EXPECT_FALSE(b.tensor().initialized());
  run.OpDone(2);
  EXPECT_TRUE(c.tensor().initialized());
  run.Finish();  // the end of the run frees what is held
  EXPECT_FALSE(c.tensor().initialized());
}

struct TinyNet {
  Program main, startup;
  Var loss;
  TinyNet() {
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, 3});
    loss = layers::mean(layers::relu(layers::fc(x, 2)));
    optimizer::SGD(0.1f).minimize(loss, &startup);
  }
};

TEST(EagerDeletion, FreesTemporariesAfterTheRunButKeepsFetchesFeedsAndParameters) {
  gflags::FlagSaver saver;
  TinyNet n;
  Executor exe;
  exe.Run(n.startup);
  Tensor x = Tensor::FromVector<float>({1, 2, 3}, {1, 3});
  exe.Run(n.main, {{"x", x}}, {n.loss});
  const Scope& local = exe.local_scope();
  EXPECT_FALSE(local.FindLocalVar("fc_0.tmp_0")->tensor().initialized());
  EXPECT_TRUE(local.FindLocalVar(n.loss.name())->tensor().initialized()) << "fetched";
  EXPECT_TRUE(local.FindLocalVar("x")->tensor().initialized()) << "fed";
  EXPECT_TRUE(exe.scope().FindVar("fc_0.w_0")->tensor().initialized()) << "a parameter";

  FLAGS_eager_delete_tensor_gb = -1;  // off: the temporaries stay until the scope drop
  exe.Run(n.main, {{"x", x}}, {n.loss});
  EXPECT_TRUE(local.FindLocalVar("fc_0.tmp_0")->tensor().initialized());
}

// A built-in model trained 3 steps on `threads` workers: its persistables, and the peak of the
// CPU allocator's bytes in use during the last step.
struct Trained {
  std::vector<Tensor> params;
  size_t last_step_peak = 0;
};
Trained Train(const std::string& name, int64_t batch, int threads) {
  Trained t;
  t.params = testing::TrainBuiltInModel(
      name, batch, threads, /*steps=*/3, /*seed=*/5, [&](const std::function<void()>& run) {
        const size_t before = CpuAllocatorStats().in_use_bytes;
        CpuAllocatorResetPeak();
        run();
        t.last_step_peak = CpuAllocatorStats().peak_in_use_bytes - before;
      });
  return t;
}

TEST(EagerDeletion, ChangesNoBitOnAnyThreadCountAndLowersTheStepsPeakMemory) {
  gflags::FlagSaver saver;
  cpu_threads::SetBudget(4);
  for (const std::string model : {"transformer", "resnet"}) {
    const int64_t batch = model == "resnet" ? 8 : 64;
    FLAGS_eager_delete_tensor_gb = -1;
    const Trained kept = Train(model, batch, 1);
    FLAGS_eager_delete_tensor_gb = 0;
    const Trained freed = Train(model, batch, 1);
    EXPECT_TRUE(SameBits(kept.params, freed.params)) << model;
    EXPECT_TRUE(SameBits(kept.params, Train(model, batch, 2).params)) << model << ", 2 workers";
    EXPECT_TRUE(SameBits(kept.params, Train(model, batch, 4).params)) << model << ", 4 workers";
    // A threshold never reached holds every dead temporary to the run's end: the step's peak is
    // then the sum of its temporaries, while freeing at once needs only what is alive together.
    FLAGS_eager_delete_tensor_gb = 1000;
    const Trained batched = Train(model, batch, 1);
    EXPECT_TRUE(SameBits(kept.params, batched.params)) << model;
    EXPECT_LT(freed.last_step_peak * 3, batched.last_step_peak * 2)
        << model << ": freeing at once should need well under the memory of freeing at the end";
  }
  cpu_threads::SetBudget(1);
}

TEST(CpuAllocator, SteadyStepsTakeNoMemoryFromTheSystemAndADropGivesItBack) {
  gflags::FlagSaver saver;
  models::ModelConfig cfg;
  cfg.name = "mlp";
  cfg.seed = 5;
  cfg.batch_size = 32;
  models::TrainableModel m = models::BuildModel(cfg);
  ExecutionStrategy s;
  s.num_iteration_per_drop_scope = 6;
  Executor exe(CPUPlace(), s);
  exe.Run(*m.startup);
  FeedMap feed;
  m.next_batch(cfg.batch_size, &feed);
  for (int step = 0; step < 2; ++step) exe.Run(*m.main, feed);
  const AllocatorStats warm = CpuAllocatorStats();
  for (int step = 2; step < 5; ++step) exe.Run(*m.main, feed);
  const AllocatorStats steady = CpuAllocatorStats();
  EXPECT_GT(steady.allocs, warm.allocs) << "eager deletion frees and reallocates temporaries";
  EXPECT_EQ(steady.device_mallocs, warm.device_mallocs) << "a steady step took new segments";
  exe.Run(*m.main, feed);  // the 6th run drops the scope
  const AllocatorStats dropped = CpuAllocatorStats();
  EXPECT_GT(dropped.device_frees, steady.device_frees);
  EXPECT_LT(dropped.reserved_bytes, steady.reserved_bytes);

  // --cpu_allocator=system: tensors bypass the cache.
  FLAGS_cpu_allocator = "system";
  exe.Run(*m.main, feed);
  EXPECT_EQ(CpuAllocatorStats().allocs, dropped.allocs);
  FLAGS_cpu_allocator = "pool";
  const std::string e = ErrorOf([&] { exe.Run(*m.main, feed); });
  EXPECT_NE(e.find("--cpu_allocator=pool: expected caching or system"), std::string::npos) << e;
}

}  // namespace
}  // namespace keel
