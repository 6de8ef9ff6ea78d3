// The 16-bit (mixed precision) CPU kernels: every case of LowpCases() in bfloat16 and float16
// against the float32 kernels from the same (rounded) inputs, forward and gradient; cast against
// float16.h on every 16-bit pattern; the 16-bit GEMMs (oneDNN's and the widened path) against a
// float64 reference; NaN and infinity carried through; the dtype rules of the normalizations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "framework/op/op_registry.h"
#include "framework/runtime/blas.h"
#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/float16.h"
#include "framework/runtime/half_convert.h"
#include "tests/util/grad_checker.h"
#include "tests/util/lowp_test_util.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

bool HasCpuKernel(const std::string& type, DType dt) {
  return OpRegistry::HasKernel(type, Place::Kind::kCPU, dt);
}

TEST(LowpOps, EveryCaseMatchesTheFloat32KernelsInBothTypes) {
  for (const LowpCase& c : LowpCases())
    for (DType dt : kHalfTypes) {
      if (c.op.type == "conv2d" && dt == DType::kFloat16) continue;  // no CPU kernel (below)
      ExpectMatchesFloat32(c, dt, CPUPlace());
    }
}

// oneDNN has no float16 convolution before AVX512-FP16: the AMP pass keeps float16 conv2d in
// float32 on the CPU. Every other op of the table has both 16-bit kernels.
TEST(LowpOps, RegisteredTypes) {
  EXPECT_FALSE(HasCpuKernel("conv2d", DType::kFloat16));
  EXPECT_FALSE(HasCpuKernel("conv2d_grad", DType::kFloat16));
  EXPECT_TRUE(HasCpuKernel("conv2d", DType::kBFloat16));
  EXPECT_TRUE(HasCpuKernel("conv2d_grad", DType::kBFloat16));
  for (const LowpCase& c : LowpCases())
    for (DType dt : kHalfTypes)
      if (c.op.type != "conv2d") {
        EXPECT_TRUE(HasCpuKernel(c.op.type, dt)) << c.op.type;
      }
  for (const char* type : {"fill_constant", "cast_grad", "sum_grad", "mul_grad", "matmul_grad",
                           "pool2d_grad", "batch_norm_grad", "layer_norm_grad", "dropout_grad"})
    for (DType dt : kHalfTypes) EXPECT_TRUE(HasCpuKernel(type, dt)) << type;
  // softmax and the losses stay float32 (the pass keeps them there).
  EXPECT_FALSE(HasCpuKernel("softmax", DType::kBFloat16));
  EXPECT_FALSE(HasCpuKernel("softmax_with_cross_entropy", DType::kFloat16));
}

// ---------------------------------------------------------------- cast

Tensor Bits16(DType dt) {
  Tensor t(dt, {65536});
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t v = static_cast<uint16_t>(b);
    std::memcpy(static_cast<char*>(t.raw_data()) + 2 * b, &v, 2);
  }
  return t;
}

float Widened(DType dt, uint16_t bits) {
  return dt == DType::kFloat16 ? static_cast<float>(float16::FromBits(bits))
                               : static_cast<float>(bfloat16::FromBits(bits));
}
uint16_t Rounded(DType dt, float f) {
  return dt == DType::kFloat16 ? float16(f).bits : bfloat16(f).bits;
}
uint16_t BitsAt(const Tensor& t, int64_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const char*>(t.raw_data()) + 2 * i, 2);
  return v;
}

OpCase CastCase(Tensor x, DType to) {
  return UnaryCase("cast", "cast", std::move(x), {{"out_dtype", static_cast<int>(to)}});
}

