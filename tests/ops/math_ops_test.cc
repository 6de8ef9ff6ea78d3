// Tests of ops/math_ops.cc: forward values against naive reference loops (float32 and float64),
// gradients by finite differences, shape errors at build time, and in-place use.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/program_guard.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

const DType kDTypes[] = {DType::kFloat32, DType::kFloat64};

// Runs c forward and compares Out, of X's dtype, with `want` (computed in double from the same
// inputs).
void ExpectOut(const OpCase& c, const DDim& want_dims, const std::vector<double>& want) {
  ExpectOutputNear(c, "Out", want_dims, want, {1e-5, /*dtype_of_first_input=*/true});
}

// ------------------------------------------------------------------------------------------ mul

struct MulParams {
  std::string name;
  DDim x, y;
  int xk, yk;
  DDim out;
};

const MulParams kMulCases[] = {
    {"2d", {4, 3}, {3, 5}, 1, 1, {4, 5}},
    {"x_rank3_xk2", {2, 3, 4}, {4, 5}, 2, 1, {2, 3, 5}},
    {"x_rank3_xk1", {2, 3, 4}, {12, 5}, 1, 1, {2, 5}},
    {"y_rank3_yk2", {2, 6}, {3, 2, 5}, 1, 2, {2, 5}},
    {"y_rank4_yk2", {3, 12}, {3, 4, 2, 5}, 1, 2, {3, 2, 5}},
    {"vector_like", {1, 7}, {7, 1}, 1, 1, {1, 1}},
};

OpCase MulCase(const MulParams& p, DType dtype) {
  OpCase c;
  c.name = p.name;
  c.type = "mul";
  c.inputs = {{"X", {RandomTensor(p.x, dtype, -1, 1, 1)}},
              {"Y", {RandomTensor(p.y, dtype, -1, 1, 2)}}};
  c.attrs = {{"x_num_col_dims", p.xk}, {"y_num_col_dims", p.yk}};
  return c;
}

TEST(MulOp, ForwardMatchesReference) {
  for (const auto& p : kMulCases) {
    for (DType dt : kDTypes) {
      OpCase c = MulCase(p, dt);
      std::vector<double> x = ToDouble(c.inputs[0].second[0]), y = ToDouble(c.inputs[1].second[0]);
      const int64_t M = p.x.prod(0, p.xk), K = p.x.prod(p.xk, p.x.size());
      const int64_t N = p.y.prod(p.yk, p.y.size());
      std::vector<double> want(M * N, 0.0);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          for (int64_t k = 0; k < K; ++k) want[i * N + j] += x[i * K + k] * y[k * N + j];
      ExpectOut(c, p.out, want);
    }
  }
}

TEST(MulOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kMulCases) CheckGrad(MulCase(p, DType::kFloat64));
  // Only one input's gradient needed: the other grad output is @EMPTY@.
  for (const char* skip : {"X", "Y"}) {
    OpCase c = MulCase(kMulCases[1], DType::kFloat64);
    c.name += std::string("_no_grad_") + skip;
    c.no_grad_inputs = {skip};
    CheckGrad(c);
  }
}

TEST(MulOp, MismatchedWidthIsABuildError) {
  OpCase c;
  c.name = "width_mismatch";
  c.type = "mul";
  c.inputs = {{"X", {Tensor(DType::kFloat32, {128, 32})}},
              {"Y", {Tensor(DType::kFloat32, {64, 10})}}};
  ExpectContainsAll(ForwardError(c), {"mul", "[128, 32]", "[64, 10]", "32", "64"});

  c.name = "rank_too_small";
  c.inputs = {{"X", {Tensor(DType::kFloat32, {4, 3})}}, {"Y", {Tensor(DType::kFloat32, {3, 5})}}};
  c.attrs = {{"x_num_col_dims", 2}};
  ExpectContainsAll(ForwardError(c), {"mul", "x_num_col_dims", "[4, 3]"});

  c.name = "dtype_mismatch";
  c.inputs = {{"X", {Tensor(DType::kFloat32, {4, 3})}}, {"Y", {Tensor(DType::kFloat64, {3, 5})}}};
  c.attrs = {};
  ExpectContainsAll(ForwardError(c), {"mul", "float32", "float64"});
}

TEST(MulOp, UnknownBatchDimPassesBuildTimeCheck) {
  Program prog;
  Block& block = prog.global_block();
  VarDesc* x = block.Var("x");
  x->set_shape({-1, 3, 4});
  VarDesc* y = block.Var("y");
  y->set_shape({12, 5});
  AppendOp(block, "mul", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"out"}}});
  EXPECT_EQ(block.FindVar("out")->dims(), DDim({-1, 5}));
}

