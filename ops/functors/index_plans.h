// Index bookkeeping that the CPU kernels and their CUDA twins share: the merged layout of a
// reduction (reduce_sum, reduce_mean, mean) and the source index of a transpose. Planned on the
// host from the shapes; the KEEL_HD members map indices on either side, so the CPU tests check
// the mapping the GPU uses.
#pragma once

#include <cstdint>
#include <vector>

#include "framework/runtime/ddim.h"
#include "ops/functors/hd.h"

namespace keel {
namespace fn {

// X with size-1 dims dropped and neighbouring dims of the same kind (reduced or kept) merged,
// e.g. [2, 3, 4, 5] reducing {1, 2} -> [2, 12, 5] with kinds (kept, reduced, kept).
struct ReduceLayout {
  int n = 0;
  int64_t dims[DDim::kMaxRank];
  bool reduced[DDim::kMaxRank];
  int64_t out_stride[DDim::kMaxRank];  // Out's stride for a kept dim, 0 for a reduced one
  int64_t numel = 1, out_numel = 1;

  // The Out index that X's element i is reduced into.
  KEEL_HD int64_t OutIndex(int64_t i) const {
    int64_t o = 0;
    for (int k = n - 1; k >= 0; --k) {
      o += (i % dims[k]) * out_stride[k];
      i /= dims[k];
    }
    return o;
  }
};

// reduced[d]: whether X's dim d is reduced.
inline ReduceLayout MakeReduceLayout(const DDim& x, const bool* reduced) {
  ReduceLayout l;
  for (int i = 0; i < x.size(); ++i) {
    l.numel *= x[i];
    if (x[i] == 1) continue;
    if (l.n > 0 && l.reduced[l.n - 1] == reduced[i]) {
      l.dims[l.n - 1] *= x[i];
    } else {
      l.dims[l.n] = x[i];
      l.reduced[l.n] = reduced[i];
      ++l.n;
    }
  }
  if (l.n == 0) {  // a single element
    l.dims[0] = 1;
    l.reduced[0] = true;
    l.n = 1;
  }
  int64_t stride = 1;
  for (int k = l.n - 1; k >= 0; --k) {
    l.out_stride[k] = l.reduced[k] ? 0 : stride;
    if (!l.reduced[k]) stride *= l.dims[k];
  }
  l.out_numel = stride;
  return l;
}

// The X elements reduced into one Out element, as offsets: X's offset of Out element o is
// Base(o) + Offset(r) for r in [0, count). Kept and reduced dims each listed outer to inner.
struct ReduceGather {
  int n_kept = 0, n_red = 0;
  int64_t kept_dims[DDim::kMaxRank], kept_stride[DDim::kMaxRank];
  int64_t red_dims[DDim::kMaxRank], red_stride[DDim::kMaxRank];
  int64_t count = 1;  // elements per Out element

  KEEL_HD int64_t Base(int64_t o) const {
    int64_t off = 0;
    for (int k = n_kept - 1; k >= 0; --k) {
      off += (o % kept_dims[k]) * kept_stride[k];
      o /= kept_dims[k];
    }
    return off;
  }
  KEEL_HD int64_t Offset(int64_t r) const {
    int64_t off = 0;
    for (int k = n_red - 1; k >= 0; --k) {
      off += (r % red_dims[k]) * red_stride[k];
      r /= red_dims[k];
    }
    return off;
  }
};

inline ReduceGather MakeReduceGather(const ReduceLayout& l) {
  ReduceGather g;
  int64_t stride = 1;
  int64_t strides[DDim::kMaxRank];
  for (int k = l.n - 1; k >= 0; --k) {
    strides[k] = stride;
    stride *= l.dims[k];
  }
  for (int k = 0; k < l.n; ++k) {
    if (l.reduced[k]) {
      g.red_dims[g.n_red] = l.dims[k];
      g.red_stride[g.n_red++] = strides[k];
      g.count *= l.dims[k];
    } else {
      g.kept_dims[g.n_kept] = l.dims[k];
      g.kept_stride[g.n_kept++] = strides[k];
    }
  }
  return g;
}

// Out = X with dims permuted (Out's dim d is X's dim perm[d]): Out's element o reads X's element
// SrcIndex(o).
struct TransposePlan {
  int rank = 0;
  int64_t out_dims[DDim::kMaxRank];
  int64_t src_stride[DDim::kMaxRank];  // X's stride of the dim that Out's dim d walks

  KEEL_HD int64_t SrcIndex(int64_t o) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (o % out_dims[d]) * src_stride[d];
      o /= out_dims[d];
    }
    return off;
  }
};

inline TransposePlan MakeTransposePlan(const DDim& x, const std::vector<int>& perm) {
  TransposePlan p;
  p.rank = x.size();
  int64_t in_stride[DDim::kMaxRank];
  int64_t s = 1;
  for (int d = p.rank - 1; d >= 0; --d) {
    in_stride[d] = s;
    s *= x[d];
  }
  for (int d = 0; d < p.rank; ++d) {
    p.out_dims[d] = x[perm[d]];
    p.src_stride[d] = in_stride[perm[d]];
  }
  return p;
}

}  // namespace fn
}  // namespace keel
