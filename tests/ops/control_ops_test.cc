// conditional_block runs its sub-block only when Cond holds, in the enclosing scopes, with errors
// naming the block and op; the compare and logical ops; assign.
#include <gtest/gtest.h>

#include "executor/executor.h"
#include "framework/dsl/program_guard.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;
using testing::ExpectErrorContainsAll;

VarDesc* Declare(Block& b, const std::string& name, DType dt, std::vector<int64_t> shape,
                 bool persistable = false) {
  VarDesc* v = b.Var(name);
  v->set_dtype(dt);
  v->set_shape(shape);
  v->set_persistable(persistable);
  return v;
}

// counter += 1 every run; when counter >= 3, acc += 10 (in block 1, through a temporary
// declared there).
struct CountingProgram {
  Program startup, main;
  CountingProgram() {
    Block& s = startup.global_block();
    Block& m = main.global_block();
    for (Block* b : {&s, &m}) {
      Declare(*b, "counter", DType::kInt64, {1}, true);
      Declare(*b, "three", DType::kInt64, {1}, true);
      Declare(*b, "acc", DType::kFloat32, {1}, true);
    }
    AppendOp(s, "fill_constant", {}, {{"Out", {"counter"}}},
             {{"shape", std::vector<int64_t>{1}},
              {"value", 0.0f},
              {"dtype", static_cast<int>(DType::kInt64)}});
    AppendOp(s, "fill_constant", {}, {{"Out", {"three"}}},
             {{"shape", std::vector<int64_t>{1}},
              {"value", 3.0f},
              {"dtype", static_cast<int>(DType::kInt64)}});
    AppendOp(s, "fill_constant", {}, {{"Out", {"acc"}}},
             {{"shape", std::vector<int64_t>{1}},
              {"value", 0.0f},
              {"dtype", static_cast<int>(DType::kFloat32)}});
    Declare(m, "due", DType::kBool, {1});
    AppendOp(m, "increment", {{"X", {"counter"}}}, {{"Out", {"counter"}}}, {{"step", 1.0f}});
    AppendOp(m, "greater_equal", {{"X", {"counter"}}, {"Y", {"three"}}}, {{"Out", {"due"}}});
    Block& sub = main.AppendBlock(0);
    Declare(sub, "ten", DType::kFloat32, {1});
    AppendOp(sub, "fill_constant", {}, {{"Out", {"ten"}}},
             {{"shape", std::vector<int64_t>{1}},
              {"value", 10.0f},
              {"dtype", static_cast<int>(DType::kFloat32)}});
    AppendOp(sub, "sum", {{"X", {"acc", "ten"}}}, {{"Out", {"acc"}}});
    AppendOp(m, "conditional_block", {{"Cond", {"due"}}}, {}, {{"sub_block", BlockRef{1}}});
  }
};

TEST(ConditionalBlock, RunsItsBlockOnlyWhenCondHolds) {
  CountingProgram p;
  Executor exe;
  exe.Run(p.startup);
  std::vector<float> seen;
  for (int i = 0; i < 5; ++i) seen.push_back(exe.Run(p.main, {}, {"acc"})[0].item<float>());
  EXPECT_EQ(seen, (std::vector<float>{0, 0, 10, 20, 30}));
}

TEST(ConditionalBlock, AnErrorInsideNamesTheBlockAndOp) {
  CountingProgram p;
  // The sub-block's sum now reads a var that nothing writes.
  Block& sub = p.main.block(1);
  Declare(sub, "never", DType::kFloat32, {1});
  AppendOp(sub, "sum", {{"X", {"acc", "never"}}}, {{"Out", {"acc"}}});
  Executor exe;
  exe.Run(p.startup);
  exe.Run(p.main);
  exe.Run(p.main);
  ExpectErrorContainsAll(ErrorOf([&] { exe.Run(p.main); }),
                         {"conditional_block", "block 1 op #2 sum", "never"});
}

TEST(ConditionalBlock, CondMustBeOneBool) {
  Program m;
  Block& b = m.global_block();
  Declare(b, "c", DType::kFloat32, {1});
  m.AppendBlock(0);
  ExpectErrorContainsAll(
      ErrorOf([&] {
        AppendOp(b, "conditional_block", {{"Cond", {"c"}}}, {}, {{"sub_block", BlockRef{1}}});
      }),
      {"conditional_block", "Cond must be bool", "float32"});
}

