// AmpPass (mixed precision O1 as a forward rewrite) and amp::decorate: the rewritten programs
// (goldens), Paddle's classification rules op by op, one cast per weight, the float32 fallback
// for an op without a low-precision kernel, and refusals naming what is wrong.
#include "transpiler/amp_pass.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "framework/dsl/amp.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/dsl/tensor_layers.h"
#include "framework/op/op_registry.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;
using testing::ExpectErrorContainsAll;

// x[-1, 4] -> fc(3, relu) -> fc(2) -> softmax_with_cross_entropy(label) -> mean: forward only.
Var BuildMlpForward(Program& main, Program& startup) {
  ProgramGuard guard(main, startup);
  main.set_random_seed(1);
  Var x = layers::data("x", {-1, 4});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 3, "relu");
  Var logits = layers::fc(h, 2);
  return layers::mean(layers::softmax_with_cross_entropy(logits, y));
}

transpiler::AmpOptions ListsOnly(DType dtype = DType::kBFloat16) {
  transpiler::AmpOptions o;
  o.dtype = dtype;
  o.check_kernels = false;
  return o;
}

std::map<std::string, int> CountOps(const Program& p) {
  std::map<std::string, int> n;
  for (const auto& op : p.global_block().ops()) ++n[op->type()];
  return n;
}

const OpDesc* FirstOp(const Program& p, const std::string& type) {
  for (const auto& op : p.global_block().ops())
    if (op->type() == type) return op.get();
  return nullptr;
}

DType DTypeOfVar(const Program& p, const std::string& name) {
  return p.global_block().MustFindVar(name)->dtype();
}

TEST(AmpPass, MlpForwardO1Bf16MatchesGolden) {
  Program main, startup;
  BuildMlpForward(main, startup);
  const std::string startup_before = startup.ToText();
  transpiler::AmpPass(ListsOnly()).Apply(main, startup);
  testing::ExpectGolden(main.ToText(), "amp_o1_bf16_mlp_forward.txt");
  EXPECT_EQ(startup.ToText(), startup_before) << "O1 leaves startup (float32 parameters) alone";
  // mul runs in bfloat16; relu and the bias adds follow it; the loss's softmax in float32.
  const OpDesc* mul = FirstOp(main, "mul");
  ASSERT_NE(mul, nullptr);
  EXPECT_EQ(DTypeOfVar(main, mul->Input("X")[0]), DType::kBFloat16);
  EXPECT_EQ(DTypeOfVar(main, mul->Input("Y")[0]), DType::kBFloat16);
  EXPECT_EQ(DTypeOfVar(main, mul->Output("Out")[0]), DType::kBFloat16);
  EXPECT_EQ(DTypeOfVar(main, FirstOp(main, "relu")->Output("Out")[0]), DType::kBFloat16);
  const OpDesc* swce = FirstOp(main, "softmax_with_cross_entropy");
  EXPECT_EQ(DTypeOfVar(main, swce->Input("Logits")[0]), DType::kFloat32);
  EXPECT_EQ(DTypeOfVar(main, FirstOp(main, "mean")->Output("Out")[0]), DType::kFloat32);
}

TEST(AmpPass, Float16UsesItsOwnSuffix) {
  Program main, startup;
  BuildMlpForward(main, startup);
  transpiler::AmpPass(ListsOnly(DType::kFloat16)).Apply(main, startup);
  EXPECT_NE(main.ToText().find(".cast_fp16"), std::string::npos);
  EXPECT_EQ(main.ToText().find(".cast_bf16"), std::string::npos);
}

// Two mul ops read one weight: one cast op makes its bfloat16 copy, both read it.
TEST(AmpPass, AWeightReadTwiceIsCastOnce) {
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    Var x = layers::data("x", {-1, 4});
    Var w = layers::create_parameter({4, 4}, DType::kFloat32, "shared", "w_0", ParamAttr("w"),
                                     initializer::Constant(0.5f));
    Var a = layers::matmul(x, w);
    Var b = layers::matmul(layers::relu(a), w);
    layers::mean(b);
  }
  transpiler::AmpPass(ListsOnly()).Apply(main, startup);
  int casts_of_w = 0;
  for (const auto& op : main.global_block().ops())
    if (op->type() == "cast" && op->Input("X")[0] == "w") ++casts_of_w;
  EXPECT_EQ(casts_of_w, 1) << main.ToText();
  for (const auto& op : main.global_block().ops()) {
    if (op->type() == "matmul") {
      EXPECT_EQ(op->Input("Y")[0], "w.cast_bf16");
    }
  }
}

