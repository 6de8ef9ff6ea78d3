// Tests of ops/reduce_ops.cc and ops/tensor_ops.cc (mean, reduce_sum/_mean, fill_constant,
// fill_zeros_like, the random ops, cast, reshape): forward values against naive reference loops
// (float32 and float64), gradients by finite differences (float64), seeded random ops, and bad
// input reported as keel::Error at build or run time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
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

// ------------------------------------------------------------------------------------------ mean

TEST(MeanOp, ForwardMatchesReference) {
  for (const DDim& dims : {DDim{1}, DDim{4, 3}, DDim{2, 3, 4}, DDim{128, 1280}})
    for (DType dt : kFloatTypes) {
      OpCase c = UnaryCase(dims.str(), "mean", RandomTensor(dims, dt, -1, 2, 41));
      double sum = 0;
      for (double v : ToDouble(c.inputs[0].second[0])) sum += v;
      ExpectForward(c, "Out", {1}, {sum / dims.numel()});
    }
}

TEST(MeanOp, GradMatchesFiniteDifferences) {
  for (const DDim& dims : {DDim{1}, DDim{4, 3}, DDim{2, 3, 4}})
    CheckGrad(UnaryCase(dims.str(), "mean", RandomTensor(dims, DType::kFloat64, -1, 1, 42)));
}

// ---------------------------------------------------------------------------- reduce_sum, _mean

struct ReduceParams {
  std::string name;
  DDim x;
  std::vector<int> dim;
  bool keep_dim, reduce_all;
  DDim out;
};

const ReduceParams kReduceCases[] = {
    {"dim0", {3, 4}, {0}, false, false, {4}},
    {"dim1", {3, 4}, {1}, false, false, {3}},
    {"dim_neg1_keep", {3, 4}, {-1}, true, false, {3, 1}},
    {"rank3_middle", {2, 3, 4}, {1}, false, false, {2, 4}},
    {"rank3_outer_two", {2, 3, 4}, {0, 2}, false, false, {3}},
    {"rank3_outer_two_keep", {2, 3, 4}, {0, -1}, true, false, {1, 3, 1}},
    {"rank3_inner_two", {2, 3, 4}, {1, 2}, false, false, {2}},
    {"rank4_alternating", {2, 3, 2, 3}, {0, 2}, false, false, {3, 3}},
    {"size1_dims", {2, 1, 3, 1}, {1, 2}, true, false, {2, 1, 1, 1}},
    {"every_dim_listed", {2, 3}, {0, 1}, false, false, {1}},
    {"reduce_all", {2, 3, 4}, {0}, false, true, {1}},
    {"reduce_all_keep", {2, 3, 4}, {0}, true, true, {1, 1, 1}},
    {"empty_dim_is_all", {2, 3}, {}, false, false, {1}},
    {"rank1", {5}, {0}, false, false, {1}},
};

// Sums x over the dims marked in `reduced`, into the row-major order of the kept dims.
std::vector<double> NaiveReduce(const std::vector<double>& x, const DDim& dims,
                                const std::vector<bool>& reduced, bool mean) {
  int64_t out_n = 1, count = 1;
  for (int d = 0; d < dims.size(); ++d) (reduced[d] ? count : out_n) *= dims[d];
  std::vector<double> out(out_n, 0.0);
  for (int64_t i = 0; i < dims.numel(); ++i) {
    int64_t rest = i, o = 0, scale = 1;
    for (int d = dims.size() - 1; d >= 0; --d) {
      int64_t idx = rest % dims[d];
      rest /= dims[d];
      if (!reduced[d]) {
        o += idx * scale;
        scale *= dims[d];
      }
    }
    out[o] += x[i];
  }
  if (mean)
    for (double& v : out) v /= count;
  return out;
}

OpCase ReduceCase(const ReduceParams& p, const std::string& type, DType dt) {
  return UnaryCase(p.name, type, RandomTensor(p.x, dt, -1, 1, 51),
                   {{"dim", p.dim}, {"keep_dim", p.keep_dim}, {"reduce_all", p.reduce_all}});
}

TEST(ReduceOps, ForwardMatchesReference) {
  for (const auto& p : kReduceCases)
    for (const std::string type : {"reduce_sum", "reduce_mean"})
      for (DType dt : kFloatTypes) {
        std::vector<bool> reduced(p.x.size(), p.reduce_all || p.dim.empty());
        for (int d : p.dim)
          if (!p.reduce_all) reduced[d < 0 ? d + p.x.size() : d] = true;
        OpCase c = ReduceCase(p, type, dt);
        ExpectForward(
            c, "Out", p.out,
            NaiveReduce(ToDouble(c.inputs[0].second[0]), p.x, reduced, type == "reduce_mean"));
      }
}

