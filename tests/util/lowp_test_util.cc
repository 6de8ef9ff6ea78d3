#include "tests/util/lowp_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "executor/executor.h"
#include "framework/autodiff/backward.h"
#include "framework/dsl/program_guard.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/float16.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

bool IsAnyFloat(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}

bool Listed(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

template <typename H>
void ToHalf(const Tensor& t, Tensor* out) {
  for (int64_t i = 0; i < t.numel(); ++i) out->data<H>()[i] = H(t.data<float>()[i]);
}
template <typename H>
void FromHalf(const Tensor& t, Tensor* out) {
  for (int64_t i = 0; i < t.numel(); ++i)
    out->data<float>()[i] = static_cast<float>(t.data<H>()[i]);
}

}  // namespace

Tensor ConvertTensor(const Tensor& t, DType dt) {
  if (t.dtype() == dt) return t.Clone();
  Tensor out(dt, t.dims());
  if (t.dtype() == DType::kFloat32 && dt == DType::kBFloat16) {
    ToHalf<bfloat16>(t, &out);
  } else if (t.dtype() == DType::kFloat32 && dt == DType::kFloat16) {
    ToHalf<float16>(t, &out);
  } else if (t.dtype() == DType::kBFloat16 && dt == DType::kFloat32) {
    FromHalf<bfloat16>(t, &out);
  } else if (t.dtype() == DType::kFloat16 && dt == DType::kFloat32) {
    FromHalf<float16>(t, &out);
  } else {
    ADD_FAILURE() << "ConvertTensor: " << DTypeName(t.dtype()) << " to " << DTypeName(dt);
  }
  return out;
}

Tensor RoundedTo(const Tensor& t, DType dt) {
  return dt == DType::kFloat32 ? t.Clone() : ConvertTensor(ConvertTensor(t, dt), DType::kFloat32);
}

std::vector<double> ValuesOf(const Tensor& t) {
  if (t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16)
    return ValuesOf(ConvertTensor(t, DType::kFloat32));
  return ToDouble(t);
}

double ScaledErr(const Tensor& got, const Tensor& want) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (got.dims() != want.dims()) return kInf;
  const std::vector<double> g = ValuesOf(got), w = ValuesOf(want);
  double ss = 0;
  int64_t n = 0;
  for (double v : w)
    if (std::isfinite(v)) ss += v * v, ++n;
  const double rms = n > 0 ? std::sqrt(ss / static_cast<double>(n)) : 0.0;
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i]) || std::isnan(g[i])) {
      if (std::isnan(w[i]) != std::isnan(g[i])) return kInf;
      continue;
    }
    if (std::isinf(w[i]) || std::isinf(g[i])) {
      if (w[i] != g[i]) return kInf;
      continue;
    }
    const double d = std::abs(g[i] - w[i]), denom = std::abs(w[i]) + rms;
    worst = std::max(worst, denom > 0 ? d / denom : (d == 0 ? 0.0 : kInf));
  }
  return worst;
}

double HalfTolerance(DType dt) { return dt == DType::kBFloat16 ? 1.6e-2 : 2e-3; }

OpCase Reference(const LowpCase& c, DType dt) {
  OpCase r = c.op;
  for (auto& [slot, ts] : r.inputs)
    if (!Listed(c.keep_f32, slot))
      for (Tensor& t : ts)
        if (t.dtype() == DType::kFloat32) t = RoundedTo(t, dt);
  return r;
}

OpCase InHalf(const LowpCase& c, DType dt) {
  OpCase r = c.op;
  for (auto& [slot, ts] : r.inputs)
    if (!Listed(c.keep_f32, slot))
      for (Tensor& t : ts)
        if (t.dtype() == DType::kFloat32) t = ConvertTensor(t, dt);
  return r;
}

std::map<std::string, std::vector<Tensor>> Forward(const OpCase& c, const Place& place) {
  return RunForward(c, place);
}

