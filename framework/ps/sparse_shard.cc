#include "framework/ps/sparse_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "framework/error.h"

namespace keel {
namespace ps {

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from 53 random bits.
double Unit(uint64_t& state) {
  state = SplitMix64(state);
  return static_cast<double>(state >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace

template <typename T>
void RowInit(const RowInitRule& rule, int64_t id, int64_t width, T* out) {
  // The generator: SplitMix64 over a state seeded by (seed, id); fixed arithmetic, so every
  // process and compiler draws the same values.
  uint64_t state = SplitMix64(static_cast<uint64_t>(rule.seed)) ^ static_cast<uint64_t>(id);
  state = SplitMix64(state);
  for (int64_t j = 0; j < width; ++j) {
    double v = rule.a;
    if (rule.dist == RowInitRule::kUniform) {
      v = rule.a + (static_cast<double>(rule.b) - rule.a) * Unit(state);
    } else if (rule.dist == RowInitRule::kNormal) {
      // Box-Muller, one value per pair of draws.
      const double u1 = 1.0 - Unit(state), u2 = Unit(state);
      v = rule.a + rule.b * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
    out[j] = static_cast<T>(v);
  }
}
template void RowInit<float>(const RowInitRule&, int64_t, int64_t, float*);
template void RowInit<double>(const RowInitRule&, int64_t, int64_t, double*);

SparseShard::SparseShard(std::string name, Variable* table, std::vector<Variable*> state,
                         std::vector<float> state_init, Variable* ids, int64_t width,
                         RowInitRule rule, DType dtype)
    : name_(std::move(name)),
      table_(table),
      state_(std::move(state)),
      state_init_(std::move(state_init)),
      ids_(ids),
      width_(width),
      rule_(rule),
      dtype_(dtype) {
  KEEL_ENFORCE(dtype == DType::kFloat32 || dtype == DType::kFloat64, "distributed table ", name_,
               ": float32 or float64 rows only, got ", DTypeName(dtype));
  KEEL_ENFORCE(state_.size() == state_init_.size(), "distributed table ", name_, ": ",
               state_.size(), " state vars but ", state_init_.size(), " initial values");
  Grow();
}

void SparseShard::Grow() {
  const int64_t n = rows();
  const int64_t cap = std::max<int64_t>(1024, 2 * capacity_);
  auto regrow = [&](Variable* v, DType dtype, int64_t width) {
    Tensor fresh;
    const size_t row = SizeOf(dtype) * static_cast<size_t>(width);
    char* p = static_cast<char*>(fresh.Alloc(dtype, DDim({cap, width})));
    if (n > 0) std::memcpy(p, v->tensor().raw_data(), row * static_cast<size_t>(n));
    fresh.Resize(width == 1 && v == ids_ ? DDim({n}) : DDim({n, width}));
    *v->mutable_tensor() = fresh;
  };
  regrow(table_, dtype_, width_);
  for (Variable* s : state_) regrow(s, dtype_, width_);
  regrow(ids_, DType::kInt64, 1);
  capacity_ = cap;
}

int64_t SparseShard::Row(int64_t id) {
  auto it = row_of_.find(id);
  if (it != row_of_.end()) return it->second;
  const int64_t k = rows();
  if (k == capacity_) Grow();
  auto extend = [&](Variable* v, DType dtype, int64_t width) -> void* {
    Tensor* t = v->mutable_tensor();
    t->Resize(v == ids_ ? DDim({k + 1}) : DDim({k + 1, width}));
    return static_cast<char*>(t->mutable_data(dtype)) +
           SizeOf(dtype) * static_cast<size_t>(width) * static_cast<size_t>(k);
  };
  if (dtype_ == DType::kFloat32) {
    RowInit(rule_, id, width_, static_cast<float*>(extend(table_, dtype_, width_)));
  } else {
    RowInit(rule_, id, width_, static_cast<double*>(extend(table_, dtype_, width_)));
  }
  for (size_t i = 0; i < state_.size(); ++i) {
    void* p = extend(state_[i], dtype_, width_);
    for (int64_t j = 0; j < width_; ++j) {
      if (dtype_ == DType::kFloat32) {
        static_cast<float*>(p)[j] = state_init_[i];
      } else {
        static_cast<double*>(p)[j] = state_init_[i];
      }
    }
  }
  *static_cast<int64_t*>(extend(ids_, DType::kInt64, 1)) = id;
  row_of_.emplace(id, k);
  return k;
}

}  // namespace ps
}  // namespace keel