// Every 16-bit pattern widened by the cast op is float16.h's value (NaN: a NaN), and narrowing it
// back gives the pattern again.
TEST(LowpCast, EveryPatternWidensAsFloat16HAndRoundTrips) {
  for (DType dt : kHalfTypes) {
    SCOPED_TRACE(DTypeName(dt));
    const Tensor wide = RunForward(CastCase(Bits16(dt), DType::kFloat32))["Out"][0];
    ASSERT_EQ(wide.dtype(), DType::kFloat32);
    for (uint32_t b = 0; b < 65536; ++b) {
      const float want = Widened(dt, static_cast<uint16_t>(b)), got = wide.data<float>()[b];
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << b;
      } else {
        ASSERT_EQ(std::memcmp(&want, &got, 4), 0)
            << "pattern " << b << ": " << got << " vs " << want;
      }
    }
    const Tensor back = RunForward(CastCase(wide, dt))["Out"][0];
    ASSERT_EQ(back.dtype(), dt);
    for (uint32_t b = 0; b < 65536; ++b) {
      if (std::isnan(Widened(dt, static_cast<uint16_t>(b)))) {
        ASSERT_TRUE(std::isnan(Widened(dt, BitsAt(back, b)))) << b;
      } else {
        ASSERT_EQ(BitsAt(back, b), b);
      }
    }
  }
}

// float32 values of every kind narrowed by the cast op (vectorized, in pieces, with tails) round
// exactly as float16.h: random bits, ties, values around each type's range and subnormals.
TEST(LowpCast, NarrowingRoundsExactlyAsFloat16H) {
  std::mt19937 rng(11);
  std::vector<float> v;
  for (int i = 0; i < 300001; ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    if (i % 2 == 1) u = (u & 0x807fffffu) | ((100u + u % 60u) << 23);  // exponents -27 .. 32
    if (i % 7 == 3) u &= 0xffffe000u | (1u << 12);                     // float16 ties
    if (i % 11 == 5) u = (u & 0xffff0000u) | 0x8000u;                  // bfloat16 ties
    float f;
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  for (float s : {0.0f, -0.0f, kInf, -kInf, kNan, 65504.0f, 65519.0f, 65520.0f, 6.1e-5f, 5.9e-8f,
                  3e-8f, 1e-45f, 3.4e38f})
    v.push_back(s);
  const Tensor x = Tensor::FromVector(v, {static_cast<int64_t>(v.size())});
  for (DType dt : kHalfTypes) {
    SCOPED_TRACE(DTypeName(dt));
    const Tensor out = RunForward(CastCase(x, dt))["Out"][0];
    for (size_t i = 0; i < v.size(); ++i) {
      if (std::isnan(v[i])) {
        ASSERT_TRUE(std::isnan(Widened(dt, BitsAt(out, static_cast<int64_t>(i)))));
      } else {
        ASSERT_EQ(BitsAt(out, static_cast<int64_t>(i)), Rounded(dt, v[i])) << "value " << v[i];
      }
    }
  }
}

// The bulk conversions and sums directly, at every length up to a few vectors (each tail), with
// subnormals, ties and NaNs among the values (a vector holding one takes another path).
TEST(LowpCast, BulkConversionsMatchFloat16HAtEveryTail) {
  std::mt19937 rng(3);
  for (int64_t n = 0; n <= 80; ++n) {
    std::vector<float> x(n), back(n);
    for (float& f : x) {
      f = std::ldexp(static_cast<float>(rng()) / 4294967296.0f - 0.5f,
                     static_cast<int>(rng() % 40) - 20);
      const uint32_t pick = static_cast<uint32_t>(rng() % 16);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      if (pick == 0) u &= 0x807fffffu;                 // a float32 subnormal
      if (pick == 1) u = (u & 0xffff0000u) | 0x8000u;  // a bfloat16 tie
      if (pick == 2) u |= 0x7f800001u;                 // a NaN
      std::memcpy(&f, &u, 4);
    }
    std::vector<float16> h(n);
    std::vector<bfloat16> b(n);
    NarrowN(x.data(), h.data(), n);
    NarrowN(x.data(), b.data(), n);
    // float16's NaN payloads may differ (F16C's): a NaN is all that is asked; bfloat16's are bits.
    auto same_h = [](float16 got, float16 want) {
      return got.bits == want.bits ||
             (std::isnan(static_cast<float>(got)) && std::isnan(static_cast<float>(want)));
    };
    auto same_f = [](float got, float want) { return std::memcmp(&got, &want, 4) == 0; };
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(same_h(h[i], float16(x[i]))) << n << " " << i;
      ASSERT_EQ(b[i].bits, bfloat16(x[i]).bits) << n << " " << i;
    }
    WidenN(h.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_f(back[i], static_cast<float>(h[i])));
    WidenN(b.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_f(back[i], static_cast<float>(b[i])));
    // Sums: each pair in float32, rounded once; into one of the inputs too.
    std::vector<float16> h2(h.rbegin(), h.rend()), hs(n);
    std::vector<bfloat16> b2(b.rbegin(), b.rend()), bs(n);
    AddN(h.data(), h2.data(), hs.data(), n);
    AddN(b.data(), b2.data(), bs.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float16 want_h(static_cast<float>(h[i]) + static_cast<float>(h2[i]));
      const bfloat16 want_b(static_cast<float>(b[i]) + static_cast<float>(b2[i]));
      ASSERT_TRUE(same_h(hs[i], want_h)) << n << " " << i;
      if (std::isnan(static_cast<float>(want_b))) {  // which NaN a sum of two keeps may differ
        ASSERT_TRUE(std::isnan(static_cast<float>(bs[i]))) << n << " " << i;
      } else {
        ASSERT_EQ(bs[i].bits, want_b.bits) << n << " " << i;
      }
    }
    AddN(b.data(), b2.data(), b.data(), n);  // in place: the same sums
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b[i].bits, bs[i].bits) << n << " " << i;
  }
  std::printf("half conversions: %s\n", HalfConvertIsa());
}

