// Executor: feeds are checked, fetches are copies and always returned, drop-scope releases, and
// DistributedStrategy::exec_strategy reaches the executor running fleet::main_program().
#include "executor/executor.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "fleet/fleet.h"
#include "framework/autodiff/backward.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/op/op_registry.h"
#include "tests/util/op_test_util.h"
#include "tests/util/small_programs.h"

DECLARE_double(eager_delete_tensor_gb);

namespace keel {
namespace {

using testing::ErrorOf;

using Net = testing::TanhNet;

TEST(Executor, RunsAndFetchesCopies) {
  Net n;
  Executor exe;
  Tensor x = Tensor::FromVector<float>({0, 1, -1, 0.5f, 2, 3}, {2, 3});
  auto r = exe.Run(n.main, {{"x", x}}, {n.out});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].dims(), (DDim{2, 3}));
  EXPECT_FLOAT_EQ(r[0].data<float>()[1], 2.0f * std::tanh(1.0f) + 1.0f);
  float first = r[0].data<float>()[0];
  exe.Run(n.main, {{"x", Tensor::FromVector<float>({5, 5, 5}, {1, 3})}}, {n.out});
  EXPECT_EQ(r[0].data<float>()[0], first);  // the earlier result was a copy
}

// kTake hands back the variable's own tensor and empties the variable: the next run writes a
// fresh buffer, so the taken one keeps its values; a persistable is refused, naming it.
TEST(Executor, FetchModeTakeHandsBackTheVariablesOwnTensors) {
  Net n;
  Executor exe;
  Tensor x = Tensor::FromVector<float>({0, 1, -1, 0.5f, 2, 3}, {2, 3});
  auto r = exe.Run(n.main, {{"x", x}}, {n.out}, Executor::FetchMode::kTake);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FLOAT_EQ(r[0].data<float>()[1], 2.0f * std::tanh(1.0f) + 1.0f);
  const Variable* v = exe.local_scope().FindVar(n.out.name());
  ASSERT_NE(v, nullptr);
  EXPECT_FALSE(v->tensor().initialized());
  const float first = r[0].data<float>()[0];
  auto again = exe.Run(n.main, {{"x", Tensor::FromVector<float>({5, 5, 5, 5, 5, 5}, {2, 3})}},
                       {n.out}, Executor::FetchMode::kTake);
  EXPECT_EQ(r[0].data<float>()[0], first);
  EXPECT_NE(again[0].data<float>(), r[0].data<float>());

  Program main, startup;
  Var p;
  {
    ProgramGuard g(main, startup);
    p = layers::create_parameter({2}, DType::kFloat32, "l", "p", {}, initializer::Constant(1.0f));
    layers::scale(p, 2.0f);
  }
  exe.Run(startup);
  std::string e = ErrorOf([&] { exe.Run(main, {}, {p.name()}, Executor::FetchMode::kTake); });
  EXPECT_NE(e.find("'" + p.name() + "' is persistable"), std::string::npos) << e;
  EXPECT_TRUE(exe.scope().FindVar(p.name())->tensor().initialized());
}

