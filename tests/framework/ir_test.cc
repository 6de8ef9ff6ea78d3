// The program IR: deterministic text, binary round trip, fingerprints, golden programs.
#include <gtest/gtest.h>

#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/ir/program.h"
#include "tests/util/golden.h"

namespace keel {
namespace {

// The seed MLP at toy width, so its golden text stays readable.
void BuildSmallMlp(Program& main, Program& startup, bool train) {
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 4}, DType::kFloat32);
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 3, "tanh");
  Var pred = layers::fc(h, 2, "softmax");
  Var cost = layers::mean(layers::cross_entropy(pred, y));
  if (train) optimizer::SGD(0.1f).minimize(cost, &startup);
}

TEST(ProgramText, SmallMlpForwardMatchesGolden) {
  Program main, startup;
  BuildSmallMlp(main, startup, false);
  testing::ExpectGolden(main.ToText(), "mlp_small_forward.txt");
  testing::ExpectGolden(startup.ToText(), "mlp_small_startup_forward.txt");
}

TEST(ProgramText, SmallMlpWithBackwardAndSgdMatchesGolden) {
  Program main, startup;
  BuildSmallMlp(main, startup, true);
  testing::ExpectGolden(main.ToText(), "mlp_small_train.txt");
  testing::ExpectGolden(startup.ToText(), "mlp_small_startup.txt");
}

TEST(ProgramText, IsDeterministicAcrossBuilds) {
  Program a, sa, b, sb;
  BuildSmallMlp(a, sa, true);
  BuildSmallMlp(b, sb, true);
  EXPECT_EQ(a.ToText(), b.ToText());
  EXPECT_EQ(a.Fingerprint(), b.Fingerprint());
}

TEST(ProgramSerialization, BinaryRoundTripKeepsTextAndFingerprint) {
  Program main, startup;
  BuildSmallMlp(main, startup, true);
  main.set_random_seed(42);
  auto back = Program::ParseFromString(main.SerializeToString());
  EXPECT_EQ(back->ToText(), main.ToText());
  EXPECT_EQ(back->Fingerprint(), main.Fingerprint());
  EXPECT_EQ(back->random_seed(), 42);
  auto clone = main.Clone();
  EXPECT_EQ(clone->ToText(), main.ToText());
}

TEST(ProgramSerialization, EveryAttributeTypeRoundTrips) {
  Program p;
  OpDesc* op = p.global_block().AppendOp("any_op");
  op->SetAttr("i", 7);
  op->SetAttr("f", 0.25f);
  op->SetAttr("s", std::string("text"));
  op->SetAttr("b", true);
  op->SetAttr("ints", std::vector<int>{1, -2});
  op->SetAttr("floats", std::vector<float>{0.5f, 1.5f});
  op->SetAttr("strings", std::vector<std::string>{"a", "b"});
  op->SetAttr("bools", std::vector<bool>{true, false});
  op->SetAttr("l", int64_t{1} << 40);
  op->SetAttr("longs", std::vector<int64_t>{int64_t{1} << 40, -1});
  op->SetAttr("blk", BlockRef{0});
  op->SetAttr("d", 1e-300);
  auto back = Program::ParseFromString(p.SerializeToString());
  const OpDesc* b = back->global_block().op(0);
  EXPECT_EQ(b->attrs().size(), 12u);
  for (auto& [name, value] : op->attrs()) EXPECT_TRUE(b->GetAttr(name) == value) << name;
  EXPECT_EQ(b->Attr<int64_t>("l"), int64_t{1} << 40);
}

TEST(ProgramSerialization, GarbageIsAClearError) {
  try {
    Program::ParseFromString("\xff\xff\xff garbage", "model/__model__");
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model/__model__"), std::string::npos) << e.what();
  }
}

TEST(ProgramFingerprint, ChangesWithAnAttributeOrShape) {
  Program a, sa;
  BuildSmallMlp(a, sa, false);
  uint64_t fp = a.Fingerprint();
  a.global_block().op(0)->SetAttr("x_num_col_dims", 1);  // same value: same fingerprint
  EXPECT_EQ(a.Fingerprint(), fp);
  a.global_block().op(0)->SetAttr("x_num_col_dims", 2);
  EXPECT_NE(a.Fingerprint(), fp);
  a.global_block().op(0)->SetAttr("x_num_col_dims", 1);
  a.global_block().FindVar("x")->set_shape({-1, 5});
  EXPECT_NE(a.Fingerprint(), fp);
}

TEST(Block, InsertRemoveAndVersion) {
  Program p;
  uint64_t v0 = p.version();
  Block& b = p.global_block();
  b.AppendOp("a");
  b.AppendOp("c");
  b.InsertOp(1, "b");
  EXPECT_GT(p.version(), v0);
  ASSERT_EQ(b.num_ops(), 3u);
  EXPECT_EQ(b.op(1)->type(), "b");
  b.RemoveOp(0);
  EXPECT_EQ(b.op(0)->type(), "b");
  EXPECT_EQ(p.UniqueName("fc"), "fc_0");
  EXPECT_EQ(p.UniqueName("fc"), "fc_1");
}

}  // namespace
}  // namespace keel

namespace keel {
namespace {

TEST(CloneForTest, DropsBackwardAndOptimizerOpsAndTheirVars) {
  Program main, startup;
  BuildSmallMlp(main, startup, true);
  main.global_block().op(0)->SetAttr("is_test", false);  // stands in for batch_norm/dropout
  auto test = main.clone_for_test();
  for (auto& op : test->global_block().ops()) {
    EXPECT_EQ(op->Attr<int>(kOpRoleAttr), 0) << op->type();
    EXPECT_EQ(op->type().find("_grad"), std::string::npos);
  }
  EXPECT_EQ(test->global_block().num_ops(), 8u);  // the forward ops
  EXPECT_TRUE(test->global_block().op(0)->Attr<bool>("is_test"));
  EXPECT_FALSE(main.global_block().op(0)->Attr<bool>("is_test"));  // the original is unchanged
  EXPECT_EQ(test->global_block().FindVar("fc_0.w_0@GRAD"), nullptr);
  EXPECT_NE(test->global_block().FindVar("fc_0.w_0"), nullptr);
}

}  // namespace
}  // namespace keel
