// DDim: a tensor shape held inline (no heap), so shape arithmetic in the hot path allocates
// nothing. -1 marks an unknown (batch) dimension in compile-time shapes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "framework/error.h"

namespace keel {

class DDim {
 public:
  static constexpr int kMaxRank = 9;

  DDim() = default;
  DDim(std::initializer_list<int64_t> dims) { Assign(dims.begin(), dims.end()); }
  explicit DDim(const std::vector<int64_t>& dims) { Assign(dims.begin(), dims.end()); }

  int size() const { return rank_; }
  bool empty() const { return rank_ == 0; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + rank_; }

  void push_back(int64_t v) {
    KEEL_ENFORCE(rank_ < kMaxRank, "tensor rank exceeds ", kMaxRank);
    d_[rank_++] = v;
  }
  void resize(int r) {
    KEEL_ENFORCE(r >= 0 && r <= kMaxRank, "tensor rank ", r, " outside [0, ", kMaxRank, "]");
    for (int i = rank_; i < r; ++i) d_[i] = 0;
    rank_ = r;
  }

  // Product of all dims; 1 for a scalar shape. -1 when any dim is unknown. A product past int64
  // (a crafted shape) is a keel::Error, never a wrapped count.
  int64_t numel() const {
    for (int i = 0; i < rank_; ++i)
      if (d_[i] < 0) return -1;
    return prod(0, rank_);
  }
  // Product of dims [begin, end) (1 when empty), checked for overflow like numel(). A range past
  // the rank (an axis attribute nobody checked) is a keel::Error, not a read past the dims.
  int64_t prod(int begin, int end) const {
    KEEL_ENFORCE(begin >= 0 && end <= rank_, "dims [", begin, ", ", end, ") of shape ", str(),
                 " are outside its rank ", rank_);
    int64_t n = 1;
    for (int i = begin; i < end; ++i)
      KEEL_ENFORCE(!__builtin_mul_overflow(n, d_[i], &n), "the element count of shape ", str(),
                   " overflows int64");
    return n;
  }
  // Collapses to 2-D: [prod(0,k), prod(k,rank)].
  DDim flatten_to_2d(int k) const { return DDim{prod(0, k), prod(k, rank_)}; }
  bool known() const {
    for (int i = 0; i < rank_; ++i)
      if (d_[i] < 0) return false;
    return true;
  }

  std::vector<int64_t> vec() const { return std::vector<int64_t>(d_, d_ + rank_); }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) {
      if (i) s += ", ";
      s += std::to_string(d_[i]);
    }
    return s + "]";
  }

  bool operator==(const DDim& o) const {
    if (rank_ != o.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (d_[i] != o.d_[i]) return false;
    return true;
  }
  bool operator!=(const DDim& o) const { return !(*this == o); }

 private:
  template <typename It>
  void Assign(It b, It e) {
    rank_ = 0;
    for (; b != e; ++b) push_back(*b);
  }
  int64_t d_[kMaxRank] = {};
  int rank_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const DDim& d) { return os << d.str(); }

}  // namespace keel