// An identity op's output is its input's buffer where the executor allows it (each of the two vars
// written by one op of the program, neither persistable nor data), a copy where a second op also
// writes the output; backward, a residual add's input gradients are its output gradient's buffer.
// Taking (kTake) such an output also empties its input, whose buffer the caller now holds.
TEST(Executor, IdentityOpsShareTheirInputsBufferWhereEachVarHasOneWriter) {
  gflags::FlagSaver saver;
  FLAGS_eager_delete_tensor_gb = -1;  // keep the temporaries to look at
  const Tensor feed = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {1, 6});
  for (bool second_writer : {false, true}) {
    SCOPED_TRACE(second_writer ? "a second writer" : "one writer");
    Program main, startup;
    Var x, t, r, out;
    {
      ProgramGuard g(main, startup);
      x = layers::data("x", {-1, 6});
      t = layers::scale(x, 2.0f);
      r = layers::reshape(t, {-1, 3, 2});
      out = layers::scale(r, 3.0f);
    }
    if (second_writer) {
      OpDesc* op = main.global_block().AppendOp("reshape");
      op->SetInput("X", {x.name()});
      op->SetOutput("Out", {r.name()});
      op->SetAttr("shape", std::vector<int>{-1, 3, 2});
      InferShapeAtBuild(op, &main.global_block());
    }
    Executor exe;
    auto got = exe.Run(main, {{"x", feed}}, {out.name()});
    EXPECT_FLOAT_EQ(got[0].data<float>()[5], 36.0f);
    const Tensor& tt = exe.local_scope().FindVar(t.name())->tensor();
    const Tensor& rt = exe.local_scope().FindVar(r.name())->tensor();
    EXPECT_EQ(rt.dims(), (DDim{1, 3, 2}));
    EXPECT_EQ(tt.data<float>() == rt.data<float>(), !second_writer);
    if (second_writer) continue;
    auto taken = exe.Run(main, {{"x", feed}}, {r.name()}, Executor::FetchMode::kTake);
    EXPECT_FALSE(exe.local_scope().FindVar(t.name())->tensor().initialized());
    exe.Run(main, {{"x", Tensor::FromVector<float>({0, 0, 0, 0, 0, 0}, {1, 6})}});
    EXPECT_FLOAT_EQ(taken[0].data<float>()[5], 12.0f);  // the next run wrote elsewhere
  }

  // y = 1 * a + 1 * b (same shapes) -> mean: both input gradients of the add are y@GRAD's buffer.
  Program main, startup;
  {
    ProgramGuard g(main, startup);
    Var a = layers::create_parameter({2, 4}, DType::kFloat32, "l", "a", {},
                                     initializer::Constant(1.0f));
    Var b = layers::create_parameter({2, 4}, DType::kFloat32, "l", "b", {},
                                     initializer::Constant(1.0f));
    Var y = layers::elementwise_add(layers::scale(a, 1.0f), layers::scale(b, 1.0f));
    append_backward(main, layers::mean(y).name());
  }
  Executor exe;
  exe.Run(startup);
  exe.Run(main);
  const Block& blk = main.global_block();
  const OpDesc* add_grad = nullptr;
  for (const auto& op : blk.ops())
    if (op->type() == "elementwise_add_grad") add_grad = op.get();
  ASSERT_NE(add_grad, nullptr);
  auto data = [&](const std::string& slot, bool in) {
    const std::string& v = in ? add_grad->Input(slot)[0] : add_grad->Output(slot)[0];
    return exe.local_scope().FindVar(v)->tensor().data<float>();
  };
  EXPECT_EQ(data(GradVarName("X"), false), data(GradVarName("Out"), true));
  EXPECT_EQ(data(GradVarName("Y"), false), data(GradVarName("Out"), true));
  EXPECT_FLOAT_EQ(data(GradVarName("X"), false)[3], 0.125f);
}

TEST(Executor, WrongFeedShapeOrDtypeNamesTheVar) {
  Net n;
  Executor exe;
  std::string e = ErrorOf([&] { exe.Run(n.main, {{"x", Tensor(DType::kFloat32, {2, 4})}}); });
  EXPECT_NE(e.find("'x'"), std::string::npos) << e;
  EXPECT_NE(e.find("[2, 4]"), std::string::npos) << e;
  EXPECT_NE(e.find("[-1, 3]"), std::string::npos) << e;
  e = ErrorOf([&] { exe.Run(n.main, {{"x", Tensor(DType::kFloat64, {2, 3})}}); });
  EXPECT_NE(e.find("float64"), std::string::npos) << e;
  e = ErrorOf([&] { exe.Run(n.main, {{"nope", Tensor(DType::kFloat32, {1})}}); });
  EXPECT_NE(e.find("nope"), std::string::npos) << e;
}

TEST(Executor, UnfedInputNamesTheVarAndOp) {
  Net n;
  Executor exe;
  std::string e = ErrorOf([&] { exe.Run(n.main, {}, {n.out}); });
  EXPECT_NE(e.find("tanh"), std::string::npos) << e;
  EXPECT_NE(e.find("'x'"), std::string::npos) << e;
}

TEST(Executor, EveryFetchAskedForIsReturned) {
  // The seed's loop reads out[0] every step, on the training program and its evaluation clone.
  Net n;
  Executor exe;
  Tensor x(DType::kFloat32, {1, 3});
  for (int i = 0; i < 7; ++i) ASSERT_EQ(exe.Run(n.main, {{"x", x}}, {n.out}).size(), 1u) << i;
  EXPECT_TRUE(exe.Run(n.main, {{"x", x}}).empty());
  EXPECT_EQ(exe.RunCount(n.main), 8);
  std::string e = ErrorOf([&] { exe.Run(n.main, {{"x", x}}, {"nope"}); });
  EXPECT_NE(e.find("fetch 'nope'"), std::string::npos) << e;
  EXPECT_EQ(exe.RunCount(n.main), 8);  // refused before running
}