TEST(LowpCast, BetweenTheHalfTypesIntegersAndFloat64) {
  const Tensor x = Tensor::FromVector<float>(
      {1.0f, -2.5f, 1000.7f, 65504.0f, 70000.0f, 3.0e-6f, -0.0f, 0.0f}, {8});
  // bfloat16 -> float16 goes through float32 (one rounding: bfloat16 values are float32's).
  const Tensor b = RunForward(CastCase(x, DType::kBFloat16))["Out"][0];
  const Tensor h = RunForward(CastCase(b, DType::kFloat16))["Out"][0];
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_EQ(h.data<float16>()[i].bits, float16(static_cast<float>(b.data<bfloat16>()[i])).bits)
        << i;
  EXPECT_EQ(static_cast<float>(h.data<float16>()[4]), kInf);  // 70016 overflows float16
  // float64 and integers.
  const Tensor d = Tensor::FromVector<double>({1.0 / 3, -7.25, 1e10}, {3});
  const Tensor dh = RunForward(CastCase(d, DType::kBFloat16))["Out"][0];
  EXPECT_EQ(dh.data<bfloat16>()[0].bits, bfloat16(1.0f / 3).bits);
  EXPECT_EQ(static_cast<float>(dh.data<bfloat16>()[1]), -7.25f);
  const Tensor hi = RunForward(
      CastCase(RunForward(CastCase(d, DType::kFloat16))["Out"][0], DType::kInt32))["Out"][0];
  EXPECT_EQ(hi.data<int32_t>()[0], 0);
  EXPECT_EQ(hi.data<int32_t>()[1], -7);
  EXPECT_EQ(hi.data<int32_t>()[2], 2147483647);  // 1e10 is infinity in float16: saturates
  const Tensor i64 = Tensor::FromVector<int64_t>({0, 3, -1000}, {3});
  const Tensor ih = RunForward(CastCase(i64, DType::kFloat16))["Out"][0];
  EXPECT_EQ(static_cast<float>(ih.data<float16>()[2]), -1000.0f);
  const Tensor hb = RunForward(CastCase(ih, DType::kBool))["Out"][0];
  EXPECT_EQ(ToDouble(hb), (std::vector<double>{0, 1, 1}));
}