// --------------------------------------------------------------------------------------- matmul

struct MatMulParams {
  std::string name;
  DDim x, y;
  bool tx, ty;
  float alpha;
  DDim out;
};

const MatMulParams kMatMulCases[] = {
    {"2d", {3, 4}, {4, 5}, false, false, 1.0f, {3, 5}},
    {"2d_tx", {4, 3}, {4, 5}, true, false, 1.0f, {3, 5}},
    {"2d_ty", {3, 4}, {5, 4}, false, true, 1.0f, {3, 5}},
    {"2d_tx_ty", {4, 3}, {5, 4}, true, true, 1.0f, {3, 5}},
    {"2d_alpha", {3, 4}, {4, 5}, false, false, 2.5f, {3, 5}},
    {"batched", {2, 3, 4}, {2, 4, 5}, false, false, 1.0f, {2, 3, 5}},
    {"batched_tx_ty", {2, 4, 3}, {2, 5, 4}, true, true, 0.5f, {2, 3, 5}},
    {"rank4", {2, 2, 3, 4}, {2, 2, 4, 5}, false, false, 1.0f, {2, 2, 3, 5}},
    {"y_broadcast", {2, 3, 4}, {4, 5}, false, false, 1.0f, {2, 3, 5}},
    {"y_broadcast_ty", {2, 3, 4}, {5, 4}, false, true, 1.0f, {2, 3, 5}},
    {"y_broadcast_tx", {3, 4, 3}, {4, 5}, true, false, 1.0f, {3, 3, 5}},
    {"x_broadcast", {3, 4}, {2, 4, 5}, false, false, 1.0f, {2, 3, 5}},
    {"x_broadcast_tx_ty", {4, 3}, {3, 5, 4}, true, true, 1.5f, {3, 3, 5}},
};

OpCase MatMulCase(const MatMulParams& p, DType dtype) {
  OpCase c;
  c.name = p.name;
  c.type = "matmul";
  c.inputs = {{"X", {RandomTensor(p.x, dtype, -1, 1, 3)}},
              {"Y", {RandomTensor(p.y, dtype, -1, 1, 4)}}};
  c.attrs = {{"transpose_X", p.tx}, {"transpose_Y", p.ty}, {"alpha", p.alpha}};
  return c;
}

TEST(MatMulOp, ForwardMatchesReference) {
  for (const auto& p : kMatMulCases) {
    for (DType dt : kDTypes) {
      OpCase c = MatMulCase(p, dt);
      std::vector<double> x = ToDouble(c.inputs[0].second[0]), y = ToDouble(c.inputs[1].second[0]);
      const int xr = p.x.size(), yr = p.y.size();
      const int64_t M = p.tx ? p.x[xr - 1] : p.x[xr - 2], K = p.tx ? p.x[xr - 2] : p.x[xr - 1];
      const int64_t N = p.ty ? p.y[yr - 2] : p.y[yr - 1];
      const int64_t xb = p.x.prod(0, xr - 2), yb = p.y.prod(0, yr - 2), B = std::max(xb, yb);
      // x(b, i, k) = op(X_b)[i, k]; a 2-D operand is the same matrix for every b.
      auto xat = [&](int64_t b, int64_t i, int64_t k) {
        const int64_t base = xb == 1 ? 0 : b * M * K;
        return p.tx ? x[base + k * M + i] : x[base + i * K + k];
      };
      auto yat = [&](int64_t b, int64_t k, int64_t j) {
        const int64_t base = yb == 1 ? 0 : b * K * N;
        return p.ty ? y[base + j * K + k] : y[base + k * N + j];
      };
      std::vector<double> want(B * M * N, 0.0);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k) s += xat(b, i, k) * yat(b, k, j);
            want[(b * M + i) * N + j] = p.alpha * s;
          }
      ExpectOut(c, p.out, want);
    }
  }
}

// An empty batch writes nothing, not one GEMM's worth.
TEST(MatMulOp, EmptyBatchGivesEmptyOutput) {
  const MatMulParams cases[] = {
      {"empty_x_batch_tx", {0, 4, 3}, {4, 5}, true, false, 1.0f, {0, 3, 5}},
      {"empty_y_batch", {3, 4}, {0, 4, 5}, false, false, 1.0f, {0, 3, 5}},
      {"empty_x_batch_folded", {0, 3, 4}, {4, 5}, false, false, 1.0f, {0, 3, 5}},
  };
  for (const auto& p : cases) {
    for (DType dt : kDTypes) ExpectOut(MatMulCase(p, dt), p.out, {});
  }
}

