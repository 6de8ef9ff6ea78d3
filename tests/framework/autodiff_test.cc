// append_backward: structure (sum insertion, stop_gradient, no-grad sets) and, end to end, the
// gradient of a whole MLP against finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "executor/executor.h"
#include "framework/autodiff/backward.h"
#include "framework/dsl/layers.h"
#include "tests/util/grad_checker.h"

namespace keel {
namespace {

int CountOps(const Program& p, const std::string& type) {
  int n = 0;
  for (auto& op : p.global_block().ops()) n += op->type() == type;
  return n;
}

TEST(AppendBackward, VarFeedingTwoOpsGetsItsGradientsSummed) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var x = layers::data("x", {-1, 3}, DType::kFloat64);
  Var h = layers::fc(x, 3, "tanh");
  Var a = layers::scale(h, 2.0f);
  Var b = layers::sigmoid(h);
  Var loss = layers::mean(layers::elementwise_add(a, b));
  auto pg = append_backward(main, loss.name());
  ASSERT_EQ(pg.size(), 2u);
  EXPECT_EQ(pg[0].first, "fc_0.w_0");
  EXPECT_EQ(pg[0].second, "fc_0.w_0@GRAD");
  EXPECT_EQ(CountOps(main, "sum"), 1);
  const Block& blk = main.global_block();
  // The sum writes h@GRAD from two renamed parts, before tanh_grad reads it.
  int sum_at = -1, tanh_grad_at = -1;
  for (size_t i = 0; i < blk.num_ops(); ++i) {
    if (blk.op(i)->type() == "sum") {
      sum_at = static_cast<int>(i);
      EXPECT_EQ(blk.op(i)->Output("Out")[0], GradVarName(h.name()));
      EXPECT_EQ(blk.op(i)->Input("X").size(), 2u);
    }
    if (blk.op(i)->type() == "tanh_grad") tanh_grad_at = static_cast<int>(i);
  }
  EXPECT_LT(sum_at, tanh_grad_at);
}

TEST(AppendBackward, SameVarTwiceInOneOp) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var x = layers::data("x", {-1, 2}, DType::kFloat64);
  Var h = layers::fc(x, 2);
  Var loss = layers::mean(layers::sums({h, h}));
  append_backward(main, loss.name());
  EXPECT_EQ(CountOps(main, "sum"), 2);  // the forward sum and the gradient accumulation
}

TEST(AppendBackward, StopGradientAndNoGradSetBlockGradients) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var x = layers::data("x", {-1, 3}, DType::kFloat32);
  Var h1 = layers::fc(x, 4, "relu");
  ParamAttr frozen("frozen.w", nullptr, /*trainable=*/false);
  Var h2 = layers::fc(h1, 2, "", 1, frozen);
  Var loss = layers::mean(h2);
  auto pg = append_backward(main, loss.name(), {"fc_0.b_0"});
  std::set<std::string> params;
  for (auto& p : pg) params.insert(p.first);
  EXPECT_TRUE(params.count("fc_0.w_0"));
  EXPECT_FALSE(params.count("frozen.w"));  // not trainable
  EXPECT_FALSE(params.count("fc_0.b_0"));  // in no_grad_set
  EXPECT_TRUE(params.count("fc_1.b_0"));
  EXPECT_EQ(main.global_block().FindVar("x@GRAD"), nullptr);  // data is stop_gradient
}

TEST(AppendBackward, TagsTheLastWriterOfEachParamGrad) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var x = layers::data("x", {-1, 3}, DType::kFloat32);
  Var loss = layers::mean(layers::fc(x, 2));
  append_backward(main, loss.name());
  int tagged = 0;
  for (auto& op : main.global_block().ops())
    if (op->HasAttr(kOpRoleVarAttr)) {
      ++tagged;
      EXPECT_EQ(op->Attr<int>(kOpRoleAttr), static_cast<int>(OpRole::kBackward));
    }
  EXPECT_EQ(tagged, 2);  // mul_grad for w, elementwise_add_grad for b
}

TEST(AppendBackward, BadLossesAreClearErrors) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var x = layers::data("x", {-1, 3}, DType::kFloat32);
  Var h = layers::fc(x, 2);
  EXPECT_THROW(append_backward(main, h.name()), Error);  // not one element
  EXPECT_THROW(append_backward(main, "nope"), Error);
  Var c = layers::mean(x);  // depends on no parameter
  try {
    append_backward(main, c.name());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trainable parameter"), std::string::npos) << e.what();
  }
}

// d(loss)/d(every parameter) of a float64 MLP against central differences.
TEST(AppendBackward, WholeMlpGradientMatchesFiniteDifferences) {
  Program main, startup;
  startup.set_random_seed(3);
  std::vector<ParamGrad> pg;
  Var loss;
  {
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, 5}, DType::kFloat64);
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    Var h1 = layers::fc(x, 4, "tanh");
    Var h2 = layers::fc(h1, 4, "sigmoid");
    Var pred = layers::fc(h2, 3, "softmax");
    loss = layers::mean(layers::cross_entropy(pred, y));
    pg = append_backward(main, loss.name());
  }
  ASSERT_EQ(pg.size(), 6u);
  Executor exe;
  exe.Run(startup);
  FeedMap feed{{"x", testing::RandomTensor({6, 5}, DType::kFloat64, -1, 1, 11)},
               {"y", Tensor::FromVector<int64_t>({0, 1, 2, 2, 1, 0}, {6, 1})}};
  std::vector<std::string> fetch;
  for (auto& p : pg) fetch.push_back(p.second);
  auto grads = exe.Run(main, feed, fetch);
  const double eps = 1e-6;
  for (size_t k = 0; k < pg.size(); ++k) {
    Tensor* w = exe.scope().FindVar(pg[k].first)->mutable_tensor();
    for (int64_t i = 0; i < w->numel(); ++i) {
      double orig = w->data<double>()[i];
      w->data<double>()[i] = orig + eps;
      double lp = exe.Run(main, feed, {loss})[0].item<double>();
      w->data<double>()[i] = orig - eps;
      double lm = exe.Run(main, feed, {loss})[0].item<double>();
      w->data<double>()[i] = orig;
      double numeric = (lp - lm) / (2 * eps);
      EXPECT_NEAR(grads[k].data<double>()[i], numeric, 1e-7 + 1e-5 * std::abs(numeric))
          << pg[k].first << "[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace keel
