#include "framework/ps/sparse_shard.h"

#include <algorithm>
#include <cstring>

#include "framework/error.h"

namespace keel {
namespace ps {

namespace {

int64_t BitsOf(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof(i));
  return i;
}

float FloatOf(int64_t bits) {
  const int32_t i = static_cast<int32_t>(bits);
  float f;
  std::memcpy(&f, &i, sizeof(f));
  return f;
}

}  // namespace

std::vector<int64_t> ShardHeader::Encode() const {
  std::vector<int64_t> w = {rows, rule.dist, BitsOf(rule.a), BitsOf(rule.b), rule.seed};
  for (float v : state_init) w.push_back(BitsOf(v));
  return w;
}

ShardHeader ShardHeader::Decode(const std::vector<int64_t>& words) {
  KEEL_ENFORCE(words.size() >= 5, "a distributed table's shard header has ", words.size(),
               " words, fewer than 5");
  ShardHeader h;
  h.rows = words[0];
  h.rule.dist = static_cast<int>(words[1]);
  h.rule.a = FloatOf(words[2]);
  h.rule.b = FloatOf(words[3]);
  h.rule.seed = words[4];
  for (size_t i = 5; i < words.size(); ++i) h.state_init.push_back(FloatOf(words[i]));
  return h;
}

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
  // Rows already there (a checkpoint's, put in the variables before the server's loop starts)
  // are adopted: row k of each variable belongs to ids_[k].
  const Tensor& ids_in = ids_->tensor();
  const int64_t n = ids_in.initialized() ? ids_in.numel() : 0;
  for (Variable* v : state_) CheckAdopted(v, n);
  CheckAdopted(table_, n);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t id = ids_in.data<int64_t>()[k];
    KEEL_ENFORCE(row_of_.emplace(id, k).second, "distributed table ", name_, ": id ", id,
                 " is held twice");
  }
  Grow();
}

void SparseShard::CheckAdopted(const Variable* v, int64_t n) const {
  const Tensor& t = v->tensor();
  const bool ok = n == 0 ? !t.initialized() || t.numel() == 0
                         : t.initialized() && t.dtype() == dtype_ && t.dims() == DDim({n, width_});
  KEEL_ENFORCE(ok, "distributed table ", name_, ": ", n, " ids but a variable of ",
               t.initialized() ? t.dims().str() : std::string("no value"), " (want [", n, ", ",
               width_, "] ", DTypeName(dtype_), ")");
}

void SparseShard::Grow() {
  const int64_t n = rows();
  const int64_t cap = std::max<int64_t>({1024, 2 * capacity_, 2 * n});
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