TEST(MatMulOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kMatMulCases) CheckGrad(MatMulCase(p, DType::kFloat64));
  for (const char* skip : {"X", "Y"}) {
    OpCase c = MatMulCase(kMatMulCases[10], DType::kFloat64);
    c.name += std::string("_no_grad_") + skip;
    c.no_grad_inputs = {skip};
    CheckGrad(c);
  }
}

TEST(MatMulOp, BadShapesAreBuildErrors) {
  auto make = [](const std::string& name, const DDim& x, const DDim& y, bool tx, bool ty) {
    OpCase c;
    c.name = name;
    c.type = "matmul";
    c.inputs = {{"X", {Tensor(DType::kFloat32, x)}}, {"Y", {Tensor(DType::kFloat32, y)}}};
    c.attrs = {{"transpose_X", tx}, {"transpose_Y", ty}};
    return c;
  };
  ExpectContainsAll(ForwardError(make("k_mismatch", {3, 4}, {5, 6}, false, false)),
                    {"matmul", "[3, 4]", "[5, 6]"});
  ExpectContainsAll(ForwardError(make("k_mismatch_ty", {3, 4}, {4, 5}, false, true)),
                    {"matmul", "[3, 4]", "[4, 5]"});
  ExpectContainsAll(ForwardError(make("batch_mismatch", {2, 3, 4}, {3, 4, 5}, false, false)),
                    {"matmul", "batch", "[2, 3, 4]", "[3, 4, 5]"});
  ExpectContainsAll(ForwardError(make("rank1", {4}, {4, 5}, false, false)),
                    {"matmul", "1-D", "[4]"});
}

// ---------------------------------------------------------------------------------- elementwise

struct ElementwiseParams {
  std::string name;
  DDim x, y;
  int axis;
};

// clang-format off
const ElementwiseParams kElementwiseCases[] = {
    {"same_shape", {3, 4}, {3, 4}, -1},
    {"bias_axis_minus1", {4, 5}, {5}, -1},
    {"bias_axis_1", {4, 5}, {5}, 1},
    {"channel_nchw", {2, 3, 2, 2}, {3}, 1},
    // 35 values per (sample, channel): Y's gradient sums 16 lanes twice, then a tail of 3.
    {"channel_nchw_wide", {2, 3, 5, 7}, {3}, 1},
    {"middle_2d", {2, 3, 4, 2}, {3, 4}, 1},
    {"trailing_one_trimmed", {2, 3, 4}, {3, 1}, 1},
    {"scalar_y", {2, 3}, {1}, -1},
    {"leading_axis0", {2, 3, 4}, {2}, 0},
    {"row_per_sample", {4, 3}, {4, 1}, 0},
    {"rank3_same", {2, 3, 4}, {2, 3, 4}, -1},
};
// clang-format on

const char* const kElementwiseOps[] = {"elementwise_add", "elementwise_sub", "elementwise_mul",
                                       "elementwise_div"};

double Apply(const std::string& op, double a, double b) {
  if (op == "elementwise_add") return a + b;
  if (op == "elementwise_sub") return a - b;
  if (op == "elementwise_mul") return a * b;
  return a / b;
}

OpCase ElementwiseCase(const std::string& op, const ElementwiseParams& p, DType dtype) {
  OpCase c;
  c.name = p.name;
  c.type = op;
  // Divisors stay away from 0.
  const bool div = op == "elementwise_div";
  c.inputs = {{"X", {RandomTensor(p.x, dtype, -1, 1, 5)}},
              {"Y", {RandomTensor(p.y, dtype, div ? 0.5 : -1, div ? 2 : 1, 6)}}};
  c.attrs = {{"axis", p.axis}};
  return c;
}

// Y's flat index for X's flat index i: X's coordinates at [axis, axis + rank(Y)), 0 where Y has 1.
int64_t YIndex(const DDim& xd, const DDim& yd, int axis, int64_t i) {
  if (axis == -1) axis = xd.size() - yd.size();
  std::vector<int64_t> coord(xd.size());
  for (int d = xd.size() - 1; d >= 0; --d) {
    coord[d] = i % xd[d];
    i /= xd[d];
  }
  int64_t yi = 0;
  for (int d = 0; d < yd.size(); ++d) yi = yi * yd[d] + (yd[d] == 1 ? 0 : coord[axis + d]);
  return yi;
}