std::map<std::string, Tensor> Grads(const OpCase& c, const Place& place, DType w_dtype) {
  Program prog;
  Block& block = prog.global_block();
  FeedMap feed;
  OpDesc::VarMap ins, outs;
  std::vector<std::string> checked;
  for (auto& [slot, tensors] : c.inputs) {
    std::vector<std::string> names;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string n = slot + "_" + std::to_string(i);
      VarDesc* v = block.Var(n);
      v->set_dtype(tensors[i].dtype());
      v->set_dims(tensors[i].dims());
      v->set_is_data(true);
      const bool grad = IsAnyFloat(tensors[i].dtype()) && !Listed(c.no_grad_inputs, slot);
      v->set_stop_gradient(!grad);
      if (grad) checked.push_back(n);
      feed[n] = tensors[i];
      names.push_back(n);
    }
    ins.emplace_back(slot, names);
  }
  std::vector<std::string> out_names;
  for (auto& [slot, count] : c.outputs) {
    std::vector<std::string> names;
    for (int i = 0; i < count; ++i) names.push_back(slot + "_out_" + std::to_string(i));
    out_names.insert(out_names.end(), names.begin(), names.end());
    outs.emplace_back(slot, names);
  }
  AppendOp(block, c.type, ins, outs, c.attrs);
  std::vector<std::string> terms;
  uint64_t seed = 7;
  for (const std::string& n : out_names) {
    VarDesc* out = block.FindVar(n);
    if (!IsAnyFloat(out->dtype())) continue;
    std::string f = n;
    if (out->dtype() != DType::kFloat32) {
      f = n + "_f32";
      AppendOp(block, "cast", {{"X", {n}}}, {{"Out", {f}}},
               {{"out_dtype", static_cast<int>(DType::kFloat32)}});
    }
    const std::string w = n + "_w", prod = n + "_prod", s = n + "_sum";
    feed[w] = RoundedTo(RandomTensor(out->dims(), DType::kFloat32, 0.5, 1.5, seed++), w_dtype);
    VarDesc* wv = block.Var(w);
    wv->set_dtype(DType::kFloat32);
    wv->set_shape(out->shape());
    wv->set_is_data(true);
    wv->set_stop_gradient(true);
    AppendOp(block, "elementwise_mul", {{"X", {f}}, {"Y", {w}}}, {{"Out", {prod}}});
    AppendOp(block, "reduce_sum", {{"X", {prod}}}, {{"Out", {s}}}, {{"reduce_all", true}});
    terms.push_back(s);
  }
  std::map<std::string, Tensor> r;
  if (terms.empty()) return r;
  AppendOp(block, "sum", {{"X", terms}}, {{"Out", {"loss"}}});
  append_backward(prog, "loss");
  std::vector<std::string> names, fetch;
  for (const std::string& n : checked)
    if (block.FindVar(GradVarName(n)) != nullptr) {
      names.push_back(n);
      fetch.push_back(GradVarName(n));
    }
  if (fetch.empty()) return r;
  Executor exe(place);
  std::vector<Tensor> grads = exe.Run(prog, feed, fetch);
  for (size_t k = 0; k < names.size(); ++k) r[names[k]] = grads[k];
  return r;
}

void ExpectMatchesFloat32(const LowpCase& c, DType dt, const Place& place) {
  SCOPED_TRACE(Describe(c.op) + " in " + DTypeName(dt) + " on " + place.str());
  const double tol = HalfTolerance(dt) * c.tol_scale;
  const OpCase ref = Reference(c, dt), low = InHalf(c, dt);
  std::map<std::string, std::vector<Tensor>> want, got;
  ASSERT_EQ(ErrorOf([&] { want = Forward(ref, CPUPlace()); }), "");
  ASSERT_EQ(ErrorOf([&] { got = Forward(low, place); }), "");
  for (auto& [slot, ts] : want)
    for (size_t i = 0; i < ts.size(); ++i) {
      const Tensor& g = got[slot][i];
      // An output of the float32 run's float32 data is of dt in the 16-bit run, or stays float32
      // (statistics); others keep their dtype.
      if (ts[i].dtype() == DType::kFloat32)
        EXPECT_TRUE(g.dtype() == dt || g.dtype() == DType::kFloat32) << DTypeName(g.dtype());
      else
        EXPECT_EQ(g.dtype(), ts[i].dtype()) << slot;
      EXPECT_LE(ScaledErr(g, ts[i]), tol) << "forward " << slot << "[" << i << "]";
    }
  if (!c.grads) return;
  std::map<std::string, Tensor> gw, gg;
  ASSERT_EQ(ErrorOf([&] { gw = Grads(ref, CPUPlace(), dt); }), "");
  ASSERT_EQ(ErrorOf([&] { gg = Grads(low, place, dt); }), "");
  ASSERT_FALSE(gw.empty()) << "no gradient to compare";
  std::map<std::string, DType> input_dtype;  // each input var's, in the 16-bit run
  for (auto& [slot, ts] : low.inputs)
    for (size_t i = 0; i < ts.size(); ++i)
      input_dtype[slot + "_" + std::to_string(i)] = ts[i].dtype();
  for (auto& [name, w] : gw) {
    ASSERT_TRUE(gg.count(name)) << "no gradient of " << name;
    EXPECT_EQ(gg[name].dtype(), input_dtype[name]) << "gradient of " << name;
    EXPECT_LE(ScaledErr(gg[name], w), tol) << "gradient of " << name;
  }
}

