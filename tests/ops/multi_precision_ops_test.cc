// The multi_precision path of sgd, momentum, adam and adamw (AMP O2): a float16 / bfloat16 Param
// with its float32 MasterParam and float32 accumulators. The master and the accumulators must come
// out bit for bit as the float32 op computes them from the master and the widened gradient, the
// parameter as the master rounded; a skipped step changes nothing; a 16-bit Param without a
// master, or a master beside a float32 Param, is a keel::Error naming the op. And their float32
// form reading a 16-bit Grad (OpTraits::widens_inputs, fp16_allreduce's narrowed gradients): the
// float32 update of the widened gradient, bit for bit; the ops that do not widen (the merged ones)
// and a float64 Param refuse a 16-bit Grad naming it.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/program_guard.h"
#include "framework/error.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/float16.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

constexpr int64_t kN = 37;

Tensor Floats(std::vector<float> v) {
  Tensor t(DType::kFloat32, DDim({static_cast<int64_t>(v.size())}));
  std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));
  return t;
}

std::vector<float> Values(uint64_t seed, float lo, float hi) {
  const Tensor t = RandomTensor(DDim({kN}), DType::kFloat32, lo, hi, seed);
  return std::vector<float>(t.data<float>(), t.data<float>() + kN);
}

// `v` rounded to `dtype` (float16 or bfloat16), and back as float32.
Tensor Narrowed(const std::vector<float>& v, DType dtype) {
  Tensor t(dtype, DDim({kN}));
  for (int64_t i = 0; i < kN; ++i) {
    if (dtype == DType::kBFloat16) {
      t.data<bfloat16>()[i] = bfloat16(v[i]);
    } else {
      t.data<float16>()[i] = float16(v[i]);
    }
  }
  return t;
}
Tensor Widened(const Tensor& t) {
  std::vector<float> out(kN);
  for (int64_t i = 0; i < kN; ++i)
    out[i] = t.dtype() == DType::kBFloat16 ? static_cast<float>(t.data<bfloat16>()[i])
                                           : static_cast<float>(t.data<float16>()[i]);
  return Floats(out);
}