TEST(LowpFill, FillConstantAndZerosInBothTypes) {
  for (DType dt : kHalfTypes) {
    OpCase c{
        "fill",
        "fill_constant",
        {},
        {{"Out", 1}},
        {{"shape", std::vector<int64_t>{3, 5}}, {"value", 0.1f}, {"dtype", static_cast<int>(dt)}},
        {}};
    const Tensor out = RunForward(c)["Out"][0];
    ASSERT_EQ(out.dtype(), dt);
    for (double v : ValuesOf(out))
      EXPECT_EQ(v, static_cast<double>(Widened(dt, Rounded(dt, 0.1f))));
  }
}

// ---------------------------------------------------------------- GEMM

// C = alpha op(A) op(B) + beta C over strided 16-bit operands, against float64 sums of the same
// (16-bit) values: float32 accumulation, one rounding of C.
template <typename H, typename TC>
void CheckGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
  SCOPED_TRACE(::testing::Message() << (ta ? "T" : "N") << (tb ? "T" : "N") << " " << M << "x" << N
                                    << "x" << K << " alpha " << alpha << " beta " << beta);
  std::mt19937 rng(static_cast<uint32_t>(M * 131 + N * 7 + K));
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  const int64_t lda = ac + 3, ldb = bc + 1, ldc = N + 2;  // strided views
  std::vector<H> a(ar * lda), b(br * ldb);
  std::vector<TC> c(M * ldc);
  for (H& x : a) x = H(u(rng));
  for (H& x : b) x = H(u(rng));
  for (TC& x : c) x = TC(u(rng));
  const std::vector<TC> c0 = c;
  blas::Gemm(ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  // C's rounding (float32: a few ulps; 16 bits: one rounding) plus float32 accumulation's error.
  const double tol = std::is_same_v<TC, float> ? 1e-6 : std::is_same_v<H, bfloat16> ? 4e-3 : 5e-4;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double x = static_cast<float>(ta ? a[k * lda + i] : a[i * lda + k]);
        const double y = static_cast<float>(tb ? b[j * ldb + k] : b[k * ldb + j]);
        s += x * y;
        mag += std::abs(x * y);
      }
      const double want = alpha * s + beta * static_cast<float>(c0[i * ldc + j]);
      const double got = static_cast<float>(c[i * ldc + j]);
      ASSERT_NEAR(got, want, tol * std::abs(want) + 2e-6 * mag + 1e-7) << i << ", " << j;
    }
  // Padding between rows is untouched.
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = N; j < ldc; ++j)
      ASSERT_EQ(static_cast<float>(c[i * ldc + j]), static_cast<float>(c0[i * ldc + j]));
}

template <typename H>
void CheckGemms() {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CheckGemm<H, H>(ta, tb, 7, 5, 13, 1.0f, 0.0f);
      CheckGemm<H, H>(ta, tb, 33, 17, 9, 0.5f, 1.0f);
      CheckGemm<H, float>(ta, tb, 6, 11, 31, 1.0f, 1.0f);
    }
  CheckGemm<H, H>(false, false, 1, 1, 1, 2.0f, 0.0f);
  // Large enough for several pieces on the thread budget (blas::GemmPieces): cut along N, along
  // M and, for a square C, along the side that needs fewer copies; every piece's strided operands
  // and C copied to dense buffers (beta: C copied in as well).
  ASSERT_GT(blas::GemmPieces(520, 260, 520), 1);
  ASSERT_GT(blas::GemmPieces(260, 520, 520), 1);
  ASSERT_GT(blas::GemmPieces(384, 384, 520), 1);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CheckGemm<H, H>(ta, tb, 520, 260, 520, 1.0f, 0.0f);
      CheckGemm<H, float>(ta, tb, 260, 520, 520, 1.0f, 0.5f);
      CheckGemm<H, H>(ta, tb, 384, 384, 520, 0.5f, 1.0f);
    }
}