TEST(ReduceOps, IntegerSum) {
  OpCase c =
      UnaryCase("int64", "reduce_sum", Tensor::FromVector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}),
                {{"dim", std::vector<int>{1}}});
  auto out = RunForward(c)["Out"][0];
  EXPECT_EQ(out.dtype(), DType::kInt64);
  EXPECT_EQ(ToDouble(out), (std::vector<double>{6, 15}));
}

TEST(ReduceOps, GradMatchesFiniteDifferences) {
  for (const auto& p : kReduceCases)
    for (const std::string type : {"reduce_sum", "reduce_mean"})
      CheckGrad(ReduceCase(p, type, DType::kFloat64));
}

TEST(ReduceOps, DimOutOfRangeIsABuildError) {
  OpCase c = UnaryCase("dim_2_rank_2", "reduce_sum", Tensor(DType::kFloat32, {3, 4}),
                       {{"dim", std::vector<int>{2}}});
  ExpectErrorContainsAll(ForwardError(c), {"reduce_sum", "dim 2", "[3, 4]"});
}

// --------------------------------------------------------------------- fill_constant, zeros_like

OpCase NoInputCase(const std::string& name, const std::string& type, DDim dims, DType dt,
                   std::map<std::string, Attribute> attrs) {
  OpCase c;
  c.name = name;
  c.type = type;
  c.attrs = std::move(attrs);
  c.attrs["shape"] = dims.vec();
  c.attrs["dtype"] = static_cast<int>(dt);
  return c;
}

TEST(FillConstantOp, EveryDType) {
  struct P {
    DType dtype;
    float value;
    double want;
  };
  const P cases[] = {{DType::kFloat32, 2.5f, 2.5}, {DType::kFloat64, -0.25f, -0.25},
                     {DType::kInt32, 7.0f, 7},     {DType::kInt64, -3.0f, -3},
                     {DType::kBool, 1.0f, 1},      {DType::kFloat32, 0.0f, 0}};
  for (const P& p : cases) {
    OpCase c =
        NoInputCase(DTypeName(p.dtype), "fill_constant", {2, 3}, p.dtype, {{"value", p.value}});
    SCOPED_TRACE(Describe(c));
    Tensor out = RunForward(c)["Out"][0];
    EXPECT_EQ(out.dtype(), p.dtype);
    EXPECT_EQ(out.dims(), DDim({2, 3}));
    EXPECT_EQ(ToDouble(out), std::vector<double>(6, p.want));
  }
}

TEST(FillConstantOp, BadDTypeIsABuildError) {
  OpCase c = NoInputCase("dtype_99", "fill_constant", {2}, static_cast<DType>(99), {});
  ExpectErrorContainsAll(ForwardError(c), {"fill_constant", "dtype", "99"});
}

TEST(FillZerosLikeOp, ShapeAndDTypeOfX) {
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    OpCase c = UnaryCase(DTypeName(dt), "fill_zeros_like", RandomTensor({3, 2}, dt, 1, 5, 61));
    SCOPED_TRACE(Describe(c));
    Tensor out = RunForward(c)["Out"][0];
    EXPECT_EQ(out.dtype(), dt);
    EXPECT_EQ(out.dims(), DDim({3, 2}));
    EXPECT_EQ(ToDouble(out), std::vector<double>(6, 0.0));
  }
}

// -------------------------------------------------------------------------------- random ops

struct RandomParams {
  std::string type;
  std::map<std::string, Attribute> attrs;
  double mean, std;  // of the distribution
  double lo, hi;     // every value in [lo, hi)
};

const RandomParams kRandomCases[] = {
    {"uniform_random", {{"min", -1.0f}, {"max", 1.0f}}, 0.0, 2 / std::sqrt(12.0), -1, 1},
    {"uniform_random", {{"min", 2.0f}, {"max", 5.0f}}, 3.5, 3 / std::sqrt(12.0), 2, 5},
    {"gaussian_random", {{"mean", 0.0f}, {"std", 1.0f}}, 0.0, 1.0, -10, 10},
    {"gaussian_random", {{"mean", 3.0f}, {"std", 0.5f}}, 3.0, 0.5, -10, 10},
};

