// float16 and bfloat16: exact round trips of every 16-bit pattern, round-to-nearest-even at the
// ties, overflow, subnormals and NaN; float16 also against the compiler's own _Float16 where it
// has one.
#include "framework/runtime/float16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace keel {
namespace {

float F(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(Float16, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float16 h = float16::FromBits(static_cast<uint16_t>(b));
    const float f = static_cast<float>(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(float16(f)))) << b;
      continue;
    }
    EXPECT_EQ(float16(f).bits, b) << "pattern " << b << " widened to " << f;
  }
}

TEST(BFloat16, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const bfloat16 h = bfloat16::FromBits(static_cast<uint16_t>(b));
    const float f = static_cast<float>(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(f)))) << b;
      continue;
    }
    EXPECT_EQ(bfloat16(f).bits, b) << "pattern " << b;
  }
}

TEST(Float16, KnownValuesTiesOverflowAndSubnormals) {
  EXPECT_EQ(float16(1.0f).bits, 0x3c00);
  EXPECT_EQ(float16(-2.0f).bits, 0xc000);
  EXPECT_EQ(float16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(float16(65519.0f).bits, 0x7bff);  // below the midpoint to 65536
  EXPECT_EQ(float16(65520.0f).bits, 0x7c00);  // the midpoint ties to even: infinity
  EXPECT_EQ(float16(1e30f).bits, 0x7c00);
  EXPECT_EQ(float16(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
  EXPECT_EQ(float16(5.9604644775390625e-8f).bits, 0x0001);   // 2^-24, the smallest subnormal
  EXPECT_EQ(float16(2.98023223876953125e-8f).bits, 0x0000);  // 2^-25 ties to even (0)
  EXPECT_EQ(float16(8.94069671630859375e-8f).bits, 0x0002);  // 1.5 * 2^-24 ties to even (2)
  EXPECT_EQ(float16(6.103515625e-5f).bits, 0x0400);          // 2^-14, the smallest normal
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1); 1 + 3 * 2^-11 rounds up.
  EXPECT_EQ(float16(1.0f + 0.00048828125f).bits, 0x3c00);
  EXPECT_EQ(float16(1.0f + 3 * 0.00048828125f).bits, 0x3c02);
  EXPECT_TRUE(std::isnan(static_cast<float>(float16(std::nanf("")))));
  EXPECT_EQ(float16(-0.0f).bits, 0x8000);
}

TEST(BFloat16, KnownValuesTiesAndNaN) {
  EXPECT_EQ(bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bfloat16(F(0x3f808000)).bits, 0x3f80);  // tie, even stays
  EXPECT_EQ(bfloat16(F(0x3f818000)).bits, 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(bfloat16(F(0x3f808001)).bits, 0x3f81);  // above the tie
  EXPECT_EQ(bfloat16(F(0x7f7fffff)).bits, 0x7f80);  // float32's max rounds to infinity
  // A NaN whose payload sits in the dropped bits stays a NaN (rounding would make it infinity).
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(F(0x7f800001)))));
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(F(0xff800001)))));
}

#if defined(__FLT16_MAX__) && !defined(__clang__)
TEST(Float16, MatchesTheCompilersFloat16OnRandomFloats) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    // Half the draws any float32, half in and around float16's range (exponents -26 to 17).
    uint32_t bits = static_cast<uint32_t>(rng());
    if (i % 2) bits = (bits & 0x807fffffu) | ((101u + bits % 44u) << 23);
    const float f = F(bits);
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(float16(f).bits, ref_bits) << "float bits 0x" << std::hex << bits;
  }
}
#endif

}  // namespace
}  // namespace keel