TEST(LowpGemm, BFloat16MatchesAFloat64Reference) {
  std::printf("bfloat16 GEMM: %s\n",
              blas::HalfGemmIsNative(DType::kBFloat16) ? "oneDNN" : "widened");
  CheckGemms<bfloat16>();
}
// Batched GEMMs (the attention's per-head products): each matrix against float64 sums
// of its values, with a shared B (sb 0), beta, float32 C, batches cut into several runs and one
// run; and the same bits on one thread and on three.
template <typename H, typename TC>
void CheckGemmBatched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t batch,
                      bool shared_b, float beta) {
  SCOPED_TRACE(::testing::Message()
               << (ta ? "T" : "N") << (tb ? "T" : "N") << " " << M << "x" << N << "x" << K
               << " batch " << batch << (shared_b ? " shared B" : "") << " beta " << beta);
  std::mt19937 rng(static_cast<uint32_t>(M * 131 + N * 7 + K + batch));
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t sa = M * K, sb = shared_b ? 0 : K * N, sc = M * N;
  std::vector<H> a(static_cast<size_t>(batch * sa)),
      b(static_cast<size_t>(shared_b ? K * N : batch * sb));
  std::vector<TC> c0(static_cast<size_t>(batch * sc));
  for (H& x : a) x = H(u(rng));
  for (H& x : b) x = H(u(rng));
  for (TC& x : c0) x = TC(u(rng));
  std::vector<TC> one = c0, three = c0;
  cpu_threads::SetBudget(1);
  blas::GemmBatched(ta, tb, M, N, K, 0.5f, a.data(), sa, b.data(), sb, beta, one.data(), sc, batch);
  cpu_threads::SetBudget(3);
  blas::GemmBatched(ta, tb, M, N, K, 0.5f, a.data(), sa, b.data(), sb, beta, three.data(), sc,
                    batch);
  cpu_threads::SetBudget(1);
  ASSERT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(TC)));
  const double tol = std::is_same_v<TC, float> ? 1e-6 : std::is_same_v<H, bfloat16> ? 4e-3 : 5e-4;
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const H* ap = a.data() + p * sa;
          const H* bp = b.data() + p * sb;
          const double x = static_cast<float>(ta ? ap[k * M + i] : ap[i * K + k]);
          const double y = static_cast<float>(tb ? bp[j * K + k] : bp[k * N + j]);
          s += x * y;
          mag += std::abs(x * y);
        }
        const size_t at = static_cast<size_t>(p * sc + i * N + j);
        const double want = 0.5 * s + beta * static_cast<float>(c0[at]);
        ASSERT_NEAR(static_cast<float>(one[at]), want, tol * std::abs(want) + 2e-6 * mag + 1e-7)
            << p << ": " << i << ", " << j;
      }
}

template <typename H>
void CheckGemmsBatched() {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CheckGemmBatched<H, H>(ta, tb, 8, 16, 8, 12, false, 0.0f);  // one run
      CheckGemmBatched<H, H>(ta, tb, 8, 16, 8, 12, true, 1.0f);
      CheckGemmBatched<H, float>(ta, tb, 9, 7, 5, 6, false, 0.5f);
    }
  // Runs of ~32 MFLOP: 3000 products of 2*24*32*24 FLOP make 2 runs, the last one shorter.
  CheckGemmBatched<H, H>(false, true, 24, 32, 24, 3001, false, 0.0f);
  // 17 products of 16.8 MFLOP: 8 runs asked for, 6 made (5 of 3, the last of 2).
  CheckGemmBatched<H, H>(false, false, 64, 64, 2048, 17, false, 0.0f);
  // Too large to batch: one by one, in pieces.
  ASSERT_GT(blas::GemmPieces(520, 260, 520), 1);
  CheckGemmBatched<H, H>(false, false, 520, 260, 520, 2, true, 0.0f);
}

