// Tests of ops/metric_ops.cc (top_k, arg_max, accuracy): forward values against naive reference
// loops (float32 and float64, int types where registered), NaN ranking, and bad shapes reported as
// keel::Error naming the op and shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/autodiff/backward.h"
#include "framework/dsl/program_guard.h"
#include "framework/error.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

// ----------------------------------------------------------------------------------------- top_k

struct TopKParams {
  std::string name;
  DDim x;
  int k;
};

const TopKParams kTopKCases[] = {
    {"rows", {5, 7}, 3},          {"all", {4, 6}, 6}, {"one", {3, 10}, 1},
    {"rank3", {2, 3, 5}, 2},      {"rank1", {9}, 4},  {"wide", {4, 1000}, 5},
    {"wide_one", {300, 1000}, 1},  // k = 1 scans each row, rows in pieces
};

OpCase TopKCase(const TopKParams& p, DType dt) {
  OpCase c = UnaryCase(p.name, "top_k",
                       dt == DType::kInt64 || dt == DType::kInt32
                           ? RandomInts(p.x, dt, 0, 4, 81)  // many ties
                           : RandomTensor(p.x, dt, -1, 1, 81),
                       {{"k", p.k}});
  c.outputs = {{"Out", 1}, {"Indices", 1}};
  return c;
}

TEST(TopKOp, ForwardMatchesReference) {
  for (const auto& p : kTopKCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      OpCase c = TopKCase(p, dt);
      std::vector<double> x = ToDouble(c.inputs[0].second[0]);
      const int64_t n = p.x[p.x.size() - 1], rows = p.x.numel() / n;
      std::vector<double> values, indices;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int64_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        // Larger first; equal values keep index order.
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return x[r * n + a] > x[r * n + b]; });
        for (int j = 0; j < p.k; ++j) {
          values.push_back(x[r * n + order[j]]);
          indices.push_back(static_cast<double>(order[j]));
        }
      }
      DDim od = p.x;
      od[od.size() - 1] = p.k;
      ExpectOutputNear(c, "Out", od, values, {0, /*dtype_of_first_input=*/true});
      ExpectOutputNear(c, "Indices", od, indices, {0});
      EXPECT_EQ(RunForward(c)["Indices"][0].dtype(), DType::kInt64);
    }
}

TEST(TopKOp, NaNRanksFirst) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  OpCase c =
      UnaryCase("nan", "top_k", Tensor::FromVector<double>({1, nan, 3, 2}, {1, 4}), {{"k", 2}});
  c.outputs = {{"Out", 1}, {"Indices", 1}};
  auto out = RunForward(c);
  EXPECT_EQ(ToDouble(out["Indices"][0]), (std::vector<double>{1, 2}));
  OpCase one =
      UnaryCase("nan1", "top_k", Tensor::FromVector<double>({1, 3, nan, nan}, {1, 4}), {{"k", 1}});
  one.outputs = {{"Out", 1}, {"Indices", 1}};
  EXPECT_EQ(ToDouble(RunForward(one)["Indices"][0]), (std::vector<double>{2}));
}

TEST(TopKOp, KOutOfRangeIsABuildError) {
  for (int k : {8, 0}) {
    TopKParams p{"k_" + std::to_string(k), {5, 7}, k};
    ExpectErrorContainsAll(ForwardError(TopKCase(p, DType::kFloat32)),
                           {"top_k", "k " + std::to_string(k), "[5, 7]"});
  }
}

// --------------------------------------------------------------------------------------- arg_max

struct ArgMaxParams {
  std::string name;
  DDim x;
  int64_t axis;
  bool keepdims;
  DDim out;
};

const ArgMaxParams kArgMaxCases[] = {
    {"rows", {4, 6}, -1, false, {4}},
    {"cols", {4, 6}, 0, false, {6}},
    {"keepdims", {4, 6}, 1, true, {4, 1}},
    {"rank3_middle", {2, 5, 3}, 1, false, {2, 3}},
    {"rank3_first_keep", {2, 5, 3}, 0, true, {1, 5, 3}},
    {"rank1", {7}, 0, false, {1}},
};