TEST(CompareOps, ElementwiseAndAgainstOneElement) {
  Program m;
  Block& b = m.global_block();
  for (const char* n : {"x", "y", "k"})
    Declare(b, n, DType::kInt64, {n[0] == 'k' ? 1 : 4})->set_is_data(true);
  const char* ops[] = {"less_than",     "less_equal", "greater_than",
                       "greater_equal", "equal",      "not_equal"};
  for (const char* op : ops) {
    Declare(b, std::string(op) + "_xy", DType::kBool, {4});
    Declare(b, std::string(op) + "_xk", DType::kBool, {4});
    AppendOp(b, op, {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {std::string(op) + "_xy"}}});
    AppendOp(b, op, {{"X", {"x"}}, {"Y", {"k"}}}, {{"Out", {std::string(op) + "_xk"}}});
  }
  Declare(b, "and", DType::kBool, {4});
  Declare(b, "or", DType::kBool, {4});
  AppendOp(b, "logical_and", {{"X", {"less_equal_xy"}}, {"Y", {"not_equal_xk"}}},
           {{"Out", {"and"}}});
  AppendOp(b, "logical_or", {{"X", {"equal_xy"}}, {"Y", {"greater_than_xk"}}}, {{"Out", {"or"}}});
  Executor exe;
  std::vector<std::string> fetch;
  for (const char* op : ops) {
    fetch.push_back(std::string(op) + "_xy");
    fetch.push_back(std::string(op) + "_xk");
  }
  fetch.push_back("and");
  fetch.push_back("or");
  auto out = exe.Run(m,
                     {{"x", Tensor::FromVector<int64_t>({1, 2, 3, 4}, {4})},
                      {"y", Tensor::FromVector<int64_t>({2, 2, 2, 2}, {4})},
                      {"k", Tensor::FromVector<int64_t>({3}, {1})}},
                     fetch);
  auto bits = [](const Tensor& t) {
    std::string s;
    for (int i = 0; i < 4; ++i) s += t.data<bool>()[i] ? '1' : '0';
    return s;
  };
  // x = 1 2 3 4 against y = 2 2 2 2 and against k = 3
  const char* want[] = {"1000", "1100", "1100", "1110", "0011", "0001",
                        "0111", "0011", "0100", "0010", "1011", "1101"};
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(bits(out[i]), want[i]) << fetch[i];
  EXPECT_EQ(bits(out[12]), "1100");  // (x <= y) && (x != k)
  EXPECT_EQ(bits(out[13]), "0101");  // (x == y) || (x > k)
}

TEST(CompareOps, MismatchedInputsAreBuildErrors) {
  Program m;
  Block& b = m.global_block();
  Declare(b, "x", DType::kInt64, {4});
  Declare(b, "f", DType::kFloat32, {4});
  Declare(b, "y3", DType::kInt64, {3});
  Declare(b, "o", DType::kBool, {4});
  ExpectErrorContainsAll(ErrorOf([&] {
                           AppendOp(b, "equal", {{"X", {"x"}}, {"Y", {"f"}}}, {{"Out", {"o"}}});
                         }),
                         {"equal", "int64", "float32"});
  ExpectErrorContainsAll(
      ErrorOf([&] {
        AppendOp(b, "less_than", {{"X", {"x"}}, {"Y", {"y3"}}}, {{"Out", {"o"}}});
      }),
      {"less_than", "[3]", "[4]"});
  ExpectErrorContainsAll(
      ErrorOf([&] {
        AppendOp(b, "logical_or", {{"X", {"x"}}, {"Y", {"x"}}}, {{"Out", {"o"}}});
      }),
      {"logical_or", "must be bool"});
}

TEST(Assign, CopiesAnyDType) {
  Program m;
  Block& b = m.global_block();
  Declare(b, "x", DType::kInt64, {3})->set_is_data(true);
  Declare(b, "y", DType::kInt64, {3});
  AppendOp(b, "assign", {{"X", {"x"}}}, {{"Out", {"y"}}});
  Executor exe;
  auto out = exe.Run(m, {{"x", Tensor::FromVector<int64_t>({5, 6, 7}, {3})}}, {"y"});
  EXPECT_EQ(out[0].data<int64_t>()[2], 7);
}

}  // namespace
}  // namespace keel