TEST(LowpGemm, BatchedBFloat16AndFloat16MatchAFloat64ReferenceOnAnyThreadCount) {
  CheckGemmsBatched<bfloat16>();
  CheckGemmsBatched<float16>();
}
// float32's batched GEMMs take the same path (float32 C: a few ulps).
TEST(LowpGemm, BatchedFloat32MatchesAFloat64ReferenceOnAnyThreadCount) {
  CheckGemmsBatched<float>();
}

// How a GEMM is cut: by its shape alone, into 1, 2, 4 or 8 pieces of about 64 MFLOP or more
// (a power of two: even shares on 2, 4 or 8 threads), each at least 64 rows or columns, and no
// more pieces than that; and a float32 GEMM cut into pieces gives the same bits on one thread
// and on three.
TEST(LowpGemm, PiecesFollowTheShapeAloneAndKeepTheBitsOnAnyThreadCount) {
  EXPECT_EQ(blas::GemmPieces(128, 1280, 1280), 4);  // the seed MLP's 419 MFLOP: 6 -> 4
  EXPECT_EQ(blas::GemmPieces(1280, 1280, 128), 4);
  EXPECT_EQ(blas::GemmPieces(128, 1280, 700), 2);  // 229 MFLOP: 3 -> 2
  EXPECT_EQ(blas::GemmPieces(256, 256, 512), 1);   // 67 MFLOP
  EXPECT_EQ(blas::GemmPieces(2048, 2048, 2048), 8);
  EXPECT_EQ(blas::GemmPieces(100, 100, 100000), 1);  // 2 GFLOP, but fewer than 128 rows or columns
  for (int64_t m : {64, 200, 700, 1500, 5000})
    for (int64_t k : {64, 1000, 9000}) {
      const int64_t p = blas::GemmPieces(m, 3 * m / 2, k);
      EXPECT_TRUE(p == 1 || p == 2 || p == 4 || p == 8) << m << " " << k << ": " << p;
    }
  // The cut makes that many pieces at most, never a sliver more: 1281 columns in 4 were cut
  // 320 + 320 + 320 + 320 + 1 when the length was rounded down before the multiple of 16.
  for (int64_t len : {1280, 1281, 1295, 1296, 1297, 2049, 4095, 640, 641})
    for (int64_t pieces : {2, 4, 8}) {
      const int64_t step = blas::GemmPieceLength(len, pieces);
      EXPECT_EQ(step % 16, 0) << len << " in " << pieces;
      EXPECT_LE((len + step - 1) / step, pieces) << len << " in " << pieces << ": " << step;
      EXPECT_GE((len + step - 1) / step, pieces - 1) << len << " in " << pieces << ": " << step;
    }
  EXPECT_EQ(blas::GemmPieceLength(1280, 4), 320);  // the seed MLP's: 4 of 320
  const int64_t M = 128, N = 1280, K = 1280;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(M * K), b(K * N), one(M * N), three(M * N);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  cpu_threads::SetBudget(1);
  blas::Gemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, one.data(), N);
  cpu_threads::SetBudget(3);
  blas::Gemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, three.data(), N);
  cpu_threads::SetBudget(1);
  EXPECT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(float)));
}

// The pieces of a GEMM cut for the thread budget run the kernel oneDNN picks for the whole dense
// GEMM (oneDNN 2.6 gives a piece of a strided view its slower gemm:jit instead of brgemm), for the
// MLP's three products: X*W, dY*W' and X'*dY.
TEST(LowpGemm, PiecesRunTheKernelOfTheWholeGemm) {
  if (!blas::HalfGemmIsNative(DType::kBFloat16)) GTEST_SKIP() << "no oneDNN bfloat16 GEMM here";
  const struct {
    bool ta, tb;
    int64_t M, N, K;
  } shapes[] = {{false, false, 128, 1280, 1280},
                {false, true, 128, 1280, 1280},
                {true, false, 1280, 1280, 128}};
  for (const auto& g : shapes) {
    ASSERT_GT(blas::GemmPieces(g.M, g.N, g.K), 1);
    const std::string pieces = blas::HalfGemmImplementation(
        DType::kBFloat16, g.ta, g.tb, g.M, g.N, g.K, g.ta ? g.M : g.K, g.tb ? g.K : g.N, g.N);
    // A dense GEMM of one piece, in the same layout.
    ASSERT_EQ(blas::GemmPieces(64, 64, 64), 1);
    const std::string whole =
        blas::HalfGemmImplementation(DType::kBFloat16, g.ta, g.tb, 64, 64, 64, 64, 64, 64);
    std::printf("%s%s %ldx%ldx%ld: pieces %s, whole %s\n", g.ta ? "T" : "N", g.tb ? "T" : "N",
                static_cast<long>(g.M), static_cast<long>(g.N), static_cast<long>(g.K),
                pieces.c_str(), whole.c_str());
    EXPECT_EQ(pieces, whole);
  }
}

