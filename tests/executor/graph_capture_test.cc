// CUDA graphs, the parts that need no GPU: when a step is captured and replayed
// (GraphCapturePolicy), the feed signature it keys on, which programs cannot be captured, and the
// refusal of use_cuda_graph on a CPU place. The captured steps themselves are GPU tests
// (tests/gpu/cuda_graph_test.cc).
#include "executor/graph_capture.h"

#include <gtest/gtest.h>

#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;
using Action = GraphCapturePolicy::Action;

std::vector<Action> Steps(GraphCapturePolicy& p, const std::vector<std::string>& keys,
                          std::vector<bool>* drops = nullptr) {
  std::vector<Action> out;
  for (auto& k : keys) {
    bool drop = false;
    Action a = p.Next(k, &drop);
    if (a == Action::kCapture) p.Captured();
    out.push_back(a);
    if (drops) drops->push_back(drop);
  }
  return out;
}

TEST(GraphCapturePolicy, WarmsUpTwiceThenCapturesOnceAndReplays) {
  GraphCapturePolicy p;
  EXPECT_EQ(Steps(p, {"a", "a", "a", "a", "a"}),
            (std::vector<Action>{Action::kPlain, Action::kPlain, Action::kCapture, Action::kReplay,
                                 Action::kReplay}));
}

TEST(GraphCapturePolicy, ANewFeedSignatureDropsTheGraphAndWarmsUpAgain) {
  GraphCapturePolicy p;
  std::vector<bool> drops;
  auto got = Steps(p, {"a", "a", "a", "b", "b", "b", "b", "a"}, &drops);
  EXPECT_EQ(got, (std::vector<Action>{Action::kPlain, Action::kPlain, Action::kCapture,
                                      Action::kPlain, Action::kPlain, Action::kCapture,
                                      Action::kReplay, Action::kPlain}));
  EXPECT_EQ(drops, (std::vector<bool>{false, false, false, true, false, false, false, true}));
}

TEST(GraphCapturePolicy, AWarmUpInterruptedByAnotherSignatureStartsOver) {
  GraphCapturePolicy p;
  EXPECT_EQ(Steps(p, {"a", "a", "b", "a", "a", "a"}),
            (std::vector<Action>{Action::kPlain, Action::kPlain, Action::kPlain, Action::kPlain,
                                 Action::kPlain, Action::kCapture}));
}

TEST(GraphCapturePolicy, ResetAfterAScopeDropCapturesAgain) {
  GraphCapturePolicy p;
  Steps(p, {"a", "a", "a"});
  EXPECT_TRUE(p.captured());
  p.Reset();
  EXPECT_FALSE(p.captured());
  EXPECT_EQ(Steps(p, {"a", "a", "a"}),
            (std::vector<Action>{Action::kPlain, Action::kPlain, Action::kCapture}));
}

TEST(FeedSignature, TellsShapesDtypesAndPlacesApart) {
  auto sig = [](const Tensor& x) {
    return FeedSignature({{"x", x}, {"y", Tensor(DType::kInt64, {4, 1})}});
  };
  const std::string base = sig(Tensor(DType::kFloat32, {4, 8}));
  EXPECT_EQ(sig(Tensor(DType::kFloat32, {4, 8})), base);
  EXPECT_NE(sig(Tensor(DType::kFloat32, {2, 8})), base);
  EXPECT_NE(sig(Tensor(DType::kFloat64, {4, 8})), base);
  EXPECT_NE(FeedSignature({{"x", Tensor(DType::kFloat32, {4, 8})}}), base);  // y missing
}

struct Mlp {
  Program main, startup;
  Var loss;
  explicit Mlp(bool with_dropout) {
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, 8});
    Var h = layers::fc(x, 16, "relu");
    if (with_dropout) h = layers::dropout(h, 0.3f);
    loss = layers::mean(layers::fc(h, 1));
    optimizer::SGD(0.1f).minimize(loss, &startup);
  }
};

TEST(GraphCaptureBlocker, ATrainingProgramWithDropoutCanBeCaptured) {
  Mlp m(true);
  EXPECT_EQ(GraphCaptureBlocker(m.main), "");
}

TEST(GraphCaptureBlocker, NamesTheOpThatCannotBeCaptured) {
  Mlp m(false);
  // The startup program draws its parameters on the host: never captured (it runs once).
  EXPECT_NE(GraphCaptureBlocker(m.startup).find("uniform_random draws its random numbers on the "
                                                "host"),
            std::string::npos)
      << GraphCaptureBlocker(m.startup);
  Block& b = m.main.global_block();
  VarDesc* flag = b.Var("flag");
  flag->set_dtype(DType::kBool);
  flag->set_shape({1});
  m.main.AppendBlock(0);
  AppendOp(b, "conditional_block", {{"Cond", {"flag"}}}, {}, {{"sub_block", BlockRef{1}}});
  const std::string why = GraphCaptureBlocker(m.main);
  EXPECT_NE(why.find("op #" + std::to_string(b.num_ops() - 1) +
                     " conditional_block runs a "
                     "sub-block"),
            std::string::npos)
      << why;
}

TEST(ExecutorCudaGraph, IsRefusedOnACpuPlaceBeforeAnyOpRuns) {
  Mlp m(false);
  ExecutionStrategy s;
  s.use_cuda_graph = true;
  Executor exe(CPUPlace(), s);
  const std::string e = ErrorOf([&] { exe.Run(m.startup); });
  EXPECT_NE(e.find("ExecutionStrategy::use_cuda_graph (keel train --cuda_graph) needs a CUDA "
                   "place; this executor runs on CPUPlace"),
            std::string::npos)
      << e;
  EXPECT_EQ(exe.RunCount(m.startup), 0);
  for (VarDesc* v : m.main.global_block().AllVars()) {
    if (v->is_parameter()) {
      const Variable* var = exe.scope().FindVar(v->name());
      EXPECT_TRUE(var == nullptr || !var->tensor().initialized())
          << v->name() << ": the startup ran";
    }
  }
  // Attached to the program (fleet's exec_strategy) it is refused the same way.
  AttachExecutionStrategy(m.main, s);
  Executor plain;
  plain.Run(m.startup);
  EXPECT_NE(ErrorOf([&] {
              plain.Run(m.main, {{"x", Tensor(DType::kFloat32, {2, 8})}});
            }).find("needs a CUDA place"),
            std::string::npos);
}

}  // namespace
}  // namespace keel
