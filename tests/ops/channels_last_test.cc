// Tests of channels-last conv2d, pool2d and batch_norm on the CPU (data_format / data_layout
// NHWC, framework/op/image_layout.h): each op on NHWC inputs equals the same op on the NCHW inputs
// they transpose, every output and every gradient: bit for bit where the CPU runs the same loops
// over NCHW copies (float64 and keel's own float32 convolutions, pooling), to rounding where
// oneDNN runs its channels-last primitives or batch_norm sums a channel in another order.
// Gradients by finite differences in NHWC; a layout the ops do not know is refused naming the attr.
#include <gtest/gtest.h>

#include <gflags/gflags.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "framework/error.h"
#include "tests/util/grad_checker.h"
#include "tests/util/image_op_cases.h"
#include "tests/util/lowp_test_util.h"
#include "tests/util/op_test_util.h"

DECLARE_bool(conv_onednn);

namespace keel::testing {
namespace {

// A 4-D tensor moved between NCHW and NHWC, any dtype (the bytes of each element move).
Tensor Permuted(const Tensor& t, bool to_nhwc) {
  const DDim d = t.dims();
  // NCHW dims of the tensor either way.
  const int64_t N = d[0], C = to_nhwc ? d[1] : d[3], H = to_nhwc ? d[2] : d[1],
                W = to_nhwc ? d[3] : d[2];
  Tensor out(t.dtype(), to_nhwc ? DDim{N, H, W, C} : DDim{N, C, H, W});
  const size_t e = SizeOf(t.dtype());
  const char* s = static_cast<const char*>(t.raw_data());
  char* o = static_cast<char*>(out.raw_data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < H * W; ++p) {
        const int64_t nchw = (n * C + c) * H * W + p, nhwc = (n * H * W + p) * C + c;
        std::memcpy(o + (to_nhwc ? nhwc : nchw) * e, s + (to_nhwc ? nchw : nhwc) * e, e);
      }
  return out;
}
Tensor ToNhwc(const Tensor& t) { return Permuted(t, true); }
Tensor ToNchw(const Tensor& t) { return Permuted(t, false); }

// The NHWC twin of an NCHW op case: the 4-D inputs in `slots` transposed, the layout attr set.
OpCase ChannelsLast(OpCase c, const std::vector<std::string>& slots, const std::string& attr) {
  c.name += "_nhwc";
  c.attrs[attr] = std::string("NHWC");
  for (auto& [slot, ts] : c.inputs)
    if (std::find(slots.begin(), slots.end(), slot) != slots.end())
      for (Tensor& t : ts) t = ToNhwc(t);
  return c;
}

// |a - b| <= tol * max|a| + tol elementwise (tol 0: the same bits).
void ExpectSame(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.dims(), want.dims());
  ASSERT_EQ(got.dtype(), want.dtype());
  if (tol == 0) {
    EXPECT_EQ(0, std::memcmp(got.raw_data(), want.raw_data(), got.nbytes())) << "not bitwise";
    return;
  }
  const std::vector<double> a = ValuesOf(want), b = ValuesOf(got);
  double scale = 0;
  for (double v : a) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(b[i], a[i], tol * scale + tol) << "element " << i << " of " << a.size();
}

// ------------------------------------------------------------------------------------- conv2d

const ConvParams kConvCases[] = {
    {"basic", {2, 3, 5, 5}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
    {"pad1_stride2", {2, 3, 7, 6}, {4, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
    {"dilation2", {1, 2, 9, 8}, {3, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 1},
    {"groups2", {2, 4, 6, 6}, {6, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2},
    {"one_by_one", {2, 4, 5, 5}, {3, 4, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
    {"rect_mixed", {2, 2, 7, 8}, {3, 2, 2, 3}, {2, 1}, {1, 0}, {1, 2}, 1},
    {"resnet_3x3", {6, 16, 8, 8}, {16, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
    {"resnet_stride2_pieces", {10, 16, 16, 16}, {32, 16, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
    {"lenet_conv1", {4, 1, 28, 28}, {6, 1, 5, 5}, {1, 1}, {0, 0}, {1, 1}, 1},
};

// ConvCase named for its dtype too.
OpCase TypedConvCase(const ConvParams& p, DType dt) {
  OpCase c = ConvCase(p, dt);
  c.name += std::string("_") + DTypeName(dt);
  return c;
}

// Output, Input@GRAD and Filter@GRAD of an NCHW case, for a random Output@GRAD (NCHW).
std::vector<Tensor> ConvResults(const OpCase& fwd, const Tensor& dout_nchw) {
  const bool nhwc = fwd.attrs.count("data_format") > 0;
  std::vector<Tensor> out = {RunForward(fwd)["Output"][0]};
  OpCase c = fwd;
  c.type = "conv2d_grad";
  c.inputs.push_back({GradVarName("Output"), {nhwc ? ToNhwc(dout_nchw) : dout_nchw}});
  c.outputs = {{GradVarName("Input"), 1}, {GradVarName("Filter"), 1}};
  auto grads = RunForward(c);
  out.push_back(grads[GradVarName("Input")][0]);
  out.push_back(grads[GradVarName("Filter")][0]);
  if (nhwc) {  // back to NCHW to compare; the filter gradient has the one layout
    out[0] = ToNchw(out[0]);
    out[1] = ToNchw(out[1]);
  }
  return out;
}

void ExpectConvTwins(DType dt, bool onednn, double tol) {
  FLAGS_conv_onednn = onednn;
  for (const ConvParams& p : kConvCases) {
    const OpCase nchw = TypedConvCase(p, dt);
    SCOPED_TRACE(nchw.name + (onednn ? " (oneDNN)" : " (im2col + GEMM)"));
    const OpCase nhwc = ChannelsLast(nchw, {"Input"}, "data_format");
    const Tensor y = RunForward(nchw)["Output"][0];
    const Tensor dout = RandomFloats(y.dims(), dt, -1, 1, 103);
    const std::vector<Tensor> want = ConvResults(nchw, dout), got = ConvResults(nhwc, dout);
    ExpectSame(got[0], want[0], tol, "Output");
    ExpectSame(got[1], want[1], tol, "Input@GRAD");
    ExpectSame(got[2], want[2], tol, "Filter@GRAD");
  }
  FLAGS_conv_onednn = true;
}

TEST(ChannelsLastConv, OutputShapeIsNhwcAndTheFilterKeepsItsLayout) {
  OpCase c = ChannelsLast(TypedConvCase(kConvCases[1], DType::kFloat32), {"Input"}, "data_format");
  EXPECT_EQ(c.inputs[0].second[0].dims(), DDim({2, 7, 6, 3}));
  EXPECT_EQ(c.inputs[1].second[0].dims(), DDim({4, 3, 3, 3}));
  EXPECT_EQ(RunForward(c)["Output"][0].dims(), DDim({2, 4, 3, 4}));
}

// float64 and keel's own float32 kernels run the NCHW loops over copies: the same bits.
TEST(ChannelsLastConv, OwnKernelsEqualNchwBitForBit) {
  ExpectConvTwins(DType::kFloat64, /*onednn=*/true, 0);
  ExpectConvTwins(DType::kFloat32, /*onednn=*/false, 0);
}

// oneDNN's channels-last primitives against its NCHW ones (blocked layouts): float32 rounding.
TEST(ChannelsLastConv, OneDnnChannelsLastEqualsNchwToRounding) {
  ExpectConvTwins(DType::kFloat32, /*onednn=*/true, 2e-6);
}

// bfloat16 (mixed precision): oneDNN's bfloat16 primitives in both layouts, or the float32 path
// over widened copies; each rounds its float32 result to bfloat16 once.
TEST(ChannelsLastConv, BFloat16EqualsNchwToItsRounding) {
  ExpectConvTwins(DType::kBFloat16, /*onednn=*/true, 1e-2);
}

TEST(ChannelsLastConv, GradMatchesFiniteDifferences) {
  for (const ConvParams& p : kConvCases)
    if (p.x.numel() + p.filter.numel() <= 400)
      CheckGrad(ChannelsLast(TypedConvCase(p, DType::kFloat64), {"Input"}, "data_format"));
}

TEST(ChannelsLastConv, BadShapesAndLayoutsAreNamed) {
  OpCase c = ChannelsLast(TypedConvCase(kConvCases[0], DType::kFloat32), {"Input"}, "data_format");
  c.inputs[0].second[0] = Tensor(DType::kFloat32, {2, 5, 5, 2});  // 2 channels last, Filter's 3
  ExpectErrorContainsAll(ForwardError(c),
                         {"conv2d", "[2, 5, 5, 2]", "[4, 3, 3, 3]", "channels", "NHWC"});
  c = ChannelsLast(TypedConvCase(kConvCases[0], DType::kFloat32), {"Input"}, "data_format");
  c.inputs[0].second[0] = Tensor(DType::kFloat32, {5, 5, 3});
  ExpectErrorContainsAll(ForwardError(c), {"conv2d", "[5, 5, 3]", "4-D", "[N, H, W, C]"});
  c = TypedConvCase(kConvCases[0], DType::kFloat32);
  c.attrs["data_format"] = std::string("NCDHW");
  ExpectErrorContainsAll(ForwardError(c), {"conv2d", "data_format", "NCDHW", "NHWC"});
}

// ------------------------------------------------------------------------------------- pool2d

std::vector<OpCase> PoolCases(DType dt) {
  std::vector<OpCase> v = {
      PoolCase("max_2x2", {2, 3, 8, 8}, "max", {2, 2}, {2, 2}, {0, 0}, false, true, false, dt),
      PoolCase("max_2x2_odd", {2, 3, 9, 7}, "max", {2, 2}, {2, 2}, {0, 0}, false, true, false, dt),
      PoolCase("max_3x3_s2_pad1", {2, 3, 9, 9}, "max", {3, 3}, {2, 2}, {1, 1}, false, true, false,
               dt),
      PoolCase("avg_3x3_pad1_exclusive", {2, 17, 7, 6}, "avg", {3, 3}, {1, 1}, {1, 1}, false, true,
               false, dt),
      PoolCase("avg_3x3_pad1_inclusive", {2, 3, 7, 6}, "avg", {3, 3}, {1, 1}, {1, 1}, false, false,
               false, dt),
      PoolCase("avg_global", {4, 64, 8, 8}, "avg", {1, 1}, {1, 1}, {0, 0}, true, true, false, dt),
      PoolCase("max_ceil_mode", {2, 3, 7, 7}, "max", {2, 2}, {2, 2}, {0, 0}, false, true, true,
               dt)};
  for (OpCase& c : v) c.name += std::string("_") + DTypeName(dt);
  return v;
}

// Out and X@GRAD, NCHW, for a given Out@GRAD (NCHW).
std::vector<Tensor> PoolResults(const OpCase& fwd, const Tensor& dout_nchw) {
  const bool nhwc = fwd.attrs.count("data_format") > 0;
  const Tensor y = RunForward(fwd)["Out"][0];
  OpCase c = fwd;
  c.type = "pool2d_grad";
  c.inputs.push_back({"Out", {y}});
  c.inputs.push_back({GradVarName("Out"), {nhwc ? ToNhwc(dout_nchw) : dout_nchw}});
  c.outputs = {{GradVarName("X"), 1}};
  const Tensor dx = RunForward(c)[GradVarName("X")][0];
  return nhwc ? std::vector<Tensor>{ToNchw(y), ToNchw(dx)} : std::vector<Tensor>{y, dx};
}

// Pooling runs its NCHW loops over copies in every type: the same bits.
TEST(ChannelsLastPool, EqualsNchwBitForBitForwardAndGrad) {
  for (DType dt : {DType::kFloat64, DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (const OpCase& nchw : PoolCases(dt)) {
      SCOPED_TRACE(nchw.name);
      const OpCase nhwc = ChannelsLast(nchw, {"X"}, "data_format");
      const Tensor dout = RandomFloats(RunForward(nchw)["Out"][0].dims(), dt, -1, 1, 22);
      const std::vector<Tensor> want = PoolResults(nchw, dout), got = PoolResults(nhwc, dout);
      ExpectSame(got[0], want[0], 0, "Out");
      ExpectSame(got[1], want[1], 0, "X@GRAD");
    }
}

TEST(ChannelsLastPool, ShapesAndGradients) {
  OpCase c = ChannelsLast(PoolCases(DType::kFloat64)[2], {"X"}, "data_format");
  EXPECT_EQ(RunForward(c)["Out"][0].dims(), DDim({2, 5, 5, 3}));
  CheckGrad(c);
  CheckGrad(ChannelsLast(PoolCases(DType::kFloat64)[4], {"X"}, "data_format"));
  c = ChannelsLast(PoolCases(DType::kFloat32)[5], {"X"}, "data_format");
  EXPECT_EQ(RunForward(c)["Out"][0].dims(), DDim({4, 1, 1, 64}));
  c.attrs["data_format"] = std::string("CHWN");
  ExpectErrorContainsAll(ForwardError(c), {"pool2d", "data_format", "CHWN"});
}

// --------------------------------------------------------------------------------- batch_norm

OpCase BatchNormCase(const std::string& name, const DDim& x, DType dt, bool is_test,
                     const std::string& type = "batch_norm") {
  const DDim c{x[1]};
  OpCase o;
  o.name = name + "_" + DTypeName(dt);
  o.type = type;
  const DType pt = dt == DType::kFloat64 ? dt : DType::kFloat32;
  o.inputs = {{"X", {RandomFloats(x, dt, -2, 3, 31)}},
              {"Scale", {RandomFloats(c, pt, 0.5, 1.5, 32)}},
              {"Bias", {RandomFloats(c, pt, -1, 1, 33)}},
              {"Mean", {RandomFloats(c, pt, -0.5, 0.5, 34)}},
              {"Variance", {RandomFloats(c, pt, 0.5, 2, 35)}}};
  o.outputs = {
      {"Y", 1}, {"MeanOut", 1}, {"VarianceOut", 1}, {"SavedMean", 1}, {"SavedVariance", 1}};
  o.attrs = {{"is_test", is_test}};
  if (type == "sync_batch_norm") o.attrs["ring_id"] = 0;
  o.no_grad_inputs = {"Mean", "Variance"};
  return o;
}

// Every forward output (NCHW) and X@GRAD (NCHW), Scale@GRAD, Bias@GRAD for a given Y@GRAD.
std::vector<Tensor> BatchNormResults(const OpCase& fwd, const Tensor& dy_nchw) {
  const bool nhwc = fwd.attrs.count("data_layout") > 0;
  auto out = RunForward(fwd);
  std::vector<Tensor> r;
  for (const char* slot : {"Y", "MeanOut", "VarianceOut", "SavedMean", "SavedVariance"})
    r.push_back(out[slot][0]);
  OpCase c = fwd;
  c.type = fwd.type + "_grad";
  c.inputs.push_back({"SavedMean", {out["SavedMean"][0]}});
  c.inputs.push_back({"SavedVariance", {out["SavedVariance"][0]}});
  c.inputs.push_back({GradVarName("Y"), {nhwc ? ToNhwc(dy_nchw) : dy_nchw}});
  c.outputs = {{GradVarName("X"), 1}, {GradVarName("Scale"), 1}, {GradVarName("Bias"), 1}};
  auto g = RunForward(c);
  r.push_back(g[GradVarName("X")][0]);
  r.push_back(g[GradVarName("Scale")][0]);
  r.push_back(g[GradVarName("Bias")][0]);
  if (nhwc) {
    r[0] = ToNchw(r[0]);
    r[5] = ToNchw(r[5]);
  }
  return r;
}

// Channels last, a channel's values are summed in another order: rounding apart.
TEST(ChannelsLastBatchNorm, EqualsNchwToRoundingTrainingAndTest) {
  const char* names[] = {"Y",      "MeanOut",    "VarianceOut", "SavedMean", "SavedVariance",
                         "X@GRAD", "Scale@GRAD", "Bias@GRAD"};
  for (const std::string type : {"batch_norm", "sync_batch_norm"})
    for (DType dt : {DType::kFloat64, DType::kFloat32, DType::kBFloat16})
      for (bool is_test : {false, true})
        for (const DDim& x : {DDim{4, 3, 5, 6}, DDim{8, 32, 8, 8}}) {
          const OpCase nchw =
              BatchNormCase(type + (is_test ? "_test" : "_train"), x, dt, is_test, type);
          SCOPED_TRACE(nchw.name + " " + x.str());
          const OpCase nhwc = ChannelsLast(nchw, {"X"}, "data_layout");
          const Tensor dy = RandomFloats(x, dt, -1, 1, 36);
          const std::vector<Tensor> want = BatchNormResults(nchw, dy),
                                    got = BatchNormResults(nhwc, dy);
          const double tol = dt == DType::kFloat64 ? 1e-12 : dt == DType::kFloat32 ? 2e-5 : 1e-2;
          for (size_t k = 0; k < want.size(); ++k) ExpectSame(got[k], want[k], tol, names[k]);
        }
}

TEST(ChannelsLastBatchNorm, ShapesAndGradients) {
  OpCase c =
      ChannelsLast(BatchNormCase("bn", {3, 2, 4, 5}, DType::kFloat64, false), {"X"}, "data_layout");
  EXPECT_EQ(RunForward(c)["Y"][0].dims(), DDim({3, 4, 5, 2}));
  CheckGrad(c, 1e-6, 1e-4, 1e-6, {"Y"});
  // The channels are the last dim: Scale of X's dim 1 is refused, naming the layout.
  c.inputs[0].second[0] = RandomTensor({3, 2, 4, 5}, DType::kFloat64, -1, 1, 37);
  ExpectErrorContainsAll(ForwardError(c), {"batch_norm", "Scale", "[3, 2, 4, 5]", "NHWC"});
  c.attrs["data_layout"] = std::string("NDHWC");
  ExpectErrorContainsAll(ForwardError(c), {"batch_norm", "data_layout", "NDHWC"});
}

}  // namespace
}  // namespace keel::testing
