// Tests of ops/shape_ops.cc (lookup_table, concat, split, transpose, flatten, unsqueeze, squeeze)
// and the layers of framework/dsl/tensor_layers.h: forward values against naive reference loops
// (float32 and float64, int types where registered), gradients by finite differences (float64),
// and bad shapes / ids reported as keel::Error naming the op and shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/autodiff/backward.h"
#include "framework/dsl/program_guard.h"
#include "framework/dsl/tensor_layers.h"
#include "framework/error.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

// Row-major multi-index of flat index `flat` in `d`, and back.
std::vector<int64_t> Unravel(int64_t flat, const DDim& d) {
  std::vector<int64_t> idx(d.size());
  for (int i = d.size() - 1; i >= 0; --i) {
    idx[i] = flat % d[i];
    flat /= d[i];
  }
  return idx;
}
int64_t Ravel(const std::vector<int64_t>& idx, const DDim& d) {
  int64_t flat = 0;
  for (int i = 0; i < d.size(); ++i) flat = flat * d[i] + idx[i];
  return flat;
}

// --------------------------------------------------------------------------------- lookup_table

struct LookupParams {
  std::string name;
  DDim w;                    // [V, D]
  DDim ids_dims;             // [..., 1]
  std::vector<int64_t> ids;  // may repeat; padding_idx rows read as zeros
  int64_t padding_idx;
};

const LookupParams kLookupCases[] = {
    {"plain", {5, 3}, {4, 1}, {0, 4, 2, 2}, -1},
    {"padding_2", {5, 3}, {6, 1}, {2, 1, 2, 4, 0, 1}, 2},
    {"padding_0", {6, 4}, {3, 1}, {0, 5, 0}, 0},
    {"rank3_ids", {7, 2}, {2, 3, 1}, {6, 0, 3, 3, 1, 6}, -1},
    {"one_row", {1, 5}, {2, 1}, {0, 0}, -1},
};

OpCase LookupCase(const LookupParams& p, DType dt) {
  OpCase c;
  c.name = p.name;
  c.type = "lookup_table";
  c.inputs = {{"W", {RandomTensor(p.w, dt, -1, 1, 31)}},
              {"Ids", {Tensor::FromVector(p.ids, p.ids_dims)}}};
  c.attrs = {{"padding_idx", p.padding_idx}};
  c.no_grad_inputs = {"Ids"};
  return c;
}

TEST(LookupTableOp, ForwardMatchesReference) {
  for (const auto& p : kLookupCases)
    for (DType dt : kFloatTypes) {
      OpCase c = LookupCase(p, dt);
      std::vector<double> w = ToDouble(c.inputs[0].second[0]);
      const int64_t D = p.w[1];
      std::vector<double> want;
      for (int64_t id : p.ids)
        for (int64_t j = 0; j < D; ++j) want.push_back(id == p.padding_idx ? 0.0 : w[id * D + j]);
      DDim out = p.ids_dims;
      out[out.size() - 1] = D;
      ExpectOutputNear(c, "Out", out, want, {0, /*dtype_of_first_input=*/true});
    }
}

// W only (Ids is int64); the padding row's gradient is zero, which the numeric check confirms.
TEST(LookupTableOp, GradWrtWMatchesFiniteDifferences) {
  for (const auto& p : kLookupCases) CheckGrad(LookupCase(p, DType::kFloat64));
}

TEST(LookupTableOp, IdOutOfRangeIsARunError) {
  for (int64_t bad : {5, -3}) {
    OpCase c = LookupCase(kLookupCases[0], DType::kFloat32);
    c.name = "id_" + std::to_string(bad);
    c.inputs[1].second[0] = Tensor::FromVector<int64_t>({0, 1, bad, 2}, {4, 1});
    SCOPED_TRACE(Describe(c));
    ExpectErrorContainsAll(ForwardError(c), {"lookup_table", "Ids value " + std::to_string(bad),
                                             "index 2", "[0, 5)", "[5, 3]"});
  }
}

