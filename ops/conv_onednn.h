// float32 conv2d and its gradients by oneDNN's convolution primitives.
//
// oneDNN's direct convolutions (jit:avx512_core and its 1x1 variant) want channel-blocked layouts
// (nChw16c), so each call reorders NCHW input and output into the layouts the primitive chose
// and back; measured on ResNet-20's shapes (batch 32, one core), this is still 1.2x (forward) to
// 1.4x (both gradients) faster than keel's im2col + GEMM and Winograd kernels, reorders included.
//
// One ConvPrimitives object serves one op's one geometry and one piece size: the primitives,
// their reorders and the layouts are created once (in the plan's kernel, not per step). It may
// run several pieces at once; every primitive runs on the calling thread (one OpenMP thread), so
// results do not depend on how many threads run the pieces. Working memory is per thread.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <memory>

namespace keel {
namespace onednn {

// NCHW input [N, C, H, W] and filter [M, C / groups, kh, kw]; paddings are symmetric and
// dilations count from 1 (keel's convention).
struct ConvShape {
  int64_t N, C, H, W, M, kh, kw, sh, sw, ph, pw, dh, dw, groups, Ho, Wo;
  bool operator==(const ConvShape& o) const;
};

class ConvPrimitives {
 public:
  // Creates the forward primitive (and, with `backward`, the data and weights gradients').
  ConvPrimitives(const ConvShape& s, bool backward);
  const ConvShape& shape() const { return shape_; }
  bool has_backward() const;

  // Reorders an OIHW filter into the layout the forward (or data-gradient) primitive wants.
  // `out` is allocated on first use and reused.
  void PrepareForwardWeights(const float* w, dnnl::memory* out) const;
  void PrepareBackwardWeights(const float* w, dnnl::memory* out) const;

  // y = conv(x, w) for this piece. `w` comes from PrepareForwardWeights.
  void Forward(const float* x, const dnnl::memory& w, float* y) const;
  // dx (may be null; `w` from PrepareBackwardWeights) and dw (OIHW, may be null) for this piece.
  void Backward(const float* x, const dnnl::memory& w, const float* dy, float* dx, float* dw) const;

 private:
  struct Impl;
  ConvShape shape_;
  std::shared_ptr<const Impl> impl_;
};

// Whether oneDNN's primitives take this geometry (they take every conv2d keel accepts with a
// non-empty output; the check is here so that the caller falls back rather than fails).
bool Supports(const ConvShape& s);

}  // namespace onednn
}  // namespace keel
