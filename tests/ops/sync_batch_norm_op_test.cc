// sync_batch_norm (ops/sync_batch_norm_ops.cc) in one process, with no ring: gradients by finite
// differences (float64), and the result against batch_norm's on the same inputs: Y, the saved
// statistics, the moving mean and every gradient equal batch_norm's, the moving variance takes
// the unbiased variance (m / (m - 1) times batch_norm's batch term); is_test and use_global_stats
// are batch_norm exactly. The cross-rank sums are tested with real processes in
// tests/fleet/sync_batch_norm_dp_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "framework/op/op_registry.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

struct Params {
  std::string name;
  DDim x;
  bool is_test;
  float momentum, epsilon;
  bool use_global_stats = false;
};

const Params kCases[] = {
    {"nchw_train", {2, 3, 4, 5}, false, 0.9f, 1e-5f},
    {"nc_train", {6, 4}, false, 0.9f, 1e-5f},
    {"nchw_train_momentum_0.5", {3, 2, 3, 3}, false, 0.5f, 1e-3f},
    {"nchw_test", {2, 3, 4, 5}, true, 0.9f, 1e-5f},
    {"nc_use_global_stats", {5, 3}, false, 0.7f, 1e-3f, true},
};

OpCase Case(const Params& p, DType dt, const std::string& type) {
  const DDim c{p.x[1]};
  OpCase o;
  o.name = p.name;
  o.type = type;
  o.inputs = {{"X", {RandomTensor(p.x, dt, -2, 3, 221)}},
              {"Scale", {RandomTensor(c, dt, 0.5, 1.5, 222)}},
              {"Bias", {RandomTensor(c, dt, -1, 1, 223)}},
              {"Mean", {RandomTensor(c, dt, -0.5, 0.5, 224)}},
              {"Variance", {RandomTensor(c, dt, 0.5, 2, 225)}}};
  o.outputs = {
      {"Y", 1}, {"MeanOut", 1}, {"VarianceOut", 1}, {"SavedMean", 1}, {"SavedVariance", 1}};
  o.attrs = {{"is_test", p.is_test},
             {"momentum", p.momentum},
             {"epsilon", p.epsilon},
             {"use_global_stats", p.use_global_stats}};
  o.no_grad_inputs = {"Mean", "Variance"};
  return o;
}

// MeanOut and VarianceOut are updated state, not functions to differentiate: the loss is on Y.
TEST(SyncBatchNormOp, GradMatchesFiniteDifferencesWithoutARing) {
  for (const auto& p : kCases)
    CheckGrad(Case(p, DType::kFloat64, "sync_batch_norm"), 1e-6, 1e-4, 1e-6, {"Y"});
}

TEST(SyncBatchNormOp, AloneItIsBatchNormWithTheUnbiasedMovingVariance) {
  for (const auto& p : kCases)
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(p.name + " " + DTypeName(dt));
      const OpCase bn = Case(p, dt, "batch_norm"), sbn = Case(p, dt, "sync_batch_norm");
      auto want = RunForward(bn);
      auto got = RunForward(sbn);
      const double tol = dt == DType::kFloat32 ? 1e-5 : 1e-12;
      const bool fixed = p.is_test || p.use_global_stats;
      const double m = static_cast<double>(p.x.numel() / p.x[1]);
      const std::vector<double> v_in = ToDouble(bn.inputs[4].second[0]);
      for (const char* slot : {"Y", "MeanOut", "VarianceOut", "SavedMean", "SavedVariance"}) {
        SCOPED_TRACE(slot);
        std::vector<double> w = ToDouble(want.at(slot)[0]), g = ToDouble(got.at(slot)[0]);
        ASSERT_EQ(w.size(), g.size());
        if (slot == std::string("VarianceOut") && !fixed) {
          // batch_norm: mom * v + (1 - mom) * var; sync_batch_norm: the unbiased var.
          for (size_t c = 0; c < w.size(); ++c) {
            const double var = (w[c] - p.momentum * v_in[c]) / (1 - p.momentum);
            w[c] = p.momentum * v_in[c] + (1 - p.momentum) * var * m / (m - 1);
          }
        }
        for (size_t i = 0; i < w.size(); ++i)
          EXPECT_NEAR(g[i], w[i], tol * std::max(1.0, std::abs(w[i]))) << i;
      }
      auto gw = RunGrads(bn, CPUPlace()), gg = RunGrads(sbn, CPUPlace());
      ASSERT_EQ(gw.size(), gg.size());
      for (const auto& [name, t] : gw) {
        SCOPED_TRACE(name);
        ASSERT_TRUE(gg.count(name));
        std::vector<double> w = ToDouble(t), g = ToDouble(gg.at(name));
        ASSERT_EQ(w.size(), g.size());
        for (size_t i = 0; i < w.size(); ++i)
          EXPECT_NEAR(g[i], w[i], tol * 10 * std::max(1.0, std::abs(w[i]))) << i;
      }
    }
}

TEST(SyncBatchNormOp, HasBatchNormsSlotsAndAttrsPlusRingIdAndRunsOnItsRing) {
  const OpSchema& bn = OpRegistry::Get("batch_norm");
  const OpSchema& sbn = OpRegistry::Get("sync_batch_norm");
  ASSERT_EQ(sbn.inputs().size(), bn.inputs().size());
  ASSERT_EQ(sbn.outputs().size(), bn.outputs().size());
  std::vector<std::string> attrs;
  for (const auto& a : bn.attrs()) attrs.push_back(a.name);
  attrs.push_back("ring_id");
  std::vector<std::string> got;
  for (const auto& a : sbn.attrs()) got.push_back(a.name);
  EXPECT_EQ(got, attrs);
  // Its all-reduces are ordered with the ring's other collectives, forward and grad.
  EXPECT_TRUE(OpRegistry::Traits("sync_batch_norm").on_ring);
  EXPECT_TRUE(OpRegistry::Traits("sync_batch_norm_grad").on_ring);
  EXPECT_FALSE(OpRegistry::Traits("batch_norm").on_ring);
  OpCase c = Case(kCases[0], DType::kFloat32, "sync_batch_norm");
  c.attrs["ring_id"] = -1;
  ExpectErrorContainsAll(ForwardError(c), {"sync_batch_norm", "ring_id", ">= 0"});
}

}  // namespace
}  // namespace keel::testing