TEST(LookupTableOp, BadShapesAreBuildErrors) {
  OpCase c = LookupCase(kLookupCases[0], DType::kFloat32);
  c.name = "ids_last_dim_2";
  c.inputs[1].second[0] = Tensor::FromVector<int64_t>({0, 1, 2, 3}, {2, 2});
  ExpectErrorContainsAll(ForwardError(c), {"lookup_table", "[2, 2]", "[..., 1]"});

  c = LookupCase(kLookupCases[0], DType::kFloat32);
  c.name = "w_rank_1";
  c.inputs[0].second[0] = RandomTensor({5}, DType::kFloat32);
  ExpectErrorContainsAll(ForwardError(c), {"lookup_table", "W", "[5]"});

  c = LookupCase(kLookupCases[0], DType::kFloat32);
  c.name = "ids_int32";
  c.inputs[1].second[0] = Tensor::FromVector<int32_t>({0, 1, 2, 3}, {4, 1});
  ExpectErrorContainsAll(ForwardError(c), {"lookup_table", "int64", "int32"});

  c = LookupCase(kLookupCases[0], DType::kFloat32);
  c.name = "padding_idx_5";
  c.attrs["padding_idx"] = int64_t{5};
  ExpectErrorContainsAll(ForwardError(c), {"lookup_table", "padding_idx 5", "[5, 3]"});
}

// ---------------------------------------------------------------------------------------- concat

struct ConcatParams {
  std::string name;
  std::vector<DDim> xs;
  int axis;
};

const ConcatParams kConcatCases[] = {
    {"rows", {{2, 3}, {4, 3}}, 0},
    {"cols", {{2, 3}, {2, 1}, {2, 4}}, 1},
    {"last_negative", {{2, 2, 3}, {2, 2, 1}}, -1},
    {"rank3_middle", {{2, 1, 3}, {2, 4, 3}, {2, 2, 3}}, 1},
    {"single", {{3, 2}}, 0},
    {"rank1", {{3}, {2}}, 0},
};

OpCase ConcatCase(const ConcatParams& p, DType dt) {
  OpCase c;
  c.name = p.name;
  c.type = "concat";
  std::vector<Tensor> xs;
  uint64_t seed = 40;
  for (const DDim& d : p.xs)
    xs.push_back(dt == DType::kInt64 || dt == DType::kInt32 ? RandomInts(d, dt, -50, 50, seed++)
                                                            : RandomTensor(d, dt, -1, 1, seed++));
  c.inputs = {{"X", xs}};
  c.attrs = {{"axis", p.axis}};
  return c;
}

// The concatenation by multi-index: X[k]'s element idx lands at idx with idx[axis] + offset_k.
DDim NaiveConcat(const std::vector<std::vector<double>>& xs, const std::vector<DDim>& dims,
                 int axis, std::vector<double>* out) {
  const int a = CanonicalAxis(axis, dims[0].size());
  DDim od = dims[0];
  for (size_t k = 1; k < dims.size(); ++k) od[a] += dims[k][a];
  out->assign(od.numel(), 0);
  int64_t off = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    for (int64_t e = 0; e < dims[k].numel(); ++e) {
      std::vector<int64_t> idx = Unravel(e, dims[k]);
      idx[a] += off;
      (*out)[Ravel(idx, od)] = xs[k][e];
    }
    off += dims[k][a];
  }
  return od;
}

TEST(ConcatOp, ForwardMatchesReference) {
  for (const auto& p : kConcatCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      OpCase c = ConcatCase(p, dt);
      std::vector<std::vector<double>> xs;
      for (const Tensor& t : c.inputs[0].second) xs.push_back(ToDouble(t));
      std::vector<double> want;
      DDim od = NaiveConcat(xs, p.xs, p.axis, &want);
      ExpectOutputNear(c, "Out", od, want, {0, /*dtype_of_first_input=*/true});
    }
}

TEST(ConcatOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kConcatCases) CheckGrad(ConcatCase(p, DType::kFloat64));
}

