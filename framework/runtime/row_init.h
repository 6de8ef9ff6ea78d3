// Rows initialized one at a time: the initial values of row `id` of a table drawn from a generator
// seeded with (seed, id) alone, so that they depend neither on which process creates the row nor
// on the order rows are created in. A parameter server creates the rows of a distributed
// embedding table this way on first touch (framework/ps/sparse_shard.h), one process initializes
// the whole table by the same rule (op row_seeded_random), and a checkpoint that stores such a
// table by its created rows (framework/io/checkpoint.h, StoredRows) fills the others with it.
#pragma once

#include <cstdint>
#include <string>

namespace keel {

// How a table's rows start: kUniform in [a, b), kNormal (mean a, std b), kConstant a.
struct RowInitRule {
  enum Dist : int { kUniform = 0, kNormal = 1, kConstant = 2 };
  int dist = kUniform;
  float a = 0, b = 0;
  int64_t seed = 0;
  bool operator==(const RowInitRule& o) const {
    return dist == o.dist && a == o.a && b == o.b && seed == o.seed;
  }
};

// A constant rule (an optimizer state's rows: Adam's moments start at 0).
inline RowInitRule ConstantRows(float value) {
  RowInitRule r;
  r.dist = RowInitRule::kConstant;
  r.a = value;
  return r;
}

// SplitMix64's step (Steele, Lea and Flood): a well-spread 64-bit value from `x`; the generator
// of RowInit, and the executor's per-op seeds.
uint64_t SplitMix64(uint64_t x);

// Writes row `id`'s `width` initial values (float or double) to `out`.
template <typename T>
void RowInit(const RowInitRule& rule, int64_t id, int64_t width, T* out);

// "uniform(-1, 1) seed 7" (for messages and checkpoint metadata) and back; a text that is not one
// is a keel::Error naming `what`.
std::string RowInitText(const RowInitRule& rule);
RowInitRule ParseRowInit(const std::string& text, const std::string& what);

}  // namespace keel
