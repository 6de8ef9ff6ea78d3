// Loss-scaling ops: update_loss_scaling against a table of Paddle's rule (grow, shrink, the floor
// at 1, the counters, stop_update), check_finite_and_unscale's division and its inf/NaN flag, and
// the update ops' SkipUpdate: a skipped step leaves parameters and accumulators bit-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/program_guard.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;
using testing::ExpectErrorContainsAll;

template <typename T>
Tensor Of(DType dt, const std::vector<T>& v) {
  Tensor t(dt, DDim({static_cast<int64_t>(v.size())}));
  for (size_t i = 0; i < v.size(); ++i) t.data<T>()[i] = v[i];
  return t;
}

// One op in a program whose inputs are data vars fed from `feed`, outputs fetched by name.
std::map<std::string, Tensor> RunOp(const std::string& type, const FeedMap& feed,
                                    const OpDesc::VarMap& inputs, const OpDesc::VarMap& outputs,
                                    const std::map<std::string, Attribute>& attrs = {}) {
  Program prog;
  Block& b = prog.global_block();
  for (const auto& [name, t] : feed) {
    VarDesc* v = b.Var(name);
    v->set_dtype(t.dtype());
    v->set_dims(t.dims());
    v->set_is_data(true);
  }
  AppendOp(b, type, inputs, outputs, attrs);
  std::vector<std::string> fetch;
  for (const auto& [slot, names] : outputs) fetch.insert(fetch.end(), names.begin(), names.end());
  Executor exe;
  std::vector<Tensor> got = exe.Run(prog, feed, fetch);
  std::map<std::string, Tensor> out;
  for (size_t i = 0; i < fetch.size(); ++i) out[fetch[i]] = got[i];
  return out;
}

struct ScaleCase {
  bool found_inf;
  float prev;
  int good, bad;
  float want_scale;
  int want_good, want_bad;
};

TEST(UpdateLossScalingOp, FollowsPaddlesRuleRowByRow) {
  const std::map<std::string, Attribute> attrs = {{"incr_every_n_steps", 3},
                                                  {"decr_every_n_nan_or_inf", 2},
                                                  {"incr_ratio", 2.0f},
                                                  {"decr_ratio", 0.5f}};
  const float inf = std::numeric_limits<float>::infinity();
  const ScaleCase cases[] = {
      {false, 8.0f, 0, 0, 8.0f, 1, 0},    // a good step counts
      {false, 8.0f, 1, 1, 8.0f, 2, 0},    // and clears the bad count
      {false, 8.0f, 2, 0, 16.0f, 0, 0},   // the 3rd good step in a row grows the scale
      {true, 8.0f, 2, 0, 8.0f, 0, 1},     // an overflow clears good; 1 of 2 bad: no change
      {true, 8.0f, 0, 1, 4.0f, 0, 0},     // the 2nd bad step shrinks it
      {true, 1.5f, 0, 1, 1.0f, 0, 0},     // never below 1
      {true, 1.0f, 0, 1, 1.0f, 0, 0},     // at 1 it stays 1
      {false, 3e38f, 2, 0, 3e38f, 0, 0},  // growth to infinity keeps the old scale
  };
  for (const ScaleCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "found_inf=" << c.found_inf << " prev=" << c.prev
                                      << " good=" << c.good << " bad=" << c.bad);
    auto out =
        RunOp("update_loss_scaling",
              {{"f", Of<bool>(DType::kBool, {c.found_inf})},
               {"s", Of<float>(DType::kFloat32, {c.prev})},
               {"g", Of<int32_t>(DType::kInt32, {c.good})},
               {"b", Of<int32_t>(DType::kInt32, {c.bad})}},
              {{"FoundInfinite", {"f"}},
               {"PrevLossScaling", {"s"}},
               {"InGoodSteps", {"g"}},
               {"InBadSteps", {"b"}}},
              {{"LossScaling", {"s2"}}, {"OutGoodSteps", {"g2"}}, {"OutBadSteps", {"b2"}}}, attrs);
    EXPECT_EQ(out["s2"].data<float>()[0], c.want_scale);
    EXPECT_EQ(out["g2"].data<int32_t>()[0], c.want_good);
    EXPECT_EQ(out["b2"].data<int32_t>()[0], c.want_bad);
    EXPECT_NE(out["s2"].data<float>()[0], inf);
  }
  // stop_update copies everything through.
  auto attrs_stop = attrs;
  attrs_stop["stop_update"] = true;
  auto out = RunOp("update_loss_scaling",
                   {{"f", Of<bool>(DType::kBool, {true})},
                    {"s", Of<float>(DType::kFloat32, {8.0f})},
                    {"g", Of<int32_t>(DType::kInt32, {0})},
                    {"b", Of<int32_t>(DType::kInt32, {1})}},
                   {{"FoundInfinite", {"f"}},
                    {"PrevLossScaling", {"s"}},
                    {"InGoodSteps", {"g"}},
                    {"InBadSteps", {"b"}}},
                   {{"LossScaling", {"s2"}}, {"OutGoodSteps", {"g2"}}, {"OutBadSteps", {"b2"}}},
                   attrs_stop);
  EXPECT_EQ(out["s2"].data<float>()[0], 8.0f);
  EXPECT_EQ(out["b2"].data<int32_t>()[0], 1);
}