OpCase RandomCase(const RandomParams& p, DType dt, int seed, DDim dims = {200, 100}) {
  std::map<std::string, Attribute> attrs = p.attrs;
  attrs["seed"] = seed;
  return NoInputCase(p.type + "_seed" + std::to_string(seed), p.type, dims, dt, attrs);
}

TEST(RandomOps, SameSeedGivesIdenticalValues) {
  for (const auto& p : kRandomCases)
    for (DType dt : kFloatTypes) {
      OpCase a = RandomCase(p, dt, 42), b = RandomCase(p, dt, 42), other = RandomCase(p, dt, 43);
      SCOPED_TRACE(Describe(a));
      std::vector<double> va = ToDouble(RunForward(a)["Out"][0]);
      EXPECT_EQ(va, ToDouble(RunForward(b)["Out"][0]));
      EXPECT_NE(va, ToDouble(RunForward(other)["Out"][0]));
    }
}

TEST(RandomOps, MeanStdAndRange) {
  for (const auto& p : kRandomCases)
    for (DType dt : kFloatTypes) {
      OpCase c = RandomCase(p, dt, 7);
      SCOPED_TRACE(Describe(c));
      Tensor out = RunForward(c)["Out"][0];
      ASSERT_EQ(out.dtype(), dt);
      ASSERT_EQ(out.dims(), DDim({200, 100}));
      std::vector<double> v = ToDouble(out);
      double sum = 0, sq = 0;
      for (double x : v) {
        ASSERT_GE(x, p.lo);
        ASSERT_LT(x, p.hi);
        sum += x;
      }
      const double mean = sum / v.size();
      for (double x : v) sq += (x - mean) * (x - mean);
      const double std = std::sqrt(sq / v.size());
      // 20000 samples: the mean's standard error is std / 141.
      EXPECT_NEAR(mean, p.mean, 5 * p.std / 141);
      EXPECT_NEAR(std, p.std, 0.02 * p.std);
    }
}

TEST(RandomOps, OddSizeAndEmptyShape) {
  for (const auto& p : kRandomCases)
    for (const DDim& dims : {DDim{3}, DDim{0}, DDim{1, 1}}) {
      OpCase c = RandomCase(p, DType::kFloat32, 9, dims);
      SCOPED_TRACE(Describe(c));
      EXPECT_EQ(RunForward(c)["Out"][0].dims(), dims);
    }
}

// The engine persists in the kernel: a second run continues the stream, and a fresh executor
// with the same seed replays it from the start.
TEST(RandomOps, RunsContinueTheStreamAndReplayPerExecutor) {
  for (const char* type : {"uniform_random", "gaussian_random"}) {
    SCOPED_TRACE(type);
    Program prog;
    AppendOp(prog.global_block(), type, {}, {{"Out", {"r"}}},
             {{"shape", std::vector<int64_t>{4, 5}}, {"seed", 5}});
    Executor first, second;
    std::vector<double> a1 = ToDouble(first.Run(prog, {}, {"r"})[0]);
    std::vector<double> a2 = ToDouble(first.Run(prog, {}, {"r"})[0]);
    EXPECT_NE(a1, a2);
    EXPECT_EQ(a1, ToDouble(second.Run(prog, {}, {"r"})[0]));
    EXPECT_EQ(a2, ToDouble(second.Run(prog, {}, {"r"})[0]));
  }
}

TEST(RandomOps, ProgramSeedMakesUnseededOpsReproducible) {
  auto run = [](int64_t program_seed) {
    Program prog;
    prog.set_random_seed(program_seed);
    AppendOp(prog.global_block(), "gaussian_random", {}, {{"Out", {"r"}}},
             {{"shape", std::vector<int64_t>{8}}});
    Executor exe;
    return ToDouble(exe.Run(prog, {}, {"r"})[0]);
  };
  EXPECT_EQ(run(90), run(90));
  EXPECT_NE(run(90), run(91));
}

TEST(RandomOps, MinNotBelowMaxIsABuildError) {
  OpCase c = NoInputCase("min_eq_max", "uniform_random", {2}, DType::kFloat32,
                         {{"min", 1.0f}, {"max", 1.0f}});
  ExpectErrorContainsAll(ForwardError(c), {"uniform_random", "min", "max"});
}

// ------------------------------------------------------------------------------------------ cast

const DType kCastTypes[] = {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64,
                            DType::kBool};

