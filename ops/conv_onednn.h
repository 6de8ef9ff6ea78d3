// conv2d and its gradients by oneDNN's convolution primitives: float32, and bfloat16 (mixed
// precision: bfloat16 data, float32 accumulation, the filter gradient in float32).
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
#include <vector>

namespace keel {
namespace onednn {

// Input [N, C, H, W] and filter [M, C / groups, kh, kw]; paddings are symmetric and dilations
// count from 1 (keel's convention). nhwc: input and output lie channels last in memory ([N, H, W,
// C]; the dims above still name N, C, H, W), the filter as always.
struct ConvShape {
  int64_t N, C, H, W, M, kh, kw, sh, sw, ph, pw, dh, dw, groups, Ho, Wo;
  bool nhwc = false;
  bool operator==(const ConvShape& o) const;
};

// Data of type `dt` (f32 or bf16): input, filter, output and their gradients but the filter's,
// which is always float32 (OIHW). Throws dnnl::error where oneDNN has no implementation, or for
// 16-bit data only its reference loops (the caller then runs the conv another way).
class ConvPrimitives {
 public:
  // Creates the forward primitive (and, with `backward`, the data and weights gradients').
  ConvPrimitives(const ConvShape& s, bool backward, dnnl::memory::data_type dt);
  const ConvShape& shape() const { return shape_; }
  bool has_backward() const;

  // Reorders an OIHW filter into the layout the forward (or data-gradient) primitive wants.
  // `out` is allocated on first use and reused.
  void PrepareForwardWeights(const void* w, dnnl::memory* out) const;
  void PrepareBackwardWeights(const void* w, dnnl::memory* out) const;

  // y = conv(x, w) for this piece. `w` comes from PrepareForwardWeights.
  void Forward(const void* x, const dnnl::memory& w, void* y) const;
  // dx (may be null; `w` from PrepareBackwardWeights) and dw (float32 OIHW, may be null) for this
  // piece.
  void Backward(const void* x, const dnnl::memory& w, const void* dy, void* dx, float* dw) const;

 private:
  struct Impl;
  ConvShape shape_;
  std::shared_ptr<const Impl> impl_;
};

// 16-bit data between NCHW and oneDNN's 16-channel blocks (nChw16c: [N, C / 16, H, W, 16]), for C
// a multiple of 16: the transposes the 16-bit convolutions' reorders run (see conv_onednn.cc).
void ToChannelBlocks16(const uint16_t* nchw, uint16_t* blocked, int64_t N, int64_t C, int64_t HW);
void FromChannelBlocks16(const uint16_t* blocked, uint16_t* nchw, int64_t N, int64_t C, int64_t HW);

// Whether oneDNN's primitives take this geometry (they take every conv2d keel accepts with a
// non-empty output; the check is here so that the caller falls back rather than fails).
bool Supports(const ConvShape& s);

// One conv2d op's convolutions of data type `dt`, in pieces of `per` whole images (the last piece
// may be smaller) that run on the CPU thread budget: each piece runs its primitive on one thread,
// the filter gradient is summed over the pieces in piece order (in float32), so results are the
// same bits on any number of threads. The primitives of every piece size are created once and
// kept (a few batch sizes).
class PiecedConv {
 public:
  explicit PiecedConv(dnnl::memory::data_type dt) : dt_(dt) {}

  // False (nothing written) when oneDNN refuses the geometry: the caller runs it another way.
  bool Forward(const ConvShape& s, int64_t per, const void* x, const void* f, void* y);
  // dx and df (of the data type; either may be null).
  bool Backward(const ConvShape& s, int64_t per, const void* x, const void* f, const void* dy,
                void* dx, void* df);

 private:
  struct Entry {
    std::unique_ptr<ConvPrimitives> prims;
    dnnl::memory w;  // the filter in the primitive's layout, this call's
  };
  bool Prepare(const ConvShape& s, int64_t per, int64_t pieces, bool backward, const void* f);

  dnnl::memory::data_type dt_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::vector<ConvShape> refused_;
  std::vector<Entry*> piece_entry_;
  std::vector<float> dw_;  // the filter gradient of each piece, float32
};

}  // namespace onednn
}  // namespace keel