TEST(ConcatOp, MismatchedShapesAreBuildErrors) {
  ConcatParams p{"dim0_differs", {{2, 3}, {3, 4}}, 1};
  ExpectErrorContainsAll(ForwardError(ConcatCase(p, DType::kFloat32)),
                         {"concat", "X[1] [3, 4]", "X[0] [2, 3]", "axis 1"});
  p = {"rank_differs", {{2, 3}, {2, 3, 1}}, 0};
  ExpectErrorContainsAll(ForwardError(ConcatCase(p, DType::kFloat32)),
                         {"concat", "[2, 3, 1]", "[2, 3]"});
  p = {"axis_2", {{2, 3}, {2, 3}}, 2};
  ExpectErrorContainsAll(ForwardError(ConcatCase(p, DType::kFloat32)),
                         {"concat", "axis 2", "[2, 3]"});
}

TEST(ConcatOp, UnknownBatchDimPassesBuildTimeCheck) {
  Program prog;
  Block& block = prog.global_block();
  block.Var("a")->set_shape({-1, 3});
  block.Var("b")->set_shape({-1, 5});
  AppendOp(block, "concat", {{"X", {"a", "b"}}}, {{"Out", {"c"}}}, {{"axis", 1}});
  EXPECT_EQ(block.FindVar("c")->dims(), DDim({-1, 8}));
  AppendOp(block, "concat", {{"X", {"a", "a"}}}, {{"Out", {"d"}}}, {{"axis", 0}});
  EXPECT_EQ(block.FindVar("d")->dims(), DDim({-1, 3}));
}

// ----------------------------------------------------------------------------------------- split

struct SplitParams {
  std::string name;
  DDim x;
  int num;
  std::vector<int> sections;
  int axis;
  std::vector<int64_t> sizes;  // expected sizes along axis
};

const SplitParams kSplitCases[] = {
    {"num_rows", {6, 2}, 3, {}, 0, {2, 2, 2}},
    {"num_cols", {2, 6}, 2, {}, 1, {3, 3}},
    {"sections", {2, 6}, 0, {1, 3, 2}, 1, {1, 3, 2}},
    {"sections_infer", {2, 6}, 0, {1, -1, 2}, -1, {1, 3, 2}},
    {"rank3_middle", {2, 5, 3}, 0, {2, 3}, 1, {2, 3}},
    {"zero_section", {2, 4}, 0, {0, 4}, 1, {0, 4}},
};

OpCase SplitCase(const SplitParams& p, DType dt) {
  OpCase c =
      UnaryCase(p.name, "split",
                dt == DType::kInt64 || dt == DType::kInt32 ? RandomInts(p.x, dt, -9, 9, 51)
                                                           : RandomTensor(p.x, dt, -1, 1, 51),
                {{"num", p.num}, {"sections", p.sections}, {"axis", p.axis}});
  c.outputs = {{"Out", static_cast<int>(p.sizes.size())}};
  return c;
}

TEST(SplitOp, ForwardMatchesReference) {
  for (const auto& p : kSplitCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      OpCase c = SplitCase(p, dt);
      SCOPED_TRACE(Describe(c));
      std::vector<double> x = ToDouble(c.inputs[0].second[0]);
      auto outs = RunForward(c)["Out"];
      ASSERT_EQ(outs.size(), p.sizes.size());
      const int a = CanonicalAxis(p.axis, p.x.size());
      int64_t off = 0;
      for (size_t k = 0; k < outs.size(); ++k) {
        DDim od = p.x;
        od[a] = p.sizes[k];
        ASSERT_EQ(outs[k].dims(), od) << "Out[" << k << "]";
        ASSERT_EQ(outs[k].dtype(), dt);
        std::vector<double> got = ToDouble(outs[k]);
        for (int64_t e = 0; e < od.numel(); ++e) {
          std::vector<int64_t> idx = Unravel(e, od);
          idx[a] += off;
          ASSERT_EQ(got[e], x[Ravel(idx, p.x)]) << "Out[" << k << "] at " << e;
        }
        off += p.sizes[k];
      }
    }
}

TEST(SplitOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kSplitCases) CheckGrad(SplitCase(p, DType::kFloat64));
}