TEST(UpdateLossScalingOp, BadAttrsAreRefusedByName) {
  for (const auto& bad :
       std::vector<std::pair<std::string, Attribute>>{{"incr_every_n_steps", 0},
                                                      {"decr_every_n_nan_or_inf", 0},
                                                      {"incr_ratio", 1.0f},
                                                      {"decr_ratio", 1.5f}}) {
    const std::string& attr = bad.first;
    const Attribute& value = bad.second;
    const std::string msg = ErrorOf([&] {
      RunOp("update_loss_scaling",
            {{"f", Of<bool>(DType::kBool, {false})},
             {"s", Of<float>(DType::kFloat32, {8.0f})},
             {"g", Of<int32_t>(DType::kInt32, {0})},
             {"b", Of<int32_t>(DType::kInt32, {0})}},
            {{"FoundInfinite", {"f"}},
             {"PrevLossScaling", {"s"}},
             {"InGoodSteps", {"g"}},
             {"InBadSteps", {"b"}}},
            {{"LossScaling", {"s2"}}, {"OutGoodSteps", {"g2"}}, {"OutBadSteps", {"b2"}}},
            {{attr, value}});
    });
    ExpectErrorContainsAll(msg, {"update_loss_scaling", attr});
  }
}

TEST(CheckFiniteAndUnscaleOp, DividesByTheScaleAndFlagsInfAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::vector<float> a, b;
    bool want_found;
  };
  const Case cases[] = {{{2, -4, 8}, {16, 0.5}, false},
                        {{2, inf, 8}, {16, 0.5}, true},
                        {{2, 4, 8}, {nan, 0.5}, true},
                        {{2, 4, 8}, {16, -inf}, true}};
  for (const Case& c : cases) {
    auto out = RunOp("check_finite_and_unscale",
                     {{"a", Of<float>(DType::kFloat32, c.a)},
                      {"b", Of<float>(DType::kFloat32, c.b)},
                      {"scale", Of<float>(DType::kFloat32, {4.0f})}},
                     {{"X", {"a", "b"}}, {"Scale", {"scale"}}},
                     {{"Out", {"a2", "b2"}}, {"FoundInfinite", {"found"}}});
    EXPECT_EQ(out["found"].data<bool>()[0], c.want_found);
    for (size_t i = 0; i < c.a.size(); ++i) {
      const float want = c.a[i] / 4.0f, got = out["a2"].data<float>()[i];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got));
      } else {
        EXPECT_EQ(got, want);
      }
    }
  }
}

// One update op (type) with SkipUpdate fed true, then false: true leaves every output equal to
// its input bit for bit; false changes the parameter.
void CheckSkip(const std::string& type, const std::vector<std::string>& accs,
               const std::vector<std::string>& scalars,
               const std::map<std::string, Attribute>& attrs) {
  SCOPED_TRACE(type);
  const std::vector<float> param = {0.5f, -1.25f, 2.0f}, grad = {0.1f, 0.2f, -0.3f};
  FeedMap feed = {{"p", Of<float>(DType::kFloat32, param)},
                  {"g", Of<float>(DType::kFloat32, grad)},
                  {"lr", Of<float>(DType::kFloat32, {0.1f})}};
  OpDesc::VarMap in = {
      {"Param", {"p"}}, {"Grad", {"g"}}, {"LearningRate", {"lr"}}, {"SkipUpdate", {"skip"}}};
  OpDesc::VarMap out = {{"ParamOut", {"p_out"}}};
  for (const std::string& a : accs) {
    feed[a] = Of<float>(DType::kFloat32, {0.3f, 0.2f, 0.1f});
    in.push_back({a, {a}});
    out.push_back({a + "Out", {a + "_out"}});
  }
  for (const std::string& s : scalars) {
    feed[s] = Of<float>(DType::kFloat32, {0.9f});
    in.push_back({s, {s}});
    out.push_back({s + "Out", {s + "_out"}});
  }
  for (bool skip : {true, false}) {
    feed["skip"] = Of<bool>(DType::kBool, {skip});
    auto got = RunOp(type, feed, in, out, attrs);
    const bool same =
        std::memcmp(got["p_out"].data<float>(), feed["p"].data<float>(), 3 * sizeof(float)) == 0;
    EXPECT_EQ(same, skip) << "skip=" << skip;
    if (!skip) continue;
    for (const std::string& a : accs)
      EXPECT_EQ(
          std::memcmp(got[a + "_out"].data<float>(), feed[a].data<float>(), 3 * sizeof(float)), 0)
          << a;
    for (const std::string& s : scalars)
      EXPECT_EQ(got[s + "_out"].data<float>()[0], feed[s].data<float>()[0]) << s;
  }
}

TEST(OptimizerOps, SkipUpdateLeavesParametersAndAccumulatorsBitIdentical) {
  CheckSkip("sgd", {}, {}, {});
  CheckSkip("momentum", {"Velocity"}, {}, {});
  CheckSkip("adam", {"Moment1", "Moment2"}, {"Beta1Pow", "Beta2Pow"}, {});
  CheckSkip("adamw", {"Moment1", "Moment2"}, {"Beta1Pow", "Beta2Pow"}, {});
}

}  // namespace
}  // namespace keel
