// Channels-last tensors for the CPU's own NCHW loops (framework/op/image_layout.h): copies
// between [N, HW, C] and [N, C, HW], one image per piece on the thread budget, in tiles of 16 x 16
// so that both sides are read and written a cache line at a time. Copies only: the same bits on
// any number of threads.
//
// The CPU runs its NHWC convolutions by oneDNN's channels-last primitives; these copies serve the
// paths with no channels-last kernel of their own (float64, the im2col + GEMM fallback, pooling),
// where a layout is a convenience, not a speed: a user on the CPU trains fastest in NCHW.
#pragma once

#include <algorithm>
#include <cstdint>

#include "framework/runtime/cpu_threads.h"

namespace keel {

// dst[n, c, p] = src[n, p, c] (to_planes) or dst[n, p, c] = src[n, c, p], p < HW, c < C. S and D
// may differ (a 16-bit source widened to float32 as it moves).
template <typename S, typename D>
void TransposeImages(const S* src, D* dst, int64_t N, int64_t HW, int64_t C, bool to_planes) {
  constexpr int64_t kTile = 16;
  cpu_threads::ParallelFor(N, [&](int64_t n) {
    const S* s = src + n * HW * C;
    D* d = dst + n * HW * C;
    // to_planes: rows are positions (C apart) and columns channels; else the other way round.
    const int64_t rows = to_planes ? HW : C, cols = to_planes ? C : HW;
    for (int64_t r0 = 0; r0 < rows; r0 += kTile)
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) d[c * rows + r] = static_cast<D>(s[r * cols + c]);
      }
  });
}

// [N, H, W, C] -> [N, C, H, W], and back.
template <typename S, typename D>
void NhwcToNchw(const S* src, D* dst, int64_t N, int64_t C, int64_t HW) {
  TransposeImages(src, dst, N, HW, C, /*to_planes=*/true);
}
template <typename S, typename D>
void NchwToNhwc(const S* src, D* dst, int64_t N, int64_t C, int64_t HW) {
  TransposeImages(src, dst, N, HW, C, /*to_planes=*/false);
}

}  // namespace keel