TEST(SplitOp, BadPartsAreBuildErrors) {
  SplitParams p{"num_4_of_6", {2, 6}, 4, {}, 1, {1, 1, 1, 1}};
  ExpectErrorContainsAll(ForwardError(SplitCase(p, DType::kFloat32)), {"split", "[2, 6]", "num 4"});
  p = {"sections_sum_5", {2, 6}, 0, {2, 3}, 1, {2, 3}};
  ExpectErrorContainsAll(ForwardError(SplitCase(p, DType::kFloat32)),
                         {"split", "[2, 3]", "sum to 5", "[2, 6]"});
  p = {"num_vs_outputs", {2, 6}, 3, {}, 1, {3, 3}};
  ExpectErrorContainsAll(ForwardError(SplitCase(p, DType::kFloat32)), {"split", "num 3", "2 Out"});
  p = {"axis_2", {2, 6}, 2, {}, 2, {3, 3}};
  ExpectErrorContainsAll(ForwardError(SplitCase(p, DType::kFloat32)),
                         {"split", "axis 2", "[2, 6]"});
}

// ------------------------------------------------------------------------------------- transpose

struct TransposeParams {
  std::string name;
  DDim x;
  std::vector<int> perm;
};

const TransposeParams kTransposeCases[] = {
    {"matrix", {3, 4}, {1, 0}},
    {"identity", {3, 4}, {0, 1}},
    {"rank3", {2, 3, 4}, {2, 0, 1}},
    {"rank3_swap_last", {2, 3, 4}, {0, 2, 1}},
    {"rank4", {2, 3, 1, 4}, {3, 1, 0, 2}},
    {"rank1", {5}, {0}},
    // Trailing dims that stay in place (copied as contiguous runs): the attention's heads split.
    {"heads", {2, 3, 4, 5}, {0, 2, 1, 3}},
    {"two_kept_dims", {3, 2, 4, 5}, {1, 0, 2, 3}},
    {"all_kept_rank3", {2, 3, 4}, {0, 1, 2}},
    // Two blocks of trailing dims swapped (batched 2-D transposes, tiles of 16): NCHW to NHWC and
    // back, planes and channels past a tile, a matrix, two leading dims kept.
    {"nchw_to_nhwc", {2, 3, 5, 7}, {0, 2, 3, 1}},
    {"nhwc_to_nchw", {2, 5, 7, 3}, {0, 3, 1, 2}},
    {"nchw_to_nhwc_tiles", {2, 35, 6, 3}, {0, 2, 3, 1}},
    {"matrix_tiles", {33, 17}, {1, 0}},
    {"kept_then_swapped", {2, 3, 4, 5, 6}, {0, 1, 4, 2, 3}},
    // Not block swaps (the odometer): reversals.
    {"reversed_after_one", {2, 3, 4, 5}, {0, 3, 2, 1}},
    {"reversed", {3, 4, 5}, {2, 1, 0}},
};

OpCase TransposeCase(const TransposeParams& p, DType dt) {
  return UnaryCase(p.name, "transpose",
                   dt == DType::kInt64 || dt == DType::kInt32 ? RandomInts(p.x, dt, -99, 99, 61)
                                                              : RandomTensor(p.x, dt, -1, 1, 61),
                   {{"axis", p.perm}});
}

TEST(TransposeOp, ForwardMatchesReference) {
  for (const auto& p : kTransposeCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      OpCase c = TransposeCase(p, dt);
      std::vector<double> x = ToDouble(c.inputs[0].second[0]);
      DDim od = p.x;
      for (size_t i = 0; i < p.perm.size(); ++i) od[i] = p.x[p.perm[i]];
      std::vector<double> want(x.size());
      for (int64_t e = 0; e < od.numel(); ++e) {
        std::vector<int64_t> oi = Unravel(e, od), xi(p.perm.size());
        for (size_t i = 0; i < p.perm.size(); ++i) xi[p.perm[i]] = oi[i];
        want[e] = x[Ravel(xi, p.x)];
      }
      ExpectOutputNear(c, "Out", od, want, {0, /*dtype_of_first_input=*/true});
    }
}

TEST(TransposeOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kTransposeCases) CheckGrad(TransposeCase(p, DType::kFloat64));
}

