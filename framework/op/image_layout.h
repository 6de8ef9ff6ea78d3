// The image layouts of conv2d, pool2d and batch_norm (Paddle's `data_format` / `data_layout`
// attrs), shared by their CPU (.cc) and CUDA (.cu) op files and the DSL layers that append them:
// NCHW, the default ("AnyLayout" reads as NCHW, as in Paddle), or NHWC, channels last ([N, H, W,
// C]: a pixel's channels lie together, the layout Tensor Cores read without a transpose).
//
// The ops' math is written once, in NCHW terms: a kernel turns an NHWC shape into the NCHW one it
// describes (ToNchw), and each device either reads channels-last memory directly (cuDNN's and
// oneDNN's NHWC descriptors) or runs its NCHW loops over transposed copies (the CPU's own loops,
// ops/image_layout_cpu.h). conv2d's Filter stays [M, C / groups, kh, kw] in both layouts (Paddle's
// convention): a model changes layout without changing its parameters or checkpoints.
// batch_norm over NHWC is batch_norm over [N * H * W, C] (PerChannelView): the same values per
// channel, channels innermost, which the CPU math and keel's CUDA kernels normalize as they do
// [N, C]; cuDNN alone is given the real batch (ops/batch_norm_ops.cu says why).
#pragma once

#include <cstdint>
#include <string>

#include "framework/error.h"
#include "framework/runtime/ddim.h"

namespace keel {

enum class ImageLayout { kNCHW, kNHWC };

// The values the layout attrs accept.
inline bool IsImageLayoutName(const std::string& s) {
  return s == "NCHW" || s == "NHWC" || s == "AnyLayout";
}
inline ImageLayout ParseImageLayout(const std::string& s) {
  return s == "NHWC" ? ImageLayout::kNHWC : ImageLayout::kNCHW;
}
inline const char* ImageLayoutName(ImageLayout l) {
  return l == ImageLayout::kNHWC ? "NHWC" : "NCHW";
}
// "[N, C, H, W]" or "[N, H, W, C]", for shape errors.
inline const char* ImageDimsName(ImageLayout l) {
  return l == ImageLayout::kNHWC ? "[N, H, W, C]" : "[N, C, H, W]";
}

// The channel axis of a rank-`rank` tensor: 1, or the last one.
inline int ChannelAxis(ImageLayout l, int rank) { return l == ImageLayout::kNHWC ? rank - 1 : 1; }

// A 4-D shape in `l` as the NCHW shape it describes ([N, H, W, C] -> [N, C, H, W]), and back.
inline DDim ToNchw(const DDim& d, ImageLayout l) {
  if (l == ImageLayout::kNCHW || d.size() != 4) return d;
  return DDim{d[0], d[3], d[1], d[2]};
}
inline DDim FromNchw(const DDim& d, ImageLayout l) {
  if (l == ImageLayout::kNCHW || d.size() != 4) return d;
  return DDim{d[0], d[2], d[3], d[1]};
}

// What a per-channel op (batch_norm) sees: NCHW as it is ([N, C, ...]); channels last as
// [N * ... , C], every position a row of C values.
inline DDim PerChannelView(const DDim& d, ImageLayout l) {
  if (l == ImageLayout::kNCHW || d.size() <= 2) return d;
  return DDim{d.prod(0, d.size() - 1), d[d.size() - 1]};
}

}  // namespace keel
