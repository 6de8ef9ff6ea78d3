// What the CPU kernels and their CUDA twins share beyond element-wise math, checked on the CPU: the
// reduction and transpose index plans (ops/functors/index_plans.h) against brute force and the CPU
// kernels, the top_k ranking rule, the lr schedules, the dropout blocks, the global-norm factor;
// FLAGS_init_allocated_mem's poison, and that the CPU kernels write every element of their outputs
// under it (the GPU twin tests rely on the same poison).
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "framework/op/op_registry.h"
#include "ops/functors/compare_functors.h"
#include "ops/functors/index_plans.h"
#include "ops/functors/lr_schedule_functors.h"
#include "ops/functors/metric_functors.h"
#include "ops/functors/optimizer_functors.h"
#include "ops/functors/philox.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

DECLARE_bool(init_allocated_mem);

namespace keel {
namespace {

// Brute force: X's element at multi-index idx goes to the Out element of its kept coordinates.
TEST(ReducePlan, OutIndexAndGatherCoverEveryElementOnce) {
  struct Case {
    DDim x;
    std::vector<bool> reduced;
  };
  const Case cases[] = {
      {{2, 3, 4, 5}, {false, true, true, false}},
      {{2, 3, 4}, {true, false, true}},
      {{6}, {true}},
      {{1, 4, 1, 3}, {false, false, true, true}},
      {{3, 1, 2}, {false, true, false}},
      {{2, 2, 2, 2, 2}, {true, false, true, false, true}},
      {{5, 7}, {false, false}},
      {{1}, {true}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.x.str());
    bool red[DDim::kMaxRank] = {};
    for (int d = 0; d < c.x.size(); ++d) red[d] = c.reduced[d];
    const fn::ReduceLayout l = fn::MakeReduceLayout(c.x, red);
    int64_t out_numel = 1;
    for (int d = 0; d < c.x.size(); ++d)
      if (!red[d]) out_numel *= c.x[d];
    ASSERT_EQ(l.out_numel, out_numel);
    ASSERT_EQ(l.numel, c.x.numel());
    // OutIndex against the multi-index.
    std::vector<int> seen(out_numel, 0);
    for (int64_t i = 0; i < c.x.numel(); ++i) {
      int64_t rest = i, o = 0, stride = 1;
      for (int d = c.x.size() - 1; d >= 0; --d) {
        const int64_t k = rest % c.x[d];
        rest /= c.x[d];
        if (!red[d]) {
          o += k * stride;
          stride *= c.x[d];
        }
      }
      ASSERT_EQ(l.OutIndex(i), o) << "element " << i;
      ++seen[o];
    }
    // The gather lists, for each Out element, exactly the X elements OutIndex sends there.
    const fn::ReduceGather g = fn::MakeReduceGather(l);
    ASSERT_EQ(g.count * out_numel, c.x.numel());
    std::vector<int> hits(c.x.numel(), 0);
    for (int64_t o = 0; o < out_numel; ++o)
      for (int64_t r = 0; r < g.count; ++r) {
        const int64_t i = g.Base(o) + g.Offset(r);
        ASSERT_GE(i, 0);
        ASSERT_LT(i, c.x.numel());
        ASSERT_EQ(l.OutIndex(i), o) << "out " << o << " r " << r;
        ++hits[i];
      }
    for (int64_t i = 0; i < c.x.numel(); ++i) EXPECT_EQ(hits[i], 1) << "element " << i;
  }
}

// The plan the CUDA transpose uses gives the CPU kernel's output.
TEST(TransposePlan, SourceIndicesReproduceTheCpuKernel) {
  const std::vector<std::pair<DDim, std::vector<int>>> cases = {{{2, 3, 4}, {2, 0, 1}},
                                                                {{4, 5}, {1, 0}},
                                                                {{2, 3, 4, 5}, {0, 2, 1, 3}},
                                                                {{7}, {0}},
                                                                {{2, 1, 3, 2}, {3, 2, 1, 0}}};
  for (auto& [dims, perm] : cases) {
    SCOPED_TRACE(dims.str());
    testing::OpCase c;
    c.name = "transpose";
    c.type = "transpose";
    Tensor x = testing::RandomTensor(dims, DType::kFloat64);
    c.inputs = {{"X", {x}}};
    c.attrs = {{"axis", perm}};
    const Tensor out = testing::RunForward(c)["Out"][0];
    const fn::TransposePlan p = fn::MakeTransposePlan(dims, perm);
    for (int64_t o = 0; o < out.numel(); ++o)
      ASSERT_EQ(out.data<double>()[o], x.data<double>()[p.SrcIndex(o)]) << "element " << o;
  }
}

TEST(RanksBefore, LargerFirstNaNLargestTiesToTheLowerIndex) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(fn::RanksBefore(2.0f, 5, 1.0f, 0));
  EXPECT_FALSE(fn::RanksBefore(1.0f, 0, 2.0f, 5));
  EXPECT_TRUE(fn::RanksBefore(1.0f, 0, 1.0f, 1));
  EXPECT_FALSE(fn::RanksBefore(1.0f, 1, 1.0f, 0));
  EXPECT_TRUE(fn::RanksBefore(nan, 3, 1e30f, 0));
  EXPECT_FALSE(fn::RanksBefore(1e30f, 0, nan, 3));
  EXPECT_TRUE(fn::RanksBefore(nan, 0, nan, 1));
  EXPECT_TRUE(fn::RanksBefore(int64_t{3}, 9, int64_t{2}, 0));
  EXPECT_TRUE(fn::Greater(nan, -1.0f));
  EXPECT_FALSE(fn::Greater(nan, nan));
}

TEST(CompareFunctors, MatchTheOperators) {
  EXPECT_TRUE(fn::LessThan()(1, 2));
  EXPECT_FALSE(fn::LessThan()(2, 2));
  EXPECT_TRUE(fn::LessEqual()(2.0, 2.0));
  EXPECT_TRUE(fn::GreaterThan()(int64_t{3}, int64_t{2}));
  EXPECT_TRUE(fn::GreaterEqual()(2.0f, 2.0f));
  EXPECT_TRUE(fn::Equal()(5, 5));
  EXPECT_TRUE(fn::NotEqual()(5, 6));
  EXPECT_FALSE(fn::Equal()(NAN, NAN));
  EXPECT_TRUE(fn::Logical<true>()(true, true));
  EXPECT_FALSE(fn::Logical<true>()(true, false));
  EXPECT_TRUE(fn::Logical<false>()(false, true));
  EXPECT_FALSE(fn::Logical<false>()(false, false));
}

// The formulas of ops/lr_schedule_ops.cc, step by step.
TEST(LrScheduleFunctor, ConstantPiecewiseCosineAndWarmup) {
  fn::LrSchedule c;
  c.base_lr = 0.5;
  EXPECT_FLOAT_EQ(c(0), 0.5f);
  EXPECT_FLOAT_EQ(c(-3), 0.5f);  // clamped at step 0

  const int b[] = {10, 20};
  const float v[] = {1.0f, 0.5f, 0.25f};
  fn::LrSchedule p;
  p.type = fn::LrSchedule::kPiecewise;
  p.boundaries = b;
  p.values = v;
  p.num_boundaries = 2;
  EXPECT_EQ(p(9), 1.0f);
  EXPECT_EQ(p(10), 0.5f);
  EXPECT_EQ(p(19), 0.5f);
  EXPECT_EQ(p(20), 0.25f);

  fn::LrSchedule cos;
  cos.type = fn::LrSchedule::kCosine;
  cos.base_lr = 1.0;
  cos.min_lr = 0.1;
  cos.total_steps = 100;
  EXPECT_FLOAT_EQ(cos(0), 1.0f);
  EXPECT_FLOAT_EQ(cos(50), static_cast<float>(0.1 + 0.9 * 0.5));
  EXPECT_FLOAT_EQ(cos(100), 0.1f);
  EXPECT_FLOAT_EQ(cos(1000), 0.1f);

  cos.warmup_steps = 10;
  cos.warmup_start_lr = 0.0;
  const double at10 = 0.1 + 0.9 * (1 + std::cos(M_PI * 0.1)) / 2;
  EXPECT_FLOAT_EQ(cos(5), static_cast<float>(at10 * 5 / 10));
  EXPECT_FLOAT_EQ(cos(10), static_cast<float>(at10));
  cos.warmup_end_lr = 2.0;
  EXPECT_FLOAT_EQ(cos(5), 1.0f);
}

TEST(DropoutFunctors, BlockWordsAreThePerElementDrawsAndApplyScales) {
  const uint64_t seed = 0x1234567890abcdefull, offset = 77;
  const uint64_t threshold = fn::DropoutThreshold(0.4f);
  for (int64_t block = 0; block < 50; ++block) {
    const fn::Philox4 r = fn::DropoutBlock(seed, offset, block);
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(r.v[k] >= threshold, fn::DropoutKeep(seed, offset, 4 * block + k, threshold));
  }
  EXPECT_EQ(fn::DropoutApply(true, 3.0f, 2.0f), 6.0f);
  EXPECT_EQ(fn::DropoutApply(false, 3.0f, 2.0f), 0.0f);
}

TEST(GlobalNormScale, IsClipOverMaxOfNormAndClip) {
  EXPECT_DOUBLE_EQ(fn::GlobalNormScale(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(fn::GlobalNormScale(4.0, 1.0), 0.25);
  EXPECT_DOUBLE_EQ(fn::GlobalNormScale(1.0, 1.0), 1.0);
  EXPECT_TRUE(std::isnan(fn::GlobalNormScale(NAN, 1.0)));  // as std::max(norm, clip)
}

class InitAllocatedMem : public ::testing::Test {
 protected:
  void SetUp() override { FLAGS_init_allocated_mem = true; }
  void TearDown() override { FLAGS_init_allocated_mem = false; }
};

TEST_F(InitAllocatedMem, FillsNewCpuAllocationsWithNaN) {
  Tensor t(DType::kFloat32, {5, 7});
  for (int64_t i = 0; i < t.numel(); ++i) ASSERT_TRUE(std::isnan(t.data<float>()[i])) << i;
  Tensor l(DType::kInt64, {3});
  EXPECT_EQ(l.data<int64_t>()[0], -1);
}

// The CPU kernels write every element of their outputs: with poisoned allocations their results
// equal the unpoisoned ones (no NaN left over). The GPU twin tests poison the same way.
TEST_F(InitAllocatedMem, CpuKernelsWriteEveryOutputElement) {
  using testing::OpCase;
  auto R = [](const DDim& d, double lo = -1, double hi = 1, uint64_t seed = 1) {
    return testing::RandomTensor(d, DType::kFloat32, lo, hi, seed);
  };
  Tensor ids(DType::kInt64, {6, 1});
  for (int i = 0; i < 6; ++i) ids.data<int64_t>()[i] = (i * 3) % 5;
  std::vector<OpCase> cases;
  auto add = [&](std::string type, std::vector<std::pair<std::string, std::vector<Tensor>>> in,
                 std::vector<std::pair<std::string, int>> out,
                 std::map<std::string, Attribute> attrs = {}) {
    OpCase c;
    c.name = type;
    c.type = std::move(type);
    c.inputs = std::move(in);
    c.outputs = std::move(out);
    c.attrs = std::move(attrs);
    cases.push_back(std::move(c));
  };
  add("layer_norm", {{"X", {R({4, 6})}}}, {{"Y", 1}, {"Mean", 1}, {"Variance", 1}});
  add("lookup_table", {{"W", {R({5, 3})}}, {"Ids", {ids}}}, {{"Out", 1}},
      {{"padding_idx", int64_t{3}}});
  add("concat", {{"X", {R({2, 3}), R({2, 4}, -1, 1, 2)}}}, {{"Out", 1}}, {{"axis", 1}});
  add("reduce_sum", {{"X", {R({3, 4, 5})}}}, {{"Out", 1}}, {{"dim", std::vector<int>{0, 2}}});
  add("top_k", {{"X", {R({4, 9})}}}, {{"Out", 1}, {"Indices", 1}}, {{"k", 3}});
  for (OpCase& c : cases) {
    SCOPED_TRACE(testing::Describe(c));
    FLAGS_init_allocated_mem = false;
    auto clean = testing::RunForward(c);
    FLAGS_init_allocated_mem = true;
    auto poisoned = testing::RunForward(c);
    for (auto& [slot, ts] : clean)
      for (size_t i = 0; i < ts.size(); ++i)
        EXPECT_EQ(testing::ToDouble(poisoned[slot][i]), testing::ToDouble(ts[i])) << slot;
    if (!OpRegistry::Get(c.type).has_grad()) continue;
    auto g1 = testing::RunGrads(c, CPUPlace());
    FLAGS_init_allocated_mem = false;
    auto g0 = testing::RunGrads(c, CPUPlace());
    for (auto& [name, g] : g0) EXPECT_EQ(testing::ToDouble(g1[name]), testing::ToDouble(g)) << name;
  }
}

}  // namespace
}  // namespace keel