TEST(TransposeOp, NotAPermutationIsABuildError) {
  for (const auto& perm :
       {std::vector<int>{0, 0, 1}, std::vector<int>{0, 1}, std::vector<int>{0, 1, 3}}) {
    TransposeParams p{"bad_perm", {2, 3, 4}, perm};
    ExpectErrorContainsAll(ForwardError(TransposeCase(p, DType::kFloat32)),
                           {"transpose", "permutation", "[2, 3, 4]"});
  }
}

// ----------------------------------------------------------------- flatten, unsqueeze, squeeze

struct ReshapeLikeParams {
  std::string name, type;
  DDim x;
  std::map<std::string, Attribute> attrs;
  DDim out;
};

const ReshapeLikeParams kReshapeLikeCases[] = {
    {"flatten_1", "flatten", {2, 3, 4}, {{"axis", 1}}, {2, 12}},
    {"flatten_0", "flatten", {2, 3, 4}, {{"axis", 0}}, {1, 24}},
    {"flatten_2", "flatten", {2, 3, 4}, {{"axis", 2}}, {6, 4}},
    {"flatten_3", "flatten", {2, 3, 4}, {{"axis", 3}}, {24, 1}},
    {"flatten_default", "flatten", {5, 2, 2}, {}, {5, 4}},
    {"unsqueeze_front", "unsqueeze", {3, 4}, {{"axes", std::vector<int>{0}}}, {1, 3, 4}},
    {"unsqueeze_back", "unsqueeze", {3, 4}, {{"axes", std::vector<int>{-1}}}, {3, 4, 1}},
    {"unsqueeze_both", "unsqueeze", {3, 4}, {{"axes", std::vector<int>{0, -1}}}, {1, 3, 4, 1}},
    {"unsqueeze_twice_mid", "unsqueeze", {3, 4}, {{"axes", std::vector<int>{1, 1}}}, {3, 1, 1, 4}},
    {"squeeze_all", "squeeze", {1, 3, 1, 4}, {}, {3, 4}},
    {"squeeze_axis0", "squeeze", {1, 3, 1, 4}, {{"axes", std::vector<int>{0}}}, {3, 1, 4}},
    {"squeeze_negative", "squeeze", {1, 3, 1, 4}, {{"axes", std::vector<int>{-2}}}, {1, 3, 4}},
    {"squeeze_to_scalar", "squeeze", {1, 1}, {}, {}},
};

OpCase ReshapeLikeCase(const ReshapeLikeParams& p, DType dt) {
  return UnaryCase(p.name, p.type,
                   dt == DType::kInt64 || dt == DType::kInt32 ? RandomInts(p.x, dt, -99, 99, 71)
                                                              : RandomTensor(p.x, dt, -1, 1, 71),
                   p.attrs);
}

TEST(ReshapeLikeOps, ForwardKeepsElementsInNewShape) {
  for (const auto& p : kReshapeLikeCases)
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
      OpCase c = ReshapeLikeCase(p, dt);
      ExpectOutputNear(c, "Out", p.out, ToDouble(c.inputs[0].second[0]),
                       {0, /*dtype_of_first_input=*/true});
    }
}

TEST(ReshapeLikeOps, GradMatchesFiniteDifferences) {
  for (const auto& p : kReshapeLikeCases) CheckGrad(ReshapeLikeCase(p, DType::kFloat64));
}