TEST(ElementwiseOps, ForwardMatchesReference) {
  for (const char* op : kElementwiseOps) {
    for (const auto& p : kElementwiseCases) {
      for (DType dt : kDTypes) {
        OpCase c = ElementwiseCase(op, p, dt);
        std::vector<double> x = ToDouble(c.inputs[0].second[0]);
        std::vector<double> y = ToDouble(c.inputs[1].second[0]);
        std::vector<double> want(x.size());
        for (size_t i = 0; i < x.size(); ++i)
          want[i] = Apply(op, x[i], y[YIndex(p.x, p.y, p.axis, static_cast<int64_t>(i))]);
        ExpectOut(c, p.x, want);
      }
    }
  }
}

TEST(ElementwiseOps, GradMatchesFiniteDifferences) {
  for (const char* op : kElementwiseOps) {
    for (const auto& p : kElementwiseCases) CheckGrad(ElementwiseCase(op, p, DType::kFloat64));
    for (const char* skip : {"X", "Y"}) {
      OpCase c = ElementwiseCase(op, kElementwiseCases[3], DType::kFloat64);
      c.name += std::string("_no_grad_") + skip;
      c.no_grad_inputs = {skip};
      CheckGrad(c);
    }
  }
}

TEST(ElementwiseOps, BadShapesAreBuildErrors) {
  auto make = [](const std::string& name, const DDim& x, const DDim& y, int axis) {
    OpCase c;
    c.name = name;
    c.type = "elementwise_add";
    c.inputs = {{"X", {Tensor(DType::kFloat32, x)}}, {"Y", {Tensor(DType::kFloat32, y)}}};
    c.attrs = {{"axis", axis}};
    return c;
  };
  ExpectContainsAll(ForwardError(make("dim_mismatch", {4, 5}, {4}, -1)),
                    {"elementwise_add", "[4, 5]", "[4]"});
  ExpectContainsAll(ForwardError(make("y_rank_too_big", {5}, {4, 5}, -1)),
                    {"elementwise_add", "[5]", "[4, 5]"});
  ExpectContainsAll(ForwardError(make("axis_out_of_range", {4, 5}, {5}, 2)),
                    {"elementwise_add", "axis", "[4, 5]", "[5]"});
}

// In place: Out is X's own var, as optimizers and fused updates use it.
TEST(ElementwiseOps, InPlaceOutputEqualsX) {
  Program prog;
  Block& block = prog.global_block();
  for (const char* n : {"x", "b"}) {
    block.Var(n)->set_dtype(DType::kFloat32);
    block.Var(n)->set_is_data(true);
  }
  block.Var("x")->set_shape({3, 4});
  block.Var("b")->set_shape({4});
  AppendOp(block, "elementwise_add", {{"X", {"x"}}, {"Y", {"b"}}}, {{"Out", {"x"}}});
  Tensor x = RandomTensor({3, 4}, DType::kFloat32, -1, 1, 8);
  Tensor b = RandomTensor({4}, DType::kFloat32, -1, 1, 9);
  Executor exe;
  Tensor got = exe.Run(prog, {{"x", x.Clone()}, {"b", b}}, {"x"})[0];
  std::vector<double> xv = ToDouble(x), bv = ToDouble(b), gv = ToDouble(got);
  for (int64_t i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(gv[i], xv[i] + bv[i % 4]) << "at " << i;
}

// ------------------------------------------------------------------------------------------ sum

OpCase SumCase(const std::string& name, int n, const DDim& dims, DType dtype) {
  OpCase c;
  c.name = name;
  c.type = "sum";
  std::vector<Tensor> xs;
  for (int i = 0; i < n; ++i) xs.push_back(RandomTensor(dims, dtype, -1, 1, 10 + i));
  c.inputs = {{"X", xs}};
  return c;
}

struct SumParams {
  std::string name;
  int n;
  DDim dims;
};
const SumParams kSumCases[] = {
    {"one", 1, {3, 4}}, {"two", 2, {3, 4}}, {"three", 3, {2, 3, 2}}, {"five_vector", 5, {7}}};

TEST(SumOp, ForwardMatchesReference) {
  for (const auto& p : kSumCases) {
    for (DType dt : kDTypes) {
      OpCase c = SumCase(p.name, p.n, p.dims, dt);
      std::vector<double> want(p.dims.numel(), 0.0);
      for (const Tensor& t : c.inputs[0].second) {
        std::vector<double> v = ToDouble(t);
        for (size_t i = 0; i < v.size(); ++i) want[i] += v[i];
      }
      ExpectOut(c, p.dims, want);
    }
  }
}

TEST(SumOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kSumCases) CheckGrad(SumCase(p.name, p.n, p.dims, DType::kFloat64));
}