// values (as double) held in a tensor of dtype `dt`, converted by static_cast.
Tensor TypedTensor(const std::vector<double>& values, DType dt) {
  Tensor t(dt, DDim{static_cast<int64_t>(values.size())});
  VisitDType(dt, [&](auto z) {
    using V = decltype(z);
    for (size_t i = 0; i < values.size(); ++i) t.data<V>()[i] = static_cast<V>(values[i]);
  });
  return t;
}

TEST(CastOp, AllPairs) {
  const std::vector<double> values = {0, 1, 2.75, -3.5, 100, -0.25};
  for (DType from : kCastTypes)
    for (DType to : kCastTypes) {
      Tensor x = TypedTensor(values, from);
      OpCase c =
          UnaryCase(std::string(DTypeName(from)) + "_to_" + DTypeName(to), "cast", x,
                    {{"in_dtype", static_cast<int>(from)}, {"out_dtype", static_cast<int>(to)}});
      SCOPED_TRACE(Describe(c));
      // Reference: static_cast from the typed input.
      std::vector<double> want;
      VisitDType(from, [&](auto zf) {
        using F = decltype(zf);
        VisitDType(to, [&](auto zt) {
          using T = decltype(zt);
          for (int64_t i = 0; i < x.numel(); ++i)
            want.push_back(static_cast<double>(static_cast<T>(x.data<F>()[i])));
        });
      });
      Tensor out = RunForward(c)["Out"][0];
      EXPECT_EQ(out.dtype(), to);
      EXPECT_EQ(out.dims(), x.dims());
      EXPECT_EQ(ToDouble(out), want);
    }
}

TEST(CastOp, GradCastsBack) {
  // float64 -> float32: the float32 round trip limits the finite differences to ~1e-4.
  for (DType to : {DType::kFloat32, DType::kFloat64})
    for (bool set_in_dtype : {true, false}) {
      OpCase c = UnaryCase(
          std::string("to_") + DTypeName(to) + (set_in_dtype ? "" : "_no_in_dtype"), "cast",
          RandomTensor({3, 4}, DType::kFloat64, -1, 1, 71), {{"out_dtype", static_cast<int>(to)}});
      if (set_in_dtype) c.attrs["in_dtype"] = static_cast<int>(DType::kFloat64);
      CheckGrad(c, 1e-2, 1e-3, 1e-3);
    }
}

TEST(CastOp, WrongInDTypeIsABuildError) {
  OpCase c = UnaryCase("in_dtype_mismatch", "cast", Tensor(DType::kFloat32, {2}),
                       {{"in_dtype", static_cast<int>(DType::kInt64)},
                        {"out_dtype", static_cast<int>(DType::kFloat64)}});
  ExpectErrorContainsAll(ForwardError(c), {"cast", "in_dtype", "int64", "float32"});
}

// --------------------------------------------------------------------------------------- reshape

struct ReshapeParams {
  std::string name;
  DDim x;
  std::vector<int> shape;
  DDim out;
};

const ReshapeParams kReshapeCases[] = {
    {"flatten_tail", {2, 3, 4}, {0, -1}, {2, 12}},    {"flatten_all", {2, 3, 4}, {-1}, {24}},
    {"copy_middle", {2, 3, 4}, {4, 0, 2}, {4, 3, 2}}, {"explicit", {2, 3, 4}, {6, 4}, {6, 4}},
    {"add_dims", {6}, {1, 2, 1, 3}, {1, 2, 1, 3}},    {"infer_first", {4, 6}, {-1, 3}, {8, 3}},
};

TEST(ReshapeOp, ForwardKeepsElementOrder) {
  for (const auto& p : kReshapeCases)
    for (DType dt : kFloatTypes) {
      OpCase c =
          UnaryCase(p.name, "reshape", RandomTensor(p.x, dt, -1, 1, 81), {{"shape", p.shape}});
      ExpectForward(c, "Out", p.out, ToDouble(c.inputs[0].second[0]));
    }
}

TEST(ReshapeOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kReshapeCases)
    CheckGrad(UnaryCase(p.name, "reshape", RandomTensor(p.x, DType::kFloat64, -1, 1, 82),
                        {{"shape", p.shape}}));
}