TEST(ReshapeLikeOps, BadAxesAreBuildErrors) {
  struct Bad {
    ReshapeLikeParams p;
    std::vector<std::string> parts;
  };
  const Bad bad[] = {
      {{"flatten_4", "flatten", {2, 3, 4}, {{"axis", 4}}, {}}, {"flatten", "axis 4", "[2, 3, 4]"}},
      {{"flatten_neg", "flatten", {2, 3}, {{"axis", -1}}, {}}, {"flatten", "axis -1", "[2, 3]"}},
      {{"unsqueeze_4", "unsqueeze", {2, 3}, {{"axes", std::vector<int>{4}}}, {}},
       {"unsqueeze", "axis 4", "[2, 3]"}},
      {{"unsqueeze_empty", "unsqueeze", {2, 3}, {{"axes", std::vector<int>{}}}, {}},
       {"unsqueeze", "empty", "[2, 3]"}},
      {{"squeeze_not_1", "squeeze", {2, 1, 3}, {{"axes", std::vector<int>{0}}}, {}},
       {"squeeze", "axis 0", "[2, 1, 3]", "size 2"}},
      {{"squeeze_3", "squeeze", {2, 1, 3}, {{"axes", std::vector<int>{3}}}, {}},
       {"squeeze", "axis 3", "[2, 1, 3]"}},
  };
  for (const auto& b : bad)
    ExpectErrorContainsAll(ForwardError(ReshapeLikeCase(b.p, DType::kFloat32)), b.parts);
}

TEST(ReshapeLikeOps, UnknownBatchDimAtBuildTime) {
  Program prog;
  Block& block = prog.global_block();
  block.Var("x")->set_shape({-1, 1, 3, 4});
  AppendOp(block, "flatten", {{"X", {"x"}}}, {{"Out", {"f1"}}}, {{"axis", 1}});
  EXPECT_EQ(block.FindVar("f1")->dims(), DDim({-1, 12}));
  AppendOp(block, "flatten", {{"X", {"x"}}}, {{"Out", {"f2"}}}, {{"axis", 2}});
  EXPECT_EQ(block.FindVar("f2")->dims(), DDim({-1, 12}));
  AppendOp(block, "squeeze", {{"X", {"x"}}}, {{"Out", {"s"}}}, {});
  EXPECT_EQ(block.FindVar("s")->dims(), DDim({-1, 3, 4}));
  AppendOp(block, "unsqueeze", {{"X", {"x"}}}, {{"Out", {"u"}}}, {{"axes", std::vector<int>{1}}});
  EXPECT_EQ(block.FindVar("u")->dims(), DDim({-1, 1, 1, 3, 4}));
  AppendOp(block, "transpose", {{"X", {"x"}}}, {{"Out", {"t"}}},
           {{"axis", std::vector<int>{3, 0, 1, 2}}});
  EXPECT_EQ(block.FindVar("t")->dims(), DDim({4, -1, 1, 3}));
}

// ------------------------------------------------------------------------------------------ DSL

