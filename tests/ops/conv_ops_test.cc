// Tests of ops/conv_ops.cc (conv2d): forward values against naive reference loops (float32 and
// float64), gradients by finite differences (float64) and against the naive adjoint, oneDNN's
// primitives against keel's own kernels, and bad shapes reported as keel::Error.
#include <gtest/gtest.h>

#include <gflags/gflags.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/autodiff/backward.h"
#include "framework/dsl/program_guard.h"
#include "framework/error.h"
#include "framework/runtime/cpu_threads.h"
#include "ops/conv_onednn.h"
#include "tests/util/grad_checker.h"
#include "tests/util/image_op_cases.h"
#include "tests/util/op_test_util.h"

DECLARE_bool(conv_onednn);

namespace keel::testing {
namespace {

// float32 outputs are sums of up to a few hundred products: allow 1e-5 relative.
constexpr double kF32Tol = 1e-5;

// ------------------------------------------------------------------------------------- conv2d

const ConvParams kConvCases[] = {
    {"basic", {2, 3, 5, 5}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
    {"pad1_stride2", {2, 3, 7, 6}, {4, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
    {"dilation2", {1, 2, 9, 8}, {3, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 1},
    {"groups2", {2, 4, 6, 6}, {6, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2},
    {"depthwise", {2, 3, 5, 5}, {3, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 3},
    {"rect_kernel_mixed_attrs", {2, 2, 7, 8}, {3, 2, 2, 3}, {2, 1}, {1, 0}, {1, 2}, 1},
    {"one_by_one", {2, 4, 5, 5}, {3, 4, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
    {"one_by_one_groups", {2, 4, 3, 3}, {6, 2, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 2},
    {"one_by_one_stride2", {2, 4, 5, 5}, {3, 4, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1},
    {"pad_beyond_kernel", {1, 1, 3, 3}, {2, 1, 2, 2}, {1, 1}, {2, 2}, {1, 1}, 1},
    {"batched_small_planes", {10, 2, 4, 4}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
    {"batched_tail_chunk", {5, 2, 16, 16}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
    {"lenet_conv1", {4, 1, 28, 28}, {6, 1, 5, 5}, {1, 1}, {0, 0}, {1, 1}, 1},
    {"resnet_3x3", {2, 16, 8, 8}, {16, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
    // 3x3 stride-1 convs of >= 32 channels (once run by Winograd F(2x2, 3x3)): even and odd
    // planes, several paddings, many tile rows.
    {"winograd_pad1", {2, 32, 6, 6}, {32, 32, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
    {"winograd_odd_pad0", {1, 32, 7, 9}, {33, 32, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
    {"winograd_odd_pad2", {1, 33, 5, 3}, {32, 33, 3, 3}, {1, 1}, {2, 2}, {1, 1}, 1},
    {"winograd_blocks", {3, 32, 40, 10}, {32, 32, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
};

int64_t ConvOut(int64_t in, int64_t k, int s, int p, int d) {
  return (in + 2 * p - (d * (k - 1) + 1)) / s + 1;
}

DDim ConvOutDims(const ConvParams& p) {
  return {p.x[0], p.filter[0],
          ConvOut(p.x[2], p.filter[2], p.strides[0], p.paddings[0], p.dilations[0]),
          ConvOut(p.x[3], p.filter[3], p.strides[1], p.paddings[1], p.dilations[1])};
}

// Calls fn(out_index, x_index, f_index) for every product x[n, c, ih, iw] * f[m, c', i, j] that the
// convolution adds into out[n, m, oh, ow] (taps outside the input skipped), flat NCHW indices.
template <typename Fn>
void ForEachTap(const ConvParams& p, Fn&& fn) {
  const DDim o = ConvOutDims(p);
  const int64_t C = p.x[1], H = p.x[2], W = p.x[3], M = p.filter[0], Cg = p.filter[1];
  const int64_t kh = p.filter[2], kw = p.filter[3], Mg = M / p.groups;
  for (int64_t n = 0; n < o[0]; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t oh = 0; oh < o[2]; ++oh)
        for (int64_t ow = 0; ow < o[3]; ++ow) {
          const int64_t oi = ((n * M + m) * o[2] + oh) * o[3] + ow;
          const int64_t g = m / Mg;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t ih = oh * p.strides[0] - p.paddings[0] + i * p.dilations[0];
                const int64_t iw = ow * p.strides[1] - p.paddings[1] + j * p.dilations[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                fn(oi, ((n * C + g * Cg + c) * H + ih) * W + iw, ((m * Cg + c) * kh + i) * kw + j);
              }
        }
}

// out[n, m, oh, ow] = sum over the group's c and taps (i, j) of x[n, c, ih, iw] * f[m, c', i, j].
std::vector<double> NaiveConv(const ConvParams& p, const std::vector<double>& x,
                              const std::vector<double>& f) {
  std::vector<double> out(ConvOutDims(p).numel(), 0.0);
  ForEachTap(p, [&](int64_t oi, int64_t xi, int64_t fi) { out[oi] += x[xi] * f[fi]; });
  return out;
}

TEST(Conv2DOp, ForwardMatchesReference) {
  for (const auto& p : kConvCases)
    for (DType dt : kFloatTypes) {
      OpCase c = ConvCase(p, dt);
      ExpectForward(c, "Output", ConvOutDims(p),
                    NaiveConv(p, ToDouble(c.inputs[0].second[0]), ToDouble(c.inputs[1].second[0])),
                    kF32Tol);
    }
}

TEST(Conv2DOp, GradMatchesFiniteDifferences) {
  for (const auto& p : kConvCases)
    if (p.x.numel() + p.filter.numel() <= 400) CheckGrad(ConvCase(p, DType::kFloat64));
}

// Too many elements for finite differences (the 32-channel cases among them): conv2d_grad against
// the adjoint of NaiveConv, summed in double, for a random Output@GRAD.
TEST(Conv2DOp, LargeCaseGradsMatchTheNaiveAdjoint) {
  int checked = 0;
  for (const auto& p : kConvCases) {
    if (p.x.numel() + p.filter.numel() <= 400) continue;
    for (DType dt : kFloatTypes) {
      OpCase fwd = ConvCase(p, dt);
      const std::vector<double> x = ToDouble(fwd.inputs[0].second[0]);
      const std::vector<double> f = ToDouble(fwd.inputs[1].second[0]);
      const DDim o = ConvOutDims(p);
      Tensor dout = RandomTensor(o, dt, -1, 1, 103);
      const std::vector<double> g = ToDouble(dout);
      std::vector<double> dx(x.size(), 0.0), df(f.size(), 0.0);
      ForEachTap(p, [&](int64_t oi, int64_t xi, int64_t fi) {
        dx[xi] += g[oi] * f[fi];
        df[fi] += g[oi] * x[xi];
      });
      OpCase c = fwd;
      c.type = "conv2d_grad";
      c.inputs.push_back({GradVarName("Output"), {dout}});
      c.outputs = {{GradVarName("Input"), 1}, {GradVarName("Filter"), 1}};
      ExpectOutputNear(c, GradVarName("Input"), p.x, dx, {2e-4});
      ExpectOutputNear(c, GradVarName("Filter"), p.filter, df, {2e-4});
      ++checked;
    }
  }
  EXPECT_GE(checked, 8);  // the four 32-channel cases, in both types, at least
}

// Four images of 13 x 13 (P = 169): three share a GEMM, the fourth runs alone.
TEST(Conv2DOp, GradOfBatchedGemmsWithATail) {
  ConvParams p{"batched_tail", {4, 1, 13, 13}, {2, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1};
  CheckGrad(ConvCase(p, DType::kFloat64));
}

TEST(Conv2DOp, RunsAgainWithAnotherBatchSize) {
  // The scratch buffers are resized per run: a bigger batch after a smaller one stays right.
  Program prog;
  Block& block = prog.global_block();
  VarDesc* x = block.Var("x");
  x->set_shape({-1, 2, 6, 6});
  x->set_is_data(true);
  VarDesc* f = block.Var("f");
  f->set_shape({3, 2, 3, 3});
  f->set_is_data(true);
  AppendOp(block, "conv2d", {{"Input", {"x"}}, {"Filter", {"f"}}}, {{"Output", {"y"}}},
           {{"paddings", Pair(1, 1)}});
  EXPECT_EQ(block.FindVar("y")->dims(), DDim({-1, 3, 6, 6}));
  Executor exe;
  Tensor ft = RandomTensor({3, 2, 3, 3}, DType::kFloat32, -1, 1, 5);
  ConvParams p{"rerun", {0, 2, 6, 6}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1};
  for (int64_t n : {1, 7, 3}) {
    SCOPED_TRACE("batch " + std::to_string(n));
    Tensor xt = RandomTensor({n, 2, 6, 6}, DType::kFloat32, -1, 1, 6 + n);
    std::vector<double> got = ToDouble(exe.Run(prog, {{"x", xt}, {"f", ft}}, {"y"})[0]);
    p.x = DDim{n, 2, 6, 6};
    std::vector<double> want = NaiveConv(p, ToDouble(xt), ToDouble(ft));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << i;
  }
}

// float32 convs run by oneDNN's primitives (--conv_onednn) agree with keel's own kernels (im2col
// + GEMM) within float32 rounding, forward and both gradients, on shapes cut into
// several pieces of images (the last one shorter), with groups, strides and dilations; and give the
// same bits on one thread and on three.
TEST(Conv2DOp, OneDnnPrimitivesAgreeWithOwnKernelsAndIgnoreTheThreadCount) {
  const ConvParams cases[] = {
      {"resnet_pieces", {10, 32, 32, 32}, {32, 32, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"resnet_stage2", {32, 32, 16, 16}, {32, 32, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"resnet_stage3_s2", {32, 32, 16, 16}, {64, 32, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
      {"resnet_stage3", {32, 64, 8, 8}, {64, 64, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"stride2_pieces", {7, 16, 32, 32}, {32, 16, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
      {"shortcut_1x1", {6, 16, 32, 32}, {32, 16, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1},
      {"groups_dilation", {5, 8, 20, 20}, {12, 4, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 2},
      {"lenet_conv1", {9, 1, 28, 28}, {20, 1, 5, 5}, {1, 1}, {0, 0}, {1, 1}, 1},
  };
  auto run = [](const ConvParams& p, bool onednn, int threads) {
    FLAGS_conv_onednn = onednn;
    cpu_threads::SetBudget(threads);
    OpCase fwd = ConvCase(p, DType::kFloat32);
    std::vector<Tensor> out = {RunForward(fwd)["Output"][0]};
    OpCase c = fwd;
    c.type = "conv2d_grad";
    c.inputs.push_back(
        {GradVarName("Output"), {RandomTensor(ConvOutDims(p), DType::kFloat32, -1, 1, 104)}});
    c.outputs = {{GradVarName("Input"), 1}, {GradVarName("Filter"), 1}};
    auto grads = RunForward(c);
    out.push_back(grads[GradVarName("Input")][0]);
    out.push_back(grads[GradVarName("Filter")][0]);
    return out;
  };
  for (const auto& p : cases) {
    SCOPED_TRACE(p.name);
    const std::vector<Tensor> own = run(p, false, 1), one = run(p, true, 1),
                              three = run(p, true, 3);
    for (size_t k = 0; k < own.size(); ++k) {
      SCOPED_TRACE(k == 0 ? "Output" : k == 1 ? "Input@GRAD" : "Filter@GRAD");
      const std::vector<double> a = ToDouble(own[k]), b = ToDouble(one[k]);
      ASSERT_EQ(a.size(), b.size());
      double scale = 0;
      for (double v : a) scale = std::max(scale, std::abs(v));
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(b[i], a[i], 1e-5 * scale + 1e-6) << i;
      ASSERT_EQ(one[k].numel(), three[k].numel());
      EXPECT_EQ(0, std::memcmp(one[k].data<float>(), three[k].data<float>(),
                               static_cast<size_t>(one[k].numel()) * sizeof(float)));
    }
  }
  FLAGS_conv_onednn = true;
  cpu_threads::SetBudget(1);
}

// keel's transposes between NCHW and 16-channel blocks (the 16-bit convolutions' reorders) give
// oneDNN's reorder's bits both ways, with spatial sizes that are and are not multiples of 16.
TEST(Conv2DOp, SixteenBitChannelBlocksEqualOneDnnsReorder) {
  using dnnl::memory;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const std::vector<std::vector<int64_t>> shapes = {
      {3, 32, 32, 32}, {8, 64, 8, 8}, {2, 16, 5, 5}, {1, 48, 7, 3}, {2, 16, 1, 1}};
  for (const memory::data_type dt : {memory::data_type::bf16, memory::data_type::f16})
    for (const auto& d : shapes) {
      SCOPED_TRACE(::testing::Message() << (dt == memory::data_type::bf16 ? "bf16 " : "f16 ")
                                        << d[0] << "x" << d[1] << "x" << d[2] << "x" << d[3]);
      const int64_t n = d[0] * d[1] * d[2] * d[3];
      std::vector<uint16_t> plain(static_cast<size_t>(n)), blocked(plain.size()),
          want(plain.size()), back(plain.size());
      // Finite values of both types and both signs (oneDNN's reorder quiets NaN patterns).
      for (int64_t i = 0; i < n; ++i)
        plain[static_cast<size_t>(i)] = static_cast<uint16_t>((i * 7919) % 0x7800 | (i & 1) << 15);
      const memory::desc nchw(d, dt, memory::format_tag::nchw),
          blocks(d, dt, memory::format_tag::nChw16c);
      memory mp(nchw, engine, plain.data()), mw(blocks, engine, want.data());
      dnnl::reorder(mp, mw).execute(stream, mp, mw);
      stream.wait();
      onednn::ToChannelBlocks16(plain.data(), blocked.data(), d[0], d[1], d[2] * d[3]);
      EXPECT_EQ(blocked, want);
      onednn::FromChannelBlocks16(want.data(), back.data(), d[0], d[1], d[2] * d[3]);
      EXPECT_EQ(back, plain);
    }
}

TEST(Conv2DOp, BadShapesAreBuildErrors) {
  ConvParams p = kConvCases[0];
  OpCase c = ConvCase(p, DType::kFloat32);
  c.name = "channels_differ";
  c.inputs[1].second[0] = Tensor(DType::kFloat32, {4, 2, 3, 3});
  ExpectErrorContainsAll(ForwardError(c), {"conv2d", "[2, 3, 5, 5]", "[4, 2, 3, 3]", "channels"});

  c = ConvCase(p, DType::kFloat32);
  c.name = "groups_do_not_divide_filters";
  c.attrs["groups"] = 3;
  c.inputs[1].second[0] = Tensor(DType::kFloat32, {4, 1, 3, 3});
  ExpectErrorContainsAll(ForwardError(c), {"conv2d", "[2, 3, 5, 5]", "[4, 1, 3, 3]", "groups"});

  c = ConvCase(p, DType::kFloat32);
  c.name = "input_too_small_stride2";  // (2 - 3) / 2 + 1 would truncate to 1
  c.inputs[0].second[0] = Tensor(DType::kFloat32, {2, 3, 2, 2});
  c.attrs["strides"] = Pair(2, 2);
  ExpectErrorContainsAll(ForwardError(c), {"conv2d", "[2, 3, 2, 2]", "[4, 3, 3, 3]"});

  c = ConvCase(p, DType::kFloat32);
  c.name = "rank3_input";
  c.inputs[0].second[0] = Tensor(DType::kFloat32, {3, 5, 5});
  ExpectErrorContainsAll(ForwardError(c), {"conv2d", "[3, 5, 5]", "[4, 3, 3, 3]", "4-D"});

  c = ConvCase(p, DType::kFloat32);
  c.name = "ncdhw";  // NHWC is channels_last_test.cc's
  c.attrs["data_format"] = std::string("NCDHW");
  ExpectErrorContainsAll(ForwardError(c), {"conv2d", "data_format", "NCDHW", "NHWC", "NCHW"});

  c = ConvCase(p, DType::kFloat32);
  c.name = "zero_stride";
  c.attrs["strides"] = Pair(0, 1);
  ExpectErrorContainsAll(ForwardError(c), {"conv2d", "strides"});
}
}  // namespace
}  // namespace keel::testing