TEST(SumOp, MismatchedShapesAreABuildError) {
  OpCase c;
  c.name = "shape_mismatch";
  c.type = "sum";
  c.inputs = {{"X", {Tensor(DType::kFloat32, {3, 4}), Tensor(DType::kFloat32, {4, 3})}}};
  ExpectContainsAll(ForwardError(c), {"sum", "[3, 4]", "[4, 3]"});
}

// Out is X[0] (accumulation in place), also with X[0] listed again later: no input may be read
// after Out has been written.
TEST(SumOp, InPlaceAccumulation) {
  struct Case {
    std::string name;
    std::vector<std::string> xs;
    std::string out;
  };
  const Case cases[] = {{"out_is_x0", {"a", "b", "c"}, "a"},
                        {"out_is_x1", {"b", "a", "c"}, "a"},
                        {"out_listed_twice", {"a", "b", "a"}, "a"},
                        {"out_listed_thrice", {"a", "a", "a"}, "a"}};
  for (const auto& cs : cases) {
    SCOPED_TRACE(cs.name);
    Program prog;
    Block& block = prog.global_block();
    FeedMap feed;
    std::map<std::string, std::vector<double>> vals;
    uint64_t seed = 20;
    for (const char* n : {"a", "b", "c"}) {
      VarDesc* v = block.Var(n);
      v->set_dtype(DType::kFloat64);
      v->set_shape({2, 5});
      v->set_is_data(true);
      feed[n] = RandomTensor({2, 5}, DType::kFloat64, -1, 1, seed++);
      vals[n] = ToDouble(feed[n]);
    }
    AppendOp(block, "sum", {{"X", cs.xs}}, {{"Out", {cs.out}}});
    Executor exe;
    std::vector<double> got = ToDouble(exe.Run(prog, feed, {cs.out})[0]);
    for (int64_t i = 0; i < 10; ++i) {
      double want = 0;
      for (auto& n : cs.xs) want += vals[n][i];
      EXPECT_NEAR(got[i], want, 1e-12) << "at " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------- scale

struct ScaleParams {
  std::string name;
  DDim dims;
  float scale, bias;
  bool bias_after_scale;
};
// clang-format off
const ScaleParams kScaleCases[] = {
    {"identity", {3, 4}, 1.0f, 0.0f, true},
    {"scale_only", {3, 4}, -2.5f, 0.0f, true},
    {"bias_after", {2, 3, 2}, 3.0f, 0.5f, true},
    {"bias_before", {2, 3, 2}, 3.0f, 0.5f, false},
    {"zero_scale", {5}, 0.0f, 1.0f, true},
};
// clang-format on

OpCase ScaleCase(const ScaleParams& p, DType dtype) {
  OpCase c;
  c.name = p.name;
  c.type = "scale";
  c.inputs = {{"X", {RandomTensor(p.dims, dtype, -1, 1, 30)}}};
  c.attrs = {{"scale", p.scale}, {"bias", p.bias}, {"bias_after_scale", p.bias_after_scale}};
  return c;
}

TEST(ScaleOp, ForwardMatchesReference) {
  for (const auto& p : kScaleCases) {
    for (DType dt : kDTypes) {
      OpCase c = ScaleCase(p, dt);
      std::vector<double> x = ToDouble(c.inputs[0].second[0]), want(x.size());
      // The attrs are float32; compare against the values the kernel sees.
      const double s = p.scale, b = p.bias;
      for (size_t i = 0; i < x.size(); ++i)
        want[i] = p.bias_after_scale ? s * x[i] + b : s * (x[i] + b);
      ExpectOut(c, p.dims, want);
    }
  }
}

TEST(ScaleOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kScaleCases) CheckGrad(ScaleCase(p, DType::kFloat64));
}

TEST(ScaleOp, InPlace) {
  Program prog;
  Block& block = prog.global_block();
  VarDesc* v = block.Var("x");
  v->set_dtype(DType::kFloat32);
  v->set_shape({6});
  v->set_is_data(true);
  AppendOp(block, "scale", {{"X", {"x"}}}, {{"Out", {"x"}}}, {{"scale", 2.0f}, {"bias", 1.0f}});
  Tensor x = RandomTensor({6}, DType::kFloat32, -1, 1, 40);
  Executor exe;
  std::vector<double> got = ToDouble(exe.Run(prog, {{"x", x.Clone()}}, {"x"})[0]);
  std::vector<double> xv = ToDouble(x);
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(got[i], 2 * xv[i] + 1) << "at " << i;
}

}  // namespace
}  // namespace keel::testing