TEST(TensorLayers, BuildShapesAndTrainThroughEmbedding) {
  Program main, startup;
  ProgramGuard guard(main, startup);
  Var ids = layers::data("ids", {-1, 1}, DType::kInt64);
  Var label = layers::data("label", {-1, 1}, DType::kInt64);
  Var emb = layers::embedding(ids, {10, 4}, /*padding_idx=*/0);
  EXPECT_EQ(emb.shape(), DDim({-1, 4}));
  Var cat = layers::concat({emb, layers::gelu(emb)}, 1);
  EXPECT_EQ(cat.shape(), DDim({-1, 8}));
  std::vector<Var> parts = layers::split(cat, {3, -1}, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].shape(), DDim({-1, 5}));
  std::vector<Var> halves = layers::split(cat, 2, 1);
  ASSERT_EQ(halves.size(), 2u);
  EXPECT_EQ(halves[0].shape(), DDim({-1, 4}));
  Var t = layers::transpose(layers::unsqueeze(parts[1], {1}), {0, 2, 1});
  EXPECT_EQ(t.shape(), DDim({-1, 5, 1}));
  Var sq = layers::squeeze(t, {2});
  EXPECT_EQ(sq.shape(), DDim({-1, 5}));
  Var f = layers::flatten(layers::unsqueeze(sq, {1}), 1);
  EXPECT_EQ(f.shape(), DDim({-1, 5}));
  Var act = layers::clip(layers::leaky_relu(f, 0.1f), -3.0f, 3.0f);
  Var logp = layers::log_softmax(act, -1);
  auto [values, indices] = layers::topk(logp, 2);
  EXPECT_EQ(indices.shape(), DDim({-1, 2}));
  EXPECT_EQ(indices.dtype(), DType::kInt64);
  Var am = layers::argmax(logp, 1);
  EXPECT_EQ(am.shape(), DDim({-1}));
  Var acc = layers::accuracy(logp, label, 2);
  EXPECT_EQ(acc.shape(), DDim({1}));
  EXPECT_EQ(acc.dtype(), DType::kFloat32);
  Var loss = layers::mean(logp);
  append_backward(main, loss);

  // The embedding table: a Xavier (uniform) parameter, initialized in startup.
  const std::string w = emb.block()->ops()[0]->Input("W")[0];
  EXPECT_TRUE(main.global_block().FindVar(w)->is_parameter());
  ASSERT_EQ(startup.global_block().num_ops(), 1u);
  EXPECT_EQ(startup.global_block().op(0)->type(), "uniform_random");

  Executor exe;
  exe.Run(startup);
  Tensor id_t = Tensor::FromVector<int64_t>({3, 0, 7, 3}, {4, 1});
  Tensor label_t = Tensor::FromVector<int64_t>({0, 1, 2, 3}, {4, 1});
  auto out = exe.Run(main, {{"ids", id_t}, {"label", label_t}},
                     {emb.name(), am.name(), acc.name(), indices.name(), GradVarName(w)});
  EXPECT_EQ(out[0].dims(), DDim({4, 4}));
  std::vector<double> e = ToDouble(out[0]);
  for (int j = 4; j < 8; ++j) EXPECT_EQ(e[j], 0.0) << "the padding id's row is zeros";
  EXPECT_EQ(out[1].dims(), DDim({4}));
  // Accuracy agrees with the fetched top-2 indices.
  std::vector<double> idx = ToDouble(out[3]);
  int correct = 0;
  for (int r = 0; r < 4; ++r) correct += idx[2 * r] == r || idx[2 * r + 1] == r;
  EXPECT_FLOAT_EQ(out[2].item<float>(), correct / 4.0f);
  // W@GRAD is dense [10, 4]: rows of ids 3 and 7 get gradient, the padding row 0 and unused rows
  // none.
  ASSERT_EQ(out[4].dims(), DDim({10, 4}));
  std::vector<double> g = ToDouble(out[4]);
  auto row_norm = [&](int r) {
    double s = 0;
    for (int j = 0; j < 4; ++j) s += std::abs(g[r * 4 + j]);
    return s;
  };
  EXPECT_EQ(row_norm(0), 0.0);
  EXPECT_EQ(row_norm(5), 0.0);
  EXPECT_GT(row_norm(3), 0.0);
  EXPECT_GT(row_norm(7), 0.0);
}

// split's grad is a concat of the parts' grads; a part the loss does not use contributes zeros.
TEST(TensorLayers, SplitGradWithUnusedPartIsZeroThere) {
  Program main, startup;
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {2, 5}, DType::kFloat64, /*stop_gradient=*/false);
  std::vector<Var> parts = layers::split(x, {2, 3}, 1);
  Var loss = layers::reduce_sum(parts[1]);
  append_backward(main, loss);
  Executor exe;
  auto out =
      exe.Run(main, {{"x", RandomTensor({2, 5}, DType::kFloat64, -1, 1, 1)}}, {GradVarName("x")});
  EXPECT_EQ(ToDouble(out[0]), (std::vector<double>{0, 0, 1, 1, 1, 0, 0, 1, 1, 1}));
}

TEST(TensorLayers, WrongShapesFailAtTheLayerCall) {
  Program main, startup;
  ProgramGuard guard(main, startup);
  Var a = layers::data("a", {-1, 3});
  Var b = layers::data("b", {-1, 3, 1});
  ExpectErrorContainsAll(ErrorOf([&] { layers::concat({a, b}, 1); }), {"concat", "[-1, 3, 1]"});
  ExpectErrorContainsAll(ErrorOf([&] { layers::split(a, 2, 1); }), {"split", "[-1, 3]", "num 2"});
  ExpectErrorContainsAll(ErrorOf([&] {
                           layers::embedding(a, {10, 4});
                         }),
                         {"lookup_table", "int64", "float32"});
}
}  // namespace
}  // namespace keel::testing