namespace {

Tensor Rnd(const DDim& d, double lo = -1, double hi = 1, uint64_t seed = 1) {
  return RandomTensor(d, DType::kFloat32, lo, hi, seed);
}

LowpCase Case(std::string name, std::string type,
              std::vector<std::pair<std::string, std::vector<Tensor>>> inputs,
              std::vector<std::pair<std::string, int>> outputs = {{"Out", 1}},
              std::map<std::string, Attribute> attrs = {}) {
  LowpCase c;
  c.op.name = std::move(name);
  c.op.type = std::move(type);
  c.op.inputs = std::move(inputs);
  c.op.outputs = std::move(outputs);
  c.op.attrs = std::move(attrs);
  return c;
}

std::vector<int> V(std::initializer_list<int> v) { return std::vector<int>(v); }

}  // namespace

std::vector<LowpCase> LowpCases() {
  std::vector<LowpCase> v;
  auto add = [&](LowpCase c) { v.push_back(std::move(c)); };
  // Element-wise binaries: same shape, a bias row, Y in the middle of X (axis 1), odd sizes.
  for (const char* op :
       {"elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div"}) {
    const bool div = std::string(op) == "elementwise_div";
    const double ylo = div ? 0.5 : -1, yhi = div ? 2 : 1;
    add(Case(std::string(op) + "_same", op,
             {{"X", {Rnd({7, 13})}}, {"Y", {Rnd({7, 13}, ylo, yhi, 2)}}}));
    add(Case(std::string(op) + "_bias", op,
             {{"X", {Rnd({9, 33})}}, {"Y", {Rnd({33}, ylo, yhi, 3)}}}));
    add(Case(std::string(op) + "_axis1", op,
             {{"X", {Rnd({3, 5, 7})}}, {"Y", {Rnd({5}, ylo, yhi, 4)}}}, {{"Out", 1}},
             {{"axis", 1}}));
  }
  // A bias gradient summed over many rows: float32 sums.
  add(Case("elementwise_add_long_bias", "elementwise_add",
           {{"X", {Rnd({257, 3})}}, {"Y", {Rnd({3}, -1, 1, 5)}}}));
  // Activations.
  add(Case("relu", "relu", {{"X", {Rnd({9, 33})}}}));
  add(Case("tanh", "tanh", {{"X", {Rnd({9, 33}, -3, 3)}}}));
  add(Case("sigmoid", "sigmoid", {{"X", {Rnd({9, 33}, -4, 4)}}}));
  add(Case("gelu", "gelu", {{"X", {Rnd({5, 1031}, -3, 3)}}}));
  add(Case("gelu_tanh", "gelu", {{"X", {Rnd({3, 77}, -3, 3)}}}, {{"Out", 1}},
           {{"approximate", true}}));
  add(Case("leaky_relu", "leaky_relu", {{"X", {Rnd({7, 11})}}}, {{"Out", 1}}, {{"alpha", 0.1f}}));
  add(Case("clip", "clip", {{"X", {Rnd({7, 11})}}}, {{"Out", 1}}, {{"min", -0.5f}, {"max", 0.5f}}));
  add(Case("scale", "scale", {{"X", {Rnd({7, 11})}}}, {{"Out", 1}},
           {{"scale", 0.75f}, {"bias", 0.25f}}));
  add(Case("scale_bias_first", "scale", {{"X", {Rnd({5, 3})}}}, {{"Out", 1}},
           {{"scale", 2.0f}, {"bias", -0.5f}, {"bias_after_scale", false}}));
  add(Case("sum3", "sum", {{"X", {Rnd({5, 7}), Rnd({5, 7}, -1, 1, 2), Rnd({5, 7}, -1, 1, 3)}}}));
  // Two terms: one vector pass of AddN on the CPU (a length with a tail of the vector width).
  add(Case("sum2", "sum", {{"X", {Rnd({9, 37}), Rnd({9, 37}, -1, 1, 2)}}}));
  // Dropout: the mask is the float32 kernel's, bit for bit.
  add(Case("dropout", "dropout", {{"X", {Rnd({33, 65})}}}, {{"Out", 1}, {"Mask", 1}},
           {{"dropout_prob", 0.3f}, {"seed", 77}}));
  {
    LowpCase c = Case("dropout_is_test", "dropout", {{"X", {Rnd({9, 4})}}}, {{"Out", 1}},
                      {{"dropout_prob", 0.25f},
                       {"is_test", true},
                       {"dropout_implementation", std::string("downgrade_in_infer")}});
    add(c);
  }
  // Pooling: overlapping max windows with padding, the 2x2 tiling, average windows.
  add(Case("max_pool_3x3_s2", "pool2d", {{"X", {Rnd({2, 3, 9, 9})}}}, {{"Out", 1}},
           {{"pooling_type", std::string("max")},
            {"ksize", V({3, 3})},
            {"strides", V({2, 2})},
            {"paddings", V({1, 1})}}));
  add(Case("max_pool_2x2", "pool2d", {{"X", {Rnd({2, 3, 8, 7})}}}, {{"Out", 1}},
           {{"pooling_type", std::string("max")}, {"ksize", V({2, 2})}, {"strides", V({2, 2})}}));
  add(Case("avg_pool_3x3", "pool2d", {{"X", {Rnd({2, 3, 7, 9})}}}, {{"Out", 1}},
           {{"pooling_type", std::string("avg")},
            {"ksize", V({3, 3})},
            {"strides", V({2, 2})},
            {"paddings", V({1, 1})}}));
  add(Case("avg_pool_global", "pool2d", {{"X", {Rnd({2, 5, 6, 6})}}}, {{"Out", 1}},
           {{"pooling_type", std::string("avg")}, {"global_pooling", true}}));
  // Channels last (X [N, H, W, C]).
  add(Case("max_pool_3x3_s2_nhwc", "pool2d", {{"X", {Rnd({2, 9, 9, 3})}}}, {{"Out", 1}},
           {{"pooling_type", std::string("max")},
            {"ksize", V({3, 3})},
            {"strides", V({2, 2})},
            {"paddings", V({1, 1})},
            {"data_format", std::string("NHWC")}}));
  add(Case("avg_pool_global_nhwc", "pool2d", {{"X", {Rnd({2, 6, 6, 5})}}}, {{"Out", 1}},
           {{"pooling_type", std::string("avg")},
            {"global_pooling", true},
            {"data_format", std::string("NHWC")}}));
  // Normalizations: 16-bit X and Y, float32 parameters and statistics.
  for (bool is_test : {false, true}) {
    LowpCase c =
        Case(is_test ? "batch_norm_is_test" : "batch_norm", "batch_norm",
             {{"X", {Rnd({4, 3, 5, 5}, -2, 3)}},
              {"Scale", {Rnd({3}, 0.5, 1.5, 2)}},
              {"Bias", {Rnd({3}, -1, 1, 3)}},
              {"Mean", {Rnd({3}, -0.5, 0.5, 4)}},
              {"Variance", {Rnd({3}, 0.5, 1.5, 5)}}},
             {{"Y", 1}, {"MeanOut", 1}, {"VarianceOut", 1}, {"SavedMean", 1}, {"SavedVariance", 1}},
             {{"is_test", is_test}});
    c.keep_f32 = {"Scale", "Bias", "Mean", "Variance"};
    c.op.no_grad_inputs = {"Mean", "Variance"};
    add(c);
    // Channels last: X [N, H, W, C].
    c.op.name += "_nhwc";
    c.op.inputs[0].second[0] = Rnd({4, 5, 5, 3}, -2, 3);
    c.op.attrs["data_layout"] = std::string("NHWC");
    add(c);
  }
  {
    LowpCase c = Case(
        "batch_norm_2d", "batch_norm",
        {{"X", {Rnd({33, 6})}},
         {"Scale", {Rnd({6}, 0.5, 1.5, 2)}},
         {"Bias", {Rnd({6}, -1, 1, 3)}},
         {"Mean", {Rnd({6}, -0.5, 0.5, 4)}},
         {"Variance", {Rnd({6}, 0.5, 1.5, 5)}}},
        {{"Y", 1}, {"MeanOut", 1}, {"VarianceOut", 1}, {"SavedMean", 1}, {"SavedVariance", 1}});
    c.keep_f32 = {"Scale", "Bias", "Mean", "Variance"};
    c.op.no_grad_inputs = {"Mean", "Variance"};
    add(c);
  }
  {
    LowpCase c = Case("layer_norm", "layer_norm",
                      {{"X", {Rnd({6, 37}, -2, 3)}},
                       {"Scale", {Rnd({37}, 0.5, 1.5, 2)}},
                       {"Bias", {Rnd({37}, -1, 1, 3)}}},
                      {{"Y", 1}, {"Mean", 1}, {"Variance", 1}}, {{"begin_norm_axis", 1}});
    c.keep_f32 = {"Scale", "Bias"};
    add(c);
    LowpCase d = Case("layer_norm_3d_no_affine", "layer_norm", {{"X", {Rnd({2, 3, 300})}}},
                      {{"Y", 1}, {"Mean", 1}, {"Variance", 1}}, {{"begin_norm_axis", 2}});
    add(d);
  }
  // GEMMs: float32 accumulation, one rounding of each output; a batched matmul with a shared Y,
  // transposes, alpha, and a shared 2-D Y whose gradient sums over the batch (in float32).
  add(Case("mul", "mul", {{"X", {Rnd({7, 19})}}, {"Y", {Rnd({19, 11}, -1, 1, 2)}}}));
  add(Case("mul_flatten", "mul", {{"X", {Rnd({2, 3, 4})}}, {"Y", {Rnd({4, 5}, -1, 1, 2)}}},
           {{"Out", 1}}, {{"x_num_col_dims", 2}}));
  add(Case("matmul_batched", "matmul",
           {{"X", {Rnd({3, 5, 17})}}, {"Y", {Rnd({3, 17, 6}, -1, 1, 2)}}}));
  add(Case("matmul_tx_ty_alpha", "matmul",
           {{"X", {Rnd({2, 17, 5})}}, {"Y", {Rnd({2, 6, 17}, -1, 1, 2)}}}, {{"Out", 1}},
           {{"transpose_X", true}, {"transpose_Y", true}, {"alpha", 0.5f}}));
  add(Case("matmul_shared_y", "matmul",
           {{"X", {Rnd({2, 3, 5, 7})}}, {"Y", {Rnd({7, 4}, -1, 1, 2)}}}));
  add(Case("matmul_tx_shared_y", "matmul",
           {{"X", {Rnd({4, 7, 5})}}, {"Y", {Rnd({7, 3}, -1, 1, 2)}}}, {{"Out", 1}},
           {{"transpose_X", true}}));
  add(Case("matmul_shared_x", "matmul", {{"X", {Rnd({5, 7})}}, {"Y", {Rnd({6, 7, 3}, -1, 1, 2)}}}));
  // Convolutions: padding, stride, groups, a 1x1.
  add(Case("conv2d_3x3", "conv2d",
           {{"Input", {Rnd({2, 3, 9, 9})}}, {"Filter", {Rnd({4, 3, 3, 3}, -1, 1, 2)}}},
           {{"Output", 1}}, {{"paddings", V({1, 1})}}));
  add(Case("conv2d_s2_groups", "conv2d",
           {{"Input", {Rnd({3, 4, 8, 7})}}, {"Filter", {Rnd({6, 2, 3, 3}, -1, 1, 2)}}},
           {{"Output", 1}}, {{"strides", V({2, 2})}, {"paddings", V({1, 1})}, {"groups", 2}}));
  add(Case("conv2d_1x1", "conv2d",
           {{"Input", {Rnd({2, 16, 5, 5})}}, {"Filter", {Rnd({8, 16, 1, 1}, -1, 1, 2)}}},
           {{"Output", 1}}));
  // LeNet's first convolution (one input channel: oneDNN has only im2col for its bfloat16 filter
  // gradient, so it runs widened) and a 16-channel one (16-channel blocks by keel's transposes).
  add(Case("conv2d_lenet1", "conv2d",
           {{"Input", {Rnd({3, 1, 28, 28})}}, {"Filter", {Rnd({6, 1, 5, 5}, -1, 1, 2)}}},
           {{"Output", 1}}, {{"paddings", V({2, 2})}}));
  add(Case("conv2d_16ch", "conv2d",
           {{"Input", {Rnd({2, 16, 12, 12})}}, {"Filter", {Rnd({16, 16, 3, 3}, -1, 1, 2)}}},
           {{"Output", 1}}, {{"paddings", V({1, 1})}}));
  // Channels last: Input [N, H, W, C], the filter as in NCHW (stride 2 and groups too).
  add(Case("conv2d_16ch_nhwc", "conv2d",
           {{"Input", {Rnd({2, 12, 12, 16})}}, {"Filter", {Rnd({16, 16, 3, 3}, -1, 1, 2)}}},
           {{"Output", 1}}, {{"paddings", V({1, 1})}, {"data_format", std::string("NHWC")}}));
  add(Case("conv2d_s2_groups_nhwc", "conv2d",
           {{"Input", {Rnd({3, 8, 7, 4})}}, {"Filter", {Rnd({6, 2, 3, 3}, -1, 1, 2)}}},
           {{"Output", 1}},
           {{"strides", V({2, 2})},
            {"paddings", V({1, 1})},
            {"groups", 2},
            {"data_format", std::string("NHWC")}}));
  // Casts back to float32 (the pass's cast of the loss); its gradient is the 16-bit cast.
  add(Case("cast_to_f32", "cast", {{"X", {Rnd({7, 5})}}}, {{"Out", 1}},
           {{"out_dtype", static_cast<int>(DType::kFloat32)}}));
  // Layout ops move bits: exact.
  auto exact = [&](LowpCase c) {
    c.tol_scale = 0;
    add(std::move(c));
  };
  exact(Case("transpose", "transpose", {{"X", {Rnd({2, 3, 4, 5})}}}, {{"Out", 1}},
             {{"axis", V({0, 2, 1, 3})}}));
  exact(Case("concat", "concat", {{"X", {Rnd({2, 3, 2}), Rnd({2, 1, 2}, -1, 1, 2)}}}, {{"Out", 1}},
             {{"axis", 1}}));
  exact(Case("split", "split", {{"X", {Rnd({4, 6})}}}, {{"Out", 3}}, {{"num", 3}, {"axis", 1}}));
  exact(
      Case("reshape", "reshape", {{"X", {Rnd({4, 6})}}}, {{"Out", 1}}, {{"shape", V({0, -1, 2})}}));
  exact(Case("flatten", "flatten", {{"X", {Rnd({2, 3, 4})}}}, {{"Out", 1}}, {{"axis", 2}}));
  exact(Case("squeeze", "squeeze", {{"X", {Rnd({3, 1, 2})}}}, {{"Out", 1}}, {{"axes", V({1})}}));
  exact(
      Case("unsqueeze", "unsqueeze", {{"X", {Rnd({3, 2})}}}, {{"Out", 1}}, {{"axes", V({0, -1})}}));
  {
    LowpCase c = Case("assign", "assign", {{"X", {Rnd({4, 6})}}});
    c.tol_scale = 0;
    c.grads = false;
    add(c);
    LowpCase z = Case("fill_zeros_like", "fill_zeros_like", {{"X", {Rnd({3, 4})}}});
    z.tol_scale = 0;
    z.grads = false;
    add(z);
  }
  return v;
}

}  // namespace keel::testing