// A gray op fed only by parameters and data is left as it is; fed by a black op it stays
// float32 even when a white op also feeds it.
TEST(AmpPass, GrayOpsFollowTheirProducers) {
  Program main, startup;
  Var loss;
  {
    ProgramGuard guard(main, startup);
    Var x = layers::data("x", {-1, 4});
    Var s = layers::scale(x, 2.0f);  // gray, from data: untouched
    Var w = layers::create_parameter({4, 4}, DType::kFloat32, "l", "w_0", ParamAttr("w"),
                                     initializer::Constant(0.5f));
    Var m = layers::matmul(s, w);              // white
    Var sm = layers::softmax(x);               // black
    Var add = layers::elementwise_add(m, sm);  // gray: white and black inputs -> black
    loss = layers::mean(add);
  }
  transpiler::AmpPass(ListsOnly()).Apply(main, startup);
  EXPECT_EQ(DTypeOfVar(main, FirstOp(main, "scale")->Output("Out")[0]), DType::kFloat32);
  const OpDesc* add = FirstOp(main, "elementwise_add");
  EXPECT_EQ(DTypeOfVar(main, add->Input("X")[0]), DType::kFloat32) << main.ToText();
  EXPECT_EQ(DTypeOfVar(main, add->Output("Out")[0]), DType::kFloat32);
}

TEST(AmpPass, CustomListsOverrideTheBuiltInOnes) {
  Program main, startup;
  BuildMlpForward(main, startup);
  transpiler::AmpOptions o = ListsOnly();
  o.black_list = {"mul"};
  transpiler::AmpPass(o).Apply(main, startup);
  EXPECT_EQ(CountOps(main)["cast"], 0) << "no white op is left: nothing runs in bfloat16\n"
                                       << main.ToText();
}

// With kernels checked, an op without a bfloat16 kernel (here accuracy, put on the white list)
// stays float32 instead of failing in the middle of training.
TEST(AmpPass, AnOpWithoutALowPrecisionKernelStaysFloat32) {
  ASSERT_FALSE(OpRegistry::HasKernel("accuracy", Place::Kind::kCPU, DType::kBFloat16));
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    Var x = layers::data("x", {-1, 4});
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    Var p = layers::softmax(x);
    layers::accuracy(p, y);
  }
  transpiler::AmpOptions o;
  o.white_list = {"accuracy"};
  transpiler::AmpPass(o).Apply(main, startup);
  EXPECT_EQ(CountOps(main)["cast"], 0) << main.ToText();
  // Listed but without the check, the rewrite follows the list.
  Program main2, startup2;
  {
    ProgramGuard guard(main2, startup2);
    Var x = layers::data("x", {-1, 4});
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    layers::accuracy(layers::softmax(x), y);
  }
  o.check_kernels = false;
  transpiler::AmpPass(o).Apply(main2, startup2);
  EXPECT_GT(CountOps(main2)["cast"], 0) << main2.ToText();
}

TEST(AmpPass, RefusalsNameWhatIsWrong) {
  transpiler::AmpOptions both = ListsOnly();
  both.white_list = {"relu"};
  both.black_list = {"relu"};
  ExpectErrorContainsAll(ErrorOf([&] { transpiler::AmpPass p(both); }),
                         {"relu", "custom_white_list", "custom_black_list"});
  transpiler::AmpOptions unknown = ListsOnly();
  unknown.white_list = {"no_such_op"};
  ExpectErrorContainsAll(ErrorOf([&] { transpiler::AmpPass p(unknown); }), {"no_such_op"});
  transpiler::AmpOptions f64 = ListsOnly(DType::kFloat64);
  ExpectErrorContainsAll(ErrorOf([&] { transpiler::AmpPass p(f64); }), {"float64"});
  // After backward: the pass must come first.
  Program main, startup;
  Var loss = BuildMlpForward(main, startup);
  {
    ProgramGuard guard(main, startup);
    optimizer::SGD(0.1f).minimize(loss);
  }
  ExpectErrorContainsAll(ErrorOf([&] { transpiler::AmpPass(ListsOnly()).Apply(main, startup); }),
                         {"amp", "backward"});
}

