// The decisions around cuDNN that need no device, so CPU tests pin them: which of the algorithms a
// search returned a convolution uses, and which pool2d configurations cuDNN computes exactly as the
// CPU kernel does (the others are refused by name on CUDAPlace).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "framework/runtime/ddim.h"

namespace keel {

// One entry of cudnnFind*/cudnnGet*_v7's answer, in the order cuDNN ranked them (fastest first).
struct ConvAlgoPerf {
  int algo = 0;
  bool ok = false;             // status == CUDNN_STATUS_SUCCESS
  size_t workspace_bytes = 0;  // memory
  bool deterministic = false;  // determinism == CUDNN_DETERMINISTIC
  int math_type = 0;           // cudnnMathType_t
  bool uses_tf32 = false;      // math_type lets float32 run on TF32 tensor cores
};

struct ConvAlgoChoice {
  int algo = -1;
  int math_type = 0;
  size_t workspace_bytes = 0;
};

// The first (fastest) usable entry: searched successfully, within `workspace_limit` bytes,
// deterministic when `deterministic` (FLAGS_cudnn_deterministic), and not TF32 unless `allow_tf32`
// (FLAGS_allow_tf32). None: a keel::Error naming `what` (e.g. "conv2d forward"), the shapes in
// `problem`, and the flags that narrowed the choice.
ConvAlgoChoice PickConvAlgo(const std::vector<ConvAlgoPerf>& perfs, size_t workspace_limit,
                            bool deterministic, bool allow_tf32, const std::string& what,
                            const std::string& problem);

// Algorithm searches the conv2d CUDA kernels ran in this process (one per shape, direction and
// flags). Defined in libkeel_cuda (ops/conv_ops.cu), which the GPU tests link; they check that
// steady-state steps search nothing.
int64_t CudnnConvAlgoSearches();

// Why cuDNN cannot compute pool2d like the CPU kernel for input dims `x` (NCHW), or "" when it can.
// cuDNN pools whole windows inside the symmetrically padded input; the CPU kernel's ceil_mode adds
// a last, partial window past the padding, and a padding as large as the window gives windows with
// no input at all. `global` pools the whole plane (ksize, paddings ignored).
std::string CudnnPoolUnsupported(const DDim& x, const std::vector<int>& ksize,
                                 const std::vector<int>& strides, const std::vector<int>& paddings,
                                 bool global, bool ceil_mode);

}  // namespace keel