TEST(ArgMaxOp, ForwardMatchesReference) {
  for (const auto& p : kArgMaxCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      Tensor x = dt == DType::kInt64 || dt == DType::kInt32 ? RandomInts(p.x, dt, 0, 3, 91)
                                                            : RandomTensor(p.x, dt, -1, 1, 91);
      OpCase c = UnaryCase(p.name, "arg_max", x, {{"axis", p.axis}, {"keepdims", p.keepdims}});
      std::vector<double> xv = ToDouble(x);
      const int a = CanonicalAxis(static_cast<int>(p.axis), p.x.size());
      const int64_t pre = p.x.prod(0, a), n = p.x[a], post = p.x.prod(a + 1, p.x.size());
      std::vector<double> want;
      for (int64_t i = 0; i < pre; ++i)
        for (int64_t j = 0; j < post; ++j) {
          int64_t best = 0;  // the first of equal maxima
          for (int64_t k = 1; k < n; ++k)
            if (xv[(i * n + k) * post + j] > xv[(i * n + best) * post + j]) best = k;
          want.push_back(static_cast<double>(best));
        }
      ExpectOutputNear(c, "Out", p.out, want, {0});
      EXPECT_EQ(RunForward(c)["Out"][0].dtype(), DType::kInt64);
    }
}

TEST(ArgMaxOp, AxisOutOfRangeIsABuildError) {
  OpCase c =
      UnaryCase("axis_2", "arg_max", Tensor(DType::kFloat32, {3, 4}), {{"axis", int64_t{2}}});
  ExpectErrorContainsAll(ForwardError(c), {"arg_max", "axis 2", "[3, 4]"});
}

// -------------------------------------------------------------------------------------- accuracy

OpCase AccuracyCase(const std::string& name, Tensor indices, Tensor label) {
  OpCase c;
  c.name = name;
  c.type = "accuracy";
  c.inputs = {{"Out", {RandomTensor(indices.dims(), DType::kFloat32, 0, 1, 3)}},
              {"Indices", {std::move(indices)}},
              {"Label", {std::move(label)}}};
  c.outputs = {{"Accuracy", 1}, {"Correct", 1}, {"Total", 1}};
  return c;
}

TEST(AccuracyOp, CountsRowsWithLabelAmongTopK) {
  // Rows 0, 2, 3 hold their label among the indices; row 1 does not.
  OpCase c = AccuracyCase("top2", Tensor::FromVector<int64_t>({1, 2, 0, 3, 2, 1, 3, 0}, {4, 2}),
                          Tensor::FromVector<int64_t>({2, 1, 1, 0}, {4, 1}));
  auto out = RunForward(c);
  EXPECT_EQ(out["Accuracy"][0].dtype(), DType::kFloat32);
  EXPECT_EQ(out["Accuracy"][0].dims(), DDim({1}));
  EXPECT_FLOAT_EQ(out["Accuracy"][0].item<float>(), 0.75f);
  EXPECT_EQ(out["Correct"][0].dtype(), DType::kInt32);
  EXPECT_EQ(out["Correct"][0].item<int>(), 3);
  EXPECT_EQ(out["Total"][0].dtype(), DType::kInt32);
  EXPECT_EQ(out["Total"][0].item<int>(), 4);
}

TEST(AccuracyOp, MatchesNaiveCountOnRandomRows) {
  const int64_t N = 50, k = 3, classes = 6;
  Tensor idx = RandomInts({N, k}, DType::kInt64, 0, classes - 1, 5);
  Tensor label = RandomInts({N, 1}, DType::kInt64, 0, classes - 1, 6);
  int correct = 0;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = 0; j < k; ++j)
      if (idx.data<int64_t>()[r * k + j] == label.data<int64_t>()[r]) {
        ++correct;
        break;
      }
  auto out = RunForward(AccuracyCase("random", idx, label));
  EXPECT_EQ(out["Correct"][0].item<int>(), correct);
  EXPECT_EQ(out["Total"][0].item<int>(), N);
  EXPECT_FLOAT_EQ(out["Accuracy"][0].item<float>(), static_cast<float>(correct) / N);
}

TEST(AccuracyOp, BadShapesAreBuildErrors) {
  OpCase c = AccuracyCase("label_rows", Tensor::FromVector<int64_t>({1, 2, 0, 3}, {2, 2}),
                          Tensor::FromVector<int64_t>({1, 2, 3}, {3, 1}));
  ExpectErrorContainsAll(ForwardError(c), {"accuracy", "[2, 2]", "[3, 1]"});
  c = AccuracyCase("label_int32", Tensor::FromVector<int64_t>({1, 2, 0, 3}, {2, 2}),
                   Tensor::FromVector<int32_t>({1, 2}, {2, 1}));
  ExpectErrorContainsAll(ForwardError(c), {"accuracy", "int64", "int32"});
}
}  // namespace
}  // namespace keel::testing
