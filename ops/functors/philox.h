// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator, so element i's random number is a pure function of (seed, counter, i).
// The CPU and CUDA dropout kernels both draw their masks here: same seed, same mask, on any place
// and any thread count.
#pragma once

#include <cstdint>

#include "ops/functors/hd.h"

namespace keel {
namespace fn {

struct Philox4 {
  uint32_t v[4];
};

KEEL_HD uint32_t MulHiLo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// Ten rounds of Philox4x32 on counter c with key k.
KEEL_HD Philox4 Philox4x32(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = MulHiLo(kM0, c.v[0], &hi0);
    const uint32_t lo1 = MulHiLo(kM1, c.v[2], &hi1);
    c = Philox4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// The Philox block of dropout elements [4 * block, 4 * block + 4): counter (block, offset), key
// seed. `offset` counts the op's runs, so each run draws anew.
KEEL_HD Philox4 DropoutBlock(uint64_t seed, uint64_t offset, uint64_t block) {
  return Philox4x32(Philox4{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                             static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}},
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The dropout keep bit of element i: word i % 4 of its block, kept when it is >= threshold =
// p * 2^32.
KEEL_HD bool DropoutKeep(uint64_t seed, uint64_t offset, int64_t i, uint64_t threshold) {
  return DropoutBlock(seed, offset, static_cast<uint64_t>(i) >> 2).v[i & 3] >= threshold;
}

// Out (and dX) of a dropped-out element: v * scale where kept, 0 elsewhere.
template <typename T>
KEEL_HD T DropoutApply(bool keep, T v, T scale) {
  return keep ? v * scale : T(0);
}

// p * 2^32 as the keep threshold (p in [0, 1]; p = 1 drops everything).
inline uint64_t DropoutThreshold(float p) {
  return static_cast<uint64_t>(static_cast<double>(p) * 4294967296.0);
}

}  // namespace fn
}  // namespace keel