TEST(LowpGemm, Float16MatchesAFloat64Reference) {
  std::printf("float16 GEMM: %s\n", blas::HalfGemmIsNative(DType::kFloat16) ? "oneDNN" : "widened");
  CheckGemms<float16>();
}

// ---------------------------------------------------------------- NaN and infinity

// A NaN (or infinity) in a 16-bit input comes out as it would in float32: the same elements are
// NaN, the same infinite, in every op's forward output and in its input gradients.
TEST(LowpNan, NanAndInfinityPropagateAsInFloat32) {
  const std::vector<LowpCase> all = LowpCases();
  for (const char* name :
       {"elementwise_add_bias", "relu", "tanh", "gelu", "scale", "sum3", "max_pool_3x3_s2",
        "avg_pool_3x3", "batch_norm", "layer_norm", "mul", "matmul_batched", "conv2d_3x3"})
    for (DType dt : kHalfTypes) {
      const LowpCase* found = nullptr;
      for (const LowpCase& c : all)
        if (c.op.name == name) found = &c;
      ASSERT_NE(found, nullptr) << name;
      if (found->op.type == "conv2d" && dt == DType::kFloat16) continue;
      LowpCase c = *found;
      Tensor& x = c.op.inputs[0].second[0];
      x = RoundedTo(x, dt);
      x.data<float>()[1] = kNan;
      x.data<float>()[4] = kInf;
      SCOPED_TRACE(std::string(name) + " " + DTypeName(dt));
      const OpCase ref = Reference(c, dt), low = InHalf(c, dt);
      auto want = RunForward(ref), got = RunForward(low);
      bool any_nan = false;
      for (auto& [slot, ts] : want)
        for (size_t i = 0; i < ts.size(); ++i) {
          const std::vector<double> w = ValuesOf(ts[i]), g = ValuesOf(got[slot][i]);
          for (size_t k = 0; k < w.size(); ++k) {
            ASSERT_EQ(std::isnan(g[k]), std::isnan(w[k])) << slot << "[" << k << "]";
            any_nan |= std::isnan(w[k]);
            if (std::isinf(w[k])) {
              ASSERT_EQ(g[k], w[k]) << slot << "[" << k << "]";
            }
          }
        }
      EXPECT_TRUE(any_nan) << "the NaN input vanished in float32 too";
      auto gw = Grads(ref, CPUPlace(), dt), gg = Grads(low, CPUPlace(), dt);
      for (auto& [var, w] : gw) {
        const std::vector<double> wv = ValuesOf(w), gv = ValuesOf(gg.at(var));
        for (size_t k = 0; k < wv.size(); ++k)
          ASSERT_EQ(std::isnan(gv[k]), std::isnan(wv[k]))
              << "gradient of " << var << "[" << k << "]";
      }
    }
}