TEST(ReshapeOp, BadShapesAreBuildErrors) {
  struct P {
    std::string name;
    std::vector<int> shape;
    std::vector<std::string> parts;
  };
  const P cases[] = {
      {"wrong_count", {5, 5}, {"[2, 3, 4]", "[5, 5]", "24", "25"}},
      {"not_divisible", {5, -1}, {"[2, 3, 4]", "[5, -1]", "24"}},
      {"two_unknowns", {-1, -1}, {"[-1, -1]", "more than one -1"}},
      {"copy_past_rank", {0, 0, 0, 0}, {"[2, 3, 4]", "copies dim 3"}},
      {"negative", {-2, 12}, {"[-2, 12]"}},
  };
  for (const P& p : cases) {
    OpCase c =
        UnaryCase(p.name, "reshape", Tensor(DType::kFloat32, {2, 3, 4}), {{"shape", p.shape}});
    SCOPED_TRACE(Describe(c));
    std::vector<std::string> parts = p.parts;
    parts.push_back("reshape");
    ExpectErrorContainsAll(ForwardError(c), parts);
  }
}

TEST(ReshapeOp, UnknownBatchDimAtBuildTimeIsCheckedAtRunTime) {
  Program prog;
  Block& block = prog.global_block();
  VarDesc* x = block.Var("x");
  x->set_shape({-1, 6});
  x->set_is_data(true);
  AppendOp(block, "reshape", {{"X", {"x"}}}, {{"Out", {"y"}}},
           {{"shape", std::vector<int>{-1, 2, 3}}});
  AppendOp(block, "reshape", {{"X", {"x"}}}, {{"Out", {"z"}}},
           {{"shape", std::vector<int>{0, 3, 2}}});
  AppendOp(block, "reshape", {{"X", {"x"}}}, {{"Out", {"w"}}},
           {{"shape", std::vector<int>{4, -1}}});
  EXPECT_EQ(block.FindVar("y")->dims(), DDim({-1, 2, 3}));
  EXPECT_EQ(block.FindVar("z")->dims(), DDim({-1, 3, 2}));
  EXPECT_EQ(block.FindVar("w")->dims(), DDim({4, -1}));

  Executor exe;
  auto got = exe.Run(prog, {{"x", RandomTensor({2, 6}, DType::kFloat32)}}, {"y", "z", "w"});
  EXPECT_EQ(got[0].dims(), DDim({2, 2, 3}));
  EXPECT_EQ(got[1].dims(), DDim({2, 3, 2}));
  EXPECT_EQ(got[2].dims(), DDim({4, 3}));
  try {
    exe.Run(prog, {{"x", RandomTensor({3, 6}, DType::kFloat32)}}, {"w"});
    ADD_FAILURE() << "18 elements reshaped to [4, -1] did not fail";
  } catch (const Error& e) {
    ExpectErrorContainsAll(e.what(), {"reshape", "[3, 6]", "[4, -1]"});
  }
}

// An unknown batch dim copied by a 0 leaves the -1 known at build time: X's known dims over
// Out's (the attention heads of [-1, L, D] by {0, 0, -1, E}, whatever the tensor-parallel shard).
TEST(ReshapeOp, ACopiedUnknownDimLeavesTheInferredDimKnownAtBuildTime) {
  Program prog;
  Block& block = prog.global_block();
  VarDesc* x = block.Var("x");
  x->set_shape({-1, 8, 12});
  x->set_is_data(true);
  AppendOp(block, "reshape", {{"X", {"x"}}}, {{"Out", {"heads"}}},
           {{"shape", std::vector<int>{0, 0, -1, 4}}});
  AppendOp(block, "reshape", {{"X", {"heads"}}}, {{"Out", {"back"}}},
           {{"shape", std::vector<int>{0, 0, -1}}});
  AppendOp(block, "reshape", {{"X", {"x"}}}, {{"Out", {"flat"}}},
           {{"shape", std::vector<int>{-1, 12}}});  // the unknown dim not copied: unknown
  EXPECT_EQ(block.FindVar("heads")->dims(), DDim({-1, 8, 3, 4}));
  EXPECT_EQ(block.FindVar("back")->dims(), DDim({-1, 8, 12}));
  EXPECT_EQ(block.FindVar("flat")->dims(), DDim({-1, 12}));
  ExpectErrorContainsAll(ErrorOf([&] {
                           AppendOp(block, "reshape", {{"X", {"x"}}}, {{"Out", {"bad"}}},
                                    {{"shape", std::vector<int>{0, 0, -1, 5}}});
                         }),
                         {"reshape", "[-1, 8, 12]", "not a multiple of 40"});
  Executor exe;
  auto got = exe.Run(prog, {{"x", RandomTensor({2, 8, 12}, DType::kFloat32)}}, {"heads", "back"});
  EXPECT_EQ(got[0].dims(), DDim({2, 8, 3, 4}));
  EXPECT_EQ(got[1].dims(), DDim({2, 8, 12}));
}
}  // namespace
}  // namespace keel::testing