// amp::decorate with float16 (loss scaling on by default): scaled loss, backward, unscale and
// overflow check, the scale's update, updates that skip an overflowed step.
TEST(AmpDecorate, Fp16SgdProgramMatchesGolden) {
  Program main, startup;
  Var loss = BuildMlpForward(main, startup);
  amp::AmpConfig c;
  c.dtype = DType::kFloat16;
  c.check_kernels = false;
  {
    ProgramGuard guard(main, startup);
    auto opt = amp::decorate(optimizer::SGD(0.1f), c);
    opt.minimize(loss);
    EXPECT_EQ(opt.loss_scaling_var(), "loss_scaling_0");
    EXPECT_EQ(opt.found_inf_var(), "find_infinite_0");
  }
  testing::ExpectGolden(main.ToText(), "amp_o1_fp16_mlp_train.txt");
  testing::ExpectGolden(startup.ToText(), "amp_o1_fp16_mlp_startup.txt");
  for (const auto& op : main.global_block().ops()) {
    if (op->type() == "sgd") {
      EXPECT_EQ(op->Input("SkipUpdate")[0], "find_infinite_0");
    }
  }
}

// bfloat16 scales no loss by default: no scaling ops, no skipped steps.
TEST(AmpDecorate, Bf16HasNoLossScalingByDefault) {
  Program main, startup;
  Var loss = BuildMlpForward(main, startup);
  amp::AmpConfig c;
  c.check_kernels = false;
  {
    ProgramGuard guard(main, startup);
    auto opt = amp::decorate(optimizer::Adam(1e-3f), c);
    opt.minimize(loss);
    EXPECT_EQ(opt.loss_scaling_var(), "");
  }
  auto n = CountOps(main);
  EXPECT_EQ(n["check_finite_and_unscale"], 0);
  EXPECT_EQ(n["update_loss_scaling"], 0);
  EXPECT_GT(n["cast"], 0);
  for (const auto& op : main.global_block().ops()) {
    if (op->type() == "adam") {
      EXPECT_FALSE(op->HasInput("SkipUpdate"));
    }
  }
}

TEST(AmpDecorate, ConfigRefusalsNameTheField) {
  auto error = [](const amp::AmpConfig& c) {
    return ErrorOf([&] { amp::decorate(optimizer::SGD(0.1f), c); });
  };
  amp::AmpConfig c;
  c.level = "O3";
  ExpectErrorContainsAll(error(c), {"amp_configs.level=O3", "O1", "O2"});
  c = {};
  c.init_loss_scaling = 0.5f;
  ExpectErrorContainsAll(error(c), {"amp_configs.init_loss_scaling"});
  c = {};
  c.incr_ratio = 1.0f;
  ExpectErrorContainsAll(error(c), {"amp_configs.incr_ratio"});
  c = {};
  c.decr_ratio = 1.0f;
  ExpectErrorContainsAll(error(c), {"amp_configs.decr_ratio"});
  c = {};
  c.incr_every_n_steps = 0;
  ExpectErrorContainsAll(error(c), {"amp_configs.incr_every_n_steps"});
  c = {};
  c.decr_every_n_nan_or_inf = 0;
  ExpectErrorContainsAll(error(c), {"amp_configs.decr_every_n_nan_or_inf"});
  c = {};
  c.dtype = DType::kFloat32;
  ExpectErrorContainsAll(error(c), {"amp_configs.dtype", "float32"});
  c = {};
  c.custom_black_list = {"nope"};
  ExpectErrorContainsAll(error(c), {"custom_black_list", "nope"});
}

}  // namespace
}  // namespace keel
