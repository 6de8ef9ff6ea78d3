#include "ops/cudnn_plan.h"

#include "framework/error.h"

namespace keel {

ConvAlgoChoice PickConvAlgo(const std::vector<ConvAlgoPerf>& perfs, size_t workspace_limit,
                            bool deterministic, bool allow_tf32, const std::string& what,
                            const std::string& problem) {
  int too_big = 0, nondeterministic = 0, tf32 = 0;
  for (const ConvAlgoPerf& p : perfs) {
    if (!p.ok) continue;
    if (p.workspace_bytes > workspace_limit) {
      ++too_big;
      continue;
    }
    if (deterministic && !p.deterministic) {
      ++nondeterministic;
      continue;
    }
    if (!allow_tf32 && p.uses_tf32) {
      ++tf32;
      continue;
    }
    return ConvAlgoChoice{p.algo, p.math_type, p.workspace_bytes};
  }
  KEEL_THROW(what, " ", problem, ": cuDNN has no usable algorithm (", perfs.size(), " returned; ",
             too_big,
             " need more workspace than FLAGS_conv_workspace_size_limit=", workspace_limit >> 20,
             " MB, ", nondeterministic, " are not deterministic (FLAGS_cudnn_deterministic), ",
             tf32, " use TF32 (FLAGS_allow_tf32=false))");
}

namespace {
int64_t OutSize(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  if (in + 2 * p < k) return 0;
  return (in - k + 2 * p + (ceil_mode ? s - 1 : 0)) / s + 1;
}
std::string Pair(const std::vector<int>& v) {
  return "{" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + "}";
}
}  // namespace

std::string CudnnPoolUnsupported(const DDim& x, const std::vector<int>& ksize,
                                 const std::vector<int>& strides, const std::vector<int>& paddings,
                                 bool global, bool ceil_mode) {
  if (global) return "";
  for (int d = 0; d < 2; ++d) {
    if (paddings[d] >= ksize[d])
      return StrCat("paddings ", Pair(paddings), " must be smaller than ksize ", Pair(ksize),
                    " for cuDNN (a window of padding alone has no input)");
  }
  if (!ceil_mode) return "";
  for (int d = 0; d < 2; ++d) {
    const int64_t fl = OutSize(x[2 + d], ksize[d], strides[d], paddings[d], false);
    const int64_t ce = OutSize(x[2 + d], ksize[d], strides[d], paddings[d], true);
    if (fl != ce)
      return StrCat("ceil_mode=true adds a partial window past the padding (",
                    d == 0 ? "height" : "width", " ", x[2 + d], ", ksize ", Pair(ksize),
                    ", strides ", Pair(strides), ", paddings ", Pair(paddings), ": ", ce,
                    " windows instead of ", fl,
                    "), which cuDNN cannot pool; use ceil_mode=false or run on CPUPlace");
  }
  return "";
}

}  // namespace keel