// Runs `type` once on `inputs` (slot -> tensor), each XOut written into X's var; returns the
// tensors after the step, by input slot.
std::map<std::string, Tensor> Step(const std::string& type,
                                   const std::map<std::string, Tensor>& inputs,
                                   const std::vector<std::pair<std::string, std::string>>& outs,
                                   std::map<std::string, Attribute> attrs) {
  Program prog;
  Block& block = prog.global_block();
  OpDesc::VarMap in_map, out_map;
  for (const auto& [slot, t] : inputs) {
    VarDesc* v = block.Var(slot);
    v->set_dtype(t.dtype());
    v->set_dims(t.dims());
    v->set_is_data(true);
    in_map.emplace_back(slot, std::vector<std::string>{slot});
  }
  for (const auto& [out, in] : outs) out_map.emplace_back(out, std::vector<std::string>{in});
  AppendOp(block, type, in_map, out_map, attrs);
  Executor exe;
  // The executor shares the fed tensors, so the in-place outputs land in them.
  FeedMap feed;
  for (const auto& [slot, t] : inputs) feed[slot] = t.Clone();
  exe.Run(prog, feed);
  return std::map<std::string, Tensor>(feed.begin(), feed.end());
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct OpSpec {
  std::string type;
  std::vector<std::string> accumulators;  // float32 [kN] each
  std::vector<std::string> scalars;       // [1] float32 beta powers
  std::map<std::string, Attribute> attrs;
};

std::vector<OpSpec> Specs() {
  return {{"sgd", {}, {}, {}},
          {"momentum", {"Velocity"}, {}, {{"mu", 0.9f}, {"use_nesterov", true}}},
          {"adam", {"Moment1", "Moment2"}, {"Beta1Pow", "Beta2Pow"}, {}},
          {"adamw", {"Moment1", "Moment2"}, {"Beta1Pow", "Beta2Pow"}, {{"coeff", 0.05f}}}};
}

// The inputs but Param, Grad and MasterParam: the rate, the accumulators, the beta powers, and
// with `skip` a SkipUpdate that holds true.
std::map<std::string, Tensor> CommonInputs(const OpSpec& spec, bool skip) {
  std::map<std::string, Tensor> in;
  in["LearningRate"] = Floats({0.125f});
  for (size_t k = 0; k < spec.accumulators.size(); ++k)
    in[spec.accumulators[k]] = Floats(Values(3 + k, k == 1 ? 0.0f : -0.5f, 0.5f));
  for (size_t k = 0; k < spec.scalars.size(); ++k)
    in[spec.scalars[k]] = Tensor::FromVector(std::vector<float>{k == 0 ? 0.9f : 0.999f}, {1});
  if (skip) {
    Tensor flag(DType::kBool, DDim({1}));
    flag.data<bool>()[0] = true;
    in["SkipUpdate"] = flag;
  }
  return in;
}

// (output, input) pairs: each XOut written into X's var.
std::vector<std::pair<std::string, std::string>> InPlaceOutputs(const OpSpec& spec) {
  std::vector<std::pair<std::string, std::string>> outs = {{"ParamOut", "Param"}};
  for (const std::string& a : spec.accumulators) outs.push_back({a + "Out", a});
  for (const std::string& b : spec.scalars) outs.push_back({b + "Out", b});
  return outs;
}

void CheckMultiPrecision(const OpSpec& spec, DType low, bool skip) {
  SCOPED_TRACE(spec.type + " " + DTypeName(low) + (skip ? " skipped" : ""));
  const std::vector<float> master = Values(1, -2, 2);
  const Tensor grad = Narrowed(Values(2, -1, 1), low);
  const std::map<std::string, Tensor> common = CommonInputs(spec, skip);  // both runs'
  const auto outs = InPlaceOutputs(spec);

  // The float32 op on the master and the widened gradient.
  std::map<std::string, Tensor> ref_in = common;
  ref_in["Param"] = Floats(master);
  ref_in["Grad"] = Widened(grad);
  const std::map<std::string, Tensor> ref = Step(spec.type, ref_in, outs, spec.attrs);

  // The multi_precision op.
  std::map<std::string, Tensor> in = common;
  in["Param"] = Narrowed(master, low);
  in["MasterParam"] = Floats(master);
  in["Grad"] = grad;
  auto mp_outs = outs;
  mp_outs.push_back({"MasterParamOut", "MasterParam"});
  const std::map<std::string, Tensor> got = Step(spec.type, in, mp_outs, spec.attrs);

  EXPECT_TRUE(SameBytes(got.at("MasterParam"), ref.at("Param"))) << "master";
  std::vector<float> master_out(got.at("MasterParam").data<float>(),
                                got.at("MasterParam").data<float>() + kN);
  EXPECT_TRUE(SameBytes(got.at("Param"), Narrowed(master_out, low))) << "param = master rounded";
  for (const std::string& a : spec.accumulators) {
    EXPECT_EQ(got.at(a).dtype(), DType::kFloat32) << a;
    EXPECT_TRUE(SameBytes(got.at(a), ref.at(a))) << a;
  }
  for (const std::string& b : spec.scalars) EXPECT_TRUE(SameBytes(got.at(b), ref.at(b))) << b;
  if (skip) {
    EXPECT_TRUE(SameBytes(got.at("MasterParam"), Floats(master)));
    EXPECT_TRUE(SameBytes(got.at("Param"), Narrowed(master, low)));
  } else {
    EXPECT_FALSE(SameBytes(got.at("MasterParam"), Floats(master))) << "the step did nothing";
  }
}

TEST(MultiPrecisionOps, MasterAndAccumulatorsAreTheFloat32UpdateParamIsItRounded) {
  for (const OpSpec& spec : Specs())
    for (DType low : {DType::kBFloat16, DType::kFloat16})
      for (bool skip : {false, true}) CheckMultiPrecision(spec, low, skip);
}

// A float32 Param with a 16-bit Grad: every output as the float32 op gives them from the widened
// gradient.
void CheckWidenedGrad(const OpSpec& spec, DType low, bool skip) {
  SCOPED_TRACE(spec.type + " widening " + DTypeName(low) + (skip ? " skipped" : ""));
  const std::vector<float> param = Values(1, -2, 2);
  const Tensor grad = Narrowed(Values(2, -1, 1), low);
  std::map<std::string, Tensor> in = CommonInputs(spec, skip);
  in["Param"] = Floats(param);
  const auto outs = InPlaceOutputs(spec);
  std::map<std::string, Tensor> ref_in = in;
  ref_in["Grad"] = Widened(grad);
  in["Grad"] = grad;
  const std::map<std::string, Tensor> ref = Step(spec.type, ref_in, outs, spec.attrs);
  const std::map<std::string, Tensor> got = Step(spec.type, in, outs, spec.attrs);
  for (const auto& [out, slot] : outs) EXPECT_TRUE(SameBytes(got.at(slot), ref.at(slot))) << slot;
  EXPECT_EQ(SameBytes(got.at("Param"), Floats(param)), skip) << "the step changed the parameter";
}

TEST(MultiPrecisionOps, Float32UpdatesReadA16BitGradientAsTheUpdateOfItsCast) {
  for (const OpSpec& spec : Specs()) {
    EXPECT_TRUE(OpRegistry::Traits(spec.type).WidensInput("Grad")) << spec.type;
    for (DType low : {DType::kBFloat16, DType::kFloat16})
      for (bool skip : {false, true}) CheckWidenedGrad(spec, low, skip);
  }
}

TEST(MultiPrecisionOps, A16BitGradientWhereNothingWidensItIsABuildErrorNamingIt) {
  Program prog;
  Block& b = prog.global_block();
  for (auto [name, dt] : {std::pair<const char*, DType>{"p64", DType::kFloat64},
                          {"p", DType::kFloat32},
                          {"g", DType::kBFloat16},
                          {"lr", DType::kFloat32}}) {
    VarDesc* v = b.Var(name);
    v->set_dtype(dt);
    v->set_shape(std::string(name) == "lr" ? std::vector<int64_t>{1} : std::vector<int64_t>{4});
  }
  ExpectErrorContainsAll(ErrorOf([&] {
                           AppendOp(b, "sgd",
                                    {{"Param", {"p64"}}, {"Grad", {"g"}}, {"LearningRate", {"lr"}}},
                                    {{"ParamOut", {"p64"}}});
                         }),
                         {"sgd", "Param is float64, Grad is bfloat16"});
  EXPECT_FALSE(OpRegistry::Traits("merged_sgd").WidensInput("Grad"));
  ExpectErrorContainsAll(ErrorOf([&] {
                           AppendOp(b, "merged_sgd",
                                    {{"Param", {"p"}}, {"Grad", {"g"}}, {"LearningRate", {"lr"}}},
                                    {{"ParamOut", {"p"}}});
                         }),
                         {"merged_sgd", "Grad[0] (g)", "bfloat16", "must match Param[0] (p)"});
}

TEST(MultiPrecisionOps, MissingOrStrayMasterIsAnErrorNamingTheOp) {
  // A bfloat16 Param without its master.
  Program prog;
  Block& b = prog.global_block();
  for (auto [name, dt] : {std::pair<const char*, DType>{"p", DType::kBFloat16},
                          {"g", DType::kBFloat16},
                          {"lr", DType::kFloat32},
                          {"p32", DType::kFloat32},
                          {"g32", DType::kFloat32},
                          {"m", DType::kFloat32}}) {
    VarDesc* v = b.Var(name);
    v->set_dtype(dt);
    v->set_shape(std::string(name) == "lr" ? std::vector<int64_t>{1} : std::vector<int64_t>{4});
  }
  std::string e = ErrorOf([&] {
    AppendOp(b, "sgd", {{"Param", {"p"}}, {"Grad", {"g"}}, {"LearningRate", {"lr"}}},
             {{"ParamOut", {"p"}}});
  });
  ExpectErrorContainsAll(e, {"sgd", "Param is bfloat16", "needs MasterParam"});
  // A master beside a float32 Param.
  e = ErrorOf([&] {
    AppendOp(
        b, "sgd",
        {{"Param", {"p32"}}, {"Grad", {"g32"}}, {"LearningRate", {"lr"}}, {"MasterParam", {"m"}}},
        {{"ParamOut", {"p32"}}, {"MasterParamOut", {"m"}}});
  });
  ExpectErrorContainsAll(e, {"sgd", "Param is float32", "takes no MasterParam"});
}

}  // namespace
}  // namespace keel::testing
