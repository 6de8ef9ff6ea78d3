// The DSL checks shapes where the user writes the layer, with messages that name op, vars, shapes.
#include <gtest/gtest.h>

#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;

bool Has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

TEST(Layers, FcNamesParamsAndInfersShapes) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var x = layers::data("x", {-1, 32});
  Var h = layers::fc(x, 1280, "tanh");
  EXPECT_EQ(h.shape(), (DDim{-1, 1280}));
  ASSERT_NE(main.global_block().FindVar("fc_0.w_0"), nullptr);
  EXPECT_EQ(main.global_block().FindVar("fc_0.w_0")->dims(), (DDim{32, 1280}));
  EXPECT_TRUE(main.global_block().FindVar("fc_0.w_0")->is_parameter());
  EXPECT_EQ(main.global_block().FindVar("fc_0.b_0")->dims(), (DDim{1280}));
  // The startup program declares and initializes both: Xavier uniform and zeros.
  ASSERT_EQ(startup.global_block().num_ops(), 2u);
  EXPECT_EQ(startup.global_block().op(0)->type(), "uniform_random");
  EXPECT_EQ(startup.global_block().op(1)->type(), "fill_constant");
  Var h3 = layers::fc(layers::data("img", {-1, 2, 3, 4}), 5, "", 2);
  EXPECT_EQ(h3.shape(), (DDim{-1, 2, 5}));
}

TEST(Layers, FcWithWrongInputRankNamesTheVarAndShape) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var v = layers::data("v", {32});
  std::string e = ErrorOf([&] { layers::fc(v, 10); });
  EXPECT_TRUE(Has(e, "layers::fc(v)") && Has(e, "[32]")) << e;
  EXPECT_TRUE(Has(e, "rank")) << e;
}

TEST(Layers, ShapeMismatchFailsAtTheLayerWithBothShapes) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var a = layers::data("a", {-1, 4});
  Var b = layers::data("b", {-1, 5});
  size_t ops_before = main.global_block().num_ops();
  std::string e = ErrorOf([&] { layers::elementwise_add(a, b); });
  EXPECT_TRUE(Has(e, "elementwise_add")) << e;
  EXPECT_TRUE(Has(e, "[-1, 4]") && Has(e, "[-1, 5]")) << e;
  EXPECT_EQ(main.global_block().num_ops(), ops_before);  // nothing appended
  Var w = layers::data("w", {3, 7});
  e = ErrorOf([&] { layers::mul(a, w); });
  EXPECT_TRUE(Has(e, "mul") && Has(e, "a") && Has(e, "w")) << e;
}

TEST(Layers, CrossEntropyRefusesInt32Labels) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var x = layers::data("x", {-1, 32});
  Var pred = layers::fc(x, 2, "softmax");
  Var y = layers::data("y", {-1, 1}, DType::kInt32);
  std::string e = ErrorOf([&] { layers::cross_entropy(pred, y); });
  EXPECT_TRUE(Has(e, "cross_entropy") && Has(e, "int64")) << e;
}

TEST(Layers, UnknownActivationAndBadSizes) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var x = layers::data("x", {-1, 3});
  EXPECT_TRUE(Has(ErrorOf([&] { layers::fc(x, 2, "swishy"); }), "swishy"));
  EXPECT_TRUE(Has(ErrorOf([&] { layers::fc(x, 0); }), "size"));
  EXPECT_TRUE(Has(ErrorOf([&] { layers::data("x", {-1, 3}); }), "already exists"));
}

TEST(Optimizer, SgdAppendsOneUpdatePerParameterAndALearningRate) {
  Program main, startup;
  ProgramGuard g(main, startup);
  Var x = layers::data("x", {-1, 3});
  Var loss = layers::mean(layers::fc(layers::fc(x, 4, "relu"), 2));
  auto pg = optimizer::SGD(0.5f).minimize(loss, &startup);
  EXPECT_EQ(pg.size(), 4u);
  int sgd = 0;
  for (auto& op : main.global_block().ops()) sgd += op->type() == "sgd";
  EXPECT_EQ(sgd, 4);
  VarDesc* lr = startup.global_block().FindVar("learning_rate_0");
  ASSERT_NE(lr, nullptr);
  EXPECT_TRUE(lr->persistable());
}

}  // namespace
}  // namespace keel