TEST(Executor, ExecStrategyOfTheDistributedStrategyReachesTheExecutorOfMainProgram) {
  Program main, startup;
  Var loss;
  {
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, 3});
    loss = layers::mean(layers::fc(x, 2));
    fleet::init();
    fleet::DistributedStrategy strategy;
    strategy.exec_strategy.num_threads = 3;
    strategy.exec_strategy.num_iteration_per_drop_scope = 1;
    fleet::distributed_optimizer(optimizer::SGD(0.1f), strategy).minimize(loss, &startup);
  }
  Executor exe(fleet::worker_place());  // the seed's executor: default strategy
  exe.Run(startup);
  EXPECT_EQ(exe.StrategyFor(fleet::main_program()).num_threads, 3);
  EXPECT_EQ(exe.WorkersFor(fleet::main_program()), 3);
  exe.Run(fleet::main_program(), {{"x", Tensor::FromVector<float>({1, 2, 3}, {1, 3})}});
  Variable* tmp = exe.local_scope().FindLocalVar("fc_0.tmp_0");
  ASSERT_NE(tmp, nullptr);
  EXPECT_FALSE(tmp->tensor().initialized());                              // dropped after every run
  EXPECT_EQ(exe.StrategyFor(startup).num_iteration_per_drop_scope, 100);  // startup: the executor's
}

TEST(Executor, DropScopeReleasesTemporariesButKeepsParameters) {
  gflags::FlagSaver saver;
  FLAGS_eager_delete_tensor_gb = -1;  // else the temporaries are freed within each run
  Program main, startup;
  Var loss;
  {
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, 3});
    loss = layers::mean(layers::fc(x, 2));
    optimizer::SGD(0.1f).minimize(loss, &startup);
  }
  ExecutionStrategy s;
  s.num_iteration_per_drop_scope = 2;
  Executor exe(CPUPlace(), s);
  exe.Run(startup);
  Tensor x = Tensor::FromVector<float>({1, 2, 3}, {1, 3});
  exe.Run(main, {{"x", x}});
  Variable* tmp = exe.local_scope().FindLocalVar("fc_0.tmp_0");
  ASSERT_NE(tmp, nullptr);
  EXPECT_TRUE(tmp->tensor().initialized());
  exe.Run(main, {{"x", x}});  // second run: dropped
  EXPECT_FALSE(tmp->tensor().initialized());
  EXPECT_TRUE(exe.scope().FindVar("fc_0.w_0")->tensor().initialized());
  auto r = exe.Run(main, {{"x", x}}, {loss});  // and it runs on after the drop
  EXPECT_EQ(r.size(), 1u);
}

TEST(Executor, RebuildsItsPlanWhenTheProgramChanges) {
  Net n;
  Executor exe;
  Tensor x = Tensor::FromVector<float>({0, 0, 0}, {1, 3});
  EXPECT_FLOAT_EQ(exe.Run(n.main, {{"x", x}}, {n.out})[0].data<float>()[0], 1.0f);
  {
    ProgramGuard g(n.main, n.startup);
    n.out = layers::scale(n.out, 10.0f);
  }
  EXPECT_FLOAT_EQ(exe.Run(n.main, {{"x", x}}, {n.out})[0].data<float>()[0], 10.0f);
}

TEST(Executor, SameProgramSeedGivesSameInitialization) {
  auto init = [](int64_t seed) {
    Program main, startup;
    startup.set_random_seed(seed);
    {
      ProgramGuard g(main, startup);
      layers::fc(layers::data("x", {-1, 8}), 8);
    }
    Executor exe;
    exe.Run(startup);
    return exe.scope().FindVar("fc_0.w_0")->tensor().Clone();
  };
  Tensor a = init(5), b = init(5), c = init(6);
  EXPECT_EQ(0, std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()));
  EXPECT_NE(0, std::memcmp(a.raw_data(), c.raw_data(), a.nbytes()));
}

}  // namespace
}  // namespace keel
