// The __host__ __device__ functors the CPU and CUDA kernels share (ops/functors/): Philox against
// its published test vectors, the CPU dropout mask equal to the per-element draw the CUDA kernel
// makes, and broadcasting indices.
#include <gtest/gtest.h>

#include "ops/functors/activation_functors.h"
#include "ops/functors/elementwise_functors.h"
#include "ops/functors/optimizer_functors.h"
#include "ops/functors/philox.h"
#include "tests/util/grad_checker.h"

namespace keel {
namespace {

// Known-answer vectors of Random123's philox4x32_10 (kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Kat {
    fn::Philox4 ctr;
    uint32_t k0, k1;
    fn::Philox4 want;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& k : kats) {
    fn::Philox4 r = fn::Philox4x32(k.ctr, k.k0, k.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.want.v[i]) << "word " << i;
  }
}

// The CPU kernel draws four elements per Philox block; the CUDA kernel one element per thread
// through fn::DropoutKeep. Both must give the same mask for the same seed and run.
TEST(DropoutMask, CpuKernelEqualsPerElementPhiloxDraw) {
  testing::OpCase c;
  c.name = "mask";
  c.type = "dropout";
  c.inputs = {{"X", {testing::RandomTensor({7, 13}, DType::kFloat32)}}};
  c.outputs = {{"Out", 1}, {"Mask", 1}};
  const int seed = 1234;
  const float p = 0.3f;
  c.attrs = {{"dropout_prob", p}, {"seed", seed}};
  auto out = testing::RunForward(c);
  const Tensor& mask = out["Mask"][0];
  const uint64_t threshold = fn::DropoutThreshold(p);
  int64_t kept = 0;
  for (int64_t i = 0; i < mask.numel(); ++i) {
    ASSERT_EQ(mask.data<uint8_t>()[i] != 0, fn::DropoutKeep(seed, 0, i, threshold)) << i;
    kept += mask.data<uint8_t>()[i];
  }
  EXPECT_NEAR(static_cast<double>(kept) / mask.numel(), 1 - p, 0.1);
}

TEST(DropoutMask, KeepRateFollowsTheProbability) {
  const uint64_t threshold = fn::DropoutThreshold(0.25f);
  int64_t kept = 0;
  const int64_t n = 200000;
  for (int64_t i = 0; i < n; ++i) kept += fn::DropoutKeep(99, 3, i, threshold);
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.75, 0.005);
  EXPECT_FALSE(fn::DropoutKeep(99, 3, 5, fn::DropoutThreshold(1.0f))) << "p = 1 drops all";
  EXPECT_TRUE(fn::DropoutKeep(99, 3, 5, fn::DropoutThreshold(0.0f))) << "p = 0 keeps all";
}

TEST(Broadcast, YIndexFollowsPaddleAxis) {
  // X [2, 3, 4] op Y [3] at axis 1: pre 2, n 3, post 4.
  fn::BroadcastMid m{2, 3, 4};
  EXPECT_EQ(m.YIndex(0), 0);
  EXPECT_EQ(m.YIndex(3), 0);
  EXPECT_EQ(m.YIndex(4), 1);
  EXPECT_EQ(m.YIndex(11), 2);
  EXPECT_EQ(m.YIndex(12), 0);  // next pre row
  // X [5, 3] op Y [3] (bias add): post 1.
  fn::BroadcastMid b{5, 3, 1};
  EXPECT_EQ(b.YIndex(7), 1);
}

TEST(OptimizerFunctors, AdamStepMatchesTheClosedForm) {
  // One step from zero moments with t = 1: m1 = (1 - b1) g, m2 = (1 - b2) g^2, and
  // lr_t * m1 / (sqrt(m2) + eps_hat) = lr * g / (|g| + eps) exactly in real arithmetic.
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  fn::Adam<double> a = fn::AdamStep<double>(lr, b1, b2, b1, b2, eps, 0.0);
  double p = 1.0, m1 = 0, m2 = 0;
  a(p, -0.5, m1, m2, &p, &m1, &m2);
  EXPECT_NEAR(p, 1.0 + lr * 0.5 / (0.5 + eps), 1e-12);
  EXPECT_NEAR(m1, -0.05, 1e-15);
  EXPECT_NEAR(m2, 0.001 * 0.25, 1e-15);
  // AdamW decays the parameter by lr * coeff first.
  fn::Adam<double> w = fn::AdamStep<double>(lr, b1, b2, b1, b2, eps, 0.01);
  EXPECT_DOUBLE_EQ(w.decay, 1 - lr * 0.01);
}

TEST(ActivationFunctors, GeluGradIsTheDerivativeOfGelu) {
  for (bool approx : {false, true}) {
    fn::Gelu f{approx};
    fn::GeluGrad g{approx};
    for (double x : {-3.0, -0.7, 0.0, 0.4, 2.5}) {
      const double h = 1e-6;
      const double numeric = (f(x + h) - f(x - h)) / (2 * h);
      EXPECT_NEAR(g(x, 1.0), numeric, 1e-8) << "x=" << x << " approximate=" << approx;
    }
  }
}

}  // namespace
}  // namespace keel