// A 16-bit sum keeps float32's signed zeros: -0 + -0 (+ -0) is -0 with two terms (one AddN pass)
// and with three (the float32 loop, which starts from the first term, not from +0).
TEST(LowpNan, SumOfNegativeZerosIsNegativeZeroAsInFloat32) {
  for (DType dt : kHalfTypes)
    for (int terms : {2, 3}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dt) << ", " << terms << " terms");
      const Tensor z = ConvertTensor(Tensor::FromVector<float>({-0.0f, 1.0f, -0.0f}, {3}), dt);
      OpCase c;
      c.name = "sum_negative_zeros";
      c.type = "sum";
      c.inputs = {{"X", std::vector<Tensor>(static_cast<size_t>(terms), z)}};
      const std::vector<double> out = ValuesOf(RunForward(c)["Out"][0]);
      ASSERT_EQ(out.size(), 3u);
      EXPECT_TRUE(out[0] == 0.0 && std::signbit(out[0])) << out[0];
      EXPECT_EQ(out[1], terms);
      EXPECT_TRUE(out[2] == 0.0 && std::signbit(out[2])) << out[2];
    }
}

TEST(LowpNan, ReluOfNanIsNanInBothTypes) {
  for (DType dt : kHalfTypes) {
    const Tensor x = ConvertTensor(Tensor::FromVector<float>({1.5f, -1.f, kNan, -kInf}, {4}), dt);
    const std::vector<double> out = ValuesOf(RunForward(UnaryCase("relu", "relu", x))["Out"][0]);
    EXPECT_EQ(out[0], 1.5);
    EXPECT_EQ(out[1], 0.0);
    EXPECT_TRUE(std::isnan(out[2]));
    EXPECT_EQ(out[3], 0.0);
  }
}

// ---------------------------------------------------------------- dtype rules

TEST(LowpDTypes, NormalizationsTakeFloat32ParametersBesideHalfX) {
  for (DType dt : kHalfTypes) {
    const Tensor x = ConvertTensor(RandomTensor({4, 3}, DType::kFloat32, -1, 1, 1), dt);
    const Tensor p = RandomTensor({3}, DType::kFloat32, 0.5, 1.5, 2);
    OpCase bn{
        "bn",
        "batch_norm",
        {{"X", {x}},
         {"Scale", {ConvertTensor(p, dt)}},
         {"Bias", {p}},
         {"Mean", {p}},
         {"Variance", {p}}},
        {{"Y", 1}, {"MeanOut", 1}, {"VarianceOut", 1}, {"SavedMean", 1}, {"SavedVariance", 1}},
        {},
        {}};
    ExpectErrorContainsAll(ForwardError(bn), {"batch_norm", "Scale", DTypeName(dt), "float32"});
    bn.inputs[1].second[0] = p;
    auto out = RunForward(bn);
    EXPECT_EQ(out["Y"][0].dtype(), dt);
    EXPECT_EQ(out["SavedMean"][0].dtype(), DType::kFloat32);
    OpCase ln{"ln",
              "layer_norm",
              {{"X", {x}}, {"Scale", {ConvertTensor(p, dt)}}},
              {{"Y", 1}, {"Mean", 1}, {"Variance", 1}},
              {},
              {}};
    ExpectErrorContainsAll(ForwardError(ln), {"layer_norm", "Scale", "float32"});
    // float32 X still wants float32 parameters.
    OpCase ln32{"ln32",
                "layer_norm",
                {{"X", {ConvertTensor(x, DType::kFloat32)}}, {"Scale", {ConvertTensor(p, dt)}}},
                {{"Y", 1}, {"Mean", 1}, {"Variance", 1}},
                {},
                {}};
    ExpectErrorContainsAll(ForwardError(ln32), {"layer_norm", "Scale"});
  }
}

TEST(LowpDTypes, MixedOperandsOfAGemmAreABuildError) {
  OpCase c{"mixed",
           "mul",
           {{"X", {ConvertTensor(RandomTensor({2, 3}, DType::kFloat32), DType::kBFloat16)}},
            {"Y", {RandomTensor({3, 4}, DType::kFloat32)}}},
           {{"Out", 1}},
           {},
           {}};
  ExpectErrorContainsAll(ForwardError(c), {"mul", "bfloat16", "float32"});
}

}  // namespace
}  // namespace keel::testing
