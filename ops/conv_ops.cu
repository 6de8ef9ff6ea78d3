// conv2d on CUDA through cuDNN: the kernels are conv_ops.h's; here is the math (cross-correlation,
// NCHW or NHWC, groups, strides, paddings, dilations as the CPU op). Channels last, cuDNN reads
// and writes the data as it lies, and the filter (which keeps Paddle's [M, C / groups, kh, kw] in
// every layout) is copied to [M, kh, kw, C / groups] for it, its gradient back: cuDNN's NHWC
// Tensor Core kernels want the filter channels last too, and a filter is small beside the data.
// Each direction's algorithm is chosen once per shape and cached process-wide: cuDNN's heuristic
// ranking, or with FLAGS_cudnn_exhaustive_search a timed search; the choice skips algorithms that
// need more workspace than FLAGS_conv_workspace_size_limit, that are not deterministic under
// FLAGS_cudnn_deterministic, or that use TF32 unless FLAGS_allow_tf32 (cuDNN's default math allows
// TF32 on Ampere and later, so keel asks for FMA math). Workspace comes from the device's caching
// allocator.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <climits>
#include <string>
#include <type_traits>
#include <vector>

#include "framework/op/image_layout.h"
#include "ops/algo_cache.h"
#include "ops/conv_ops.h"
#include "ops/cuda_util.cuh"
#include "ops/cudnn_plan.h"
#include "ops/cudnn_util.h"

DECLARE_bool(cudnn_deterministic);
DECLARE_bool(cudnn_exhaustive_search);
DECLARE_int64(conv_workspace_size_limit);

namespace keel {
namespace {

enum class ConvDir { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };
const char* DirName(ConvDir d) {
  return d == ConvDir::kForward        ? "conv2d forward"
         : d == ConvDir::kBackwardData ? "conv2d_grad (Input@GRAD)"
                                       : "conv2d_grad (Filter@GRAD)";
}

AlgoCache<ConvAlgoChoice>& ConvAlgos() {
  static auto* cache = new AlgoCache<ConvAlgoChoice>;
  return *cache;
}

// cuDNN's perf structs of the three directions share these fields.
template <typename Perf, typename T>
std::vector<ConvAlgoPerf> ToPerfs(const Perf* p, int n) {
  std::vector<ConvAlgoPerf> v;
  for (int i = 0; i < n; ++i) {
    ConvAlgoPerf a;
    a.algo = static_cast<int>(p[i].algo);
    a.ok = p[i].status == CUDNN_STATUS_SUCCESS;
    a.workspace_bytes = p[i].memory;
    a.deterministic = p[i].determinism == CUDNN_DETERMINISTIC;
    a.math_type = static_cast<int>(p[i].mathType);
    a.uses_tf32 = std::is_same_v<T, float> && p[i].mathType != CUDNN_FMA_MATH;
    v.push_back(a);
  }
  return v;
}

// A filter between [M, Cg, R] (keel's, R = kh * kw) and [M, R, Cg] (cuDNN's channels last):
// dst[m, r, c] = src[m, c, r], or the other way round with to_last false.
template <typename T>
__global__ void PermuteFilter(int64_t M, int64_t Cg, int64_t R, bool to_last, const T* src,
                              T* dst) {
  const int64_t n = M * Cg * R;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(blockDim.x) * gridDim.x) {
    const int64_t m = i / (Cg * R), c = (i / R) % Cg, r = i % R;  // i indexes [M, Cg, R]
    const int64_t last = (m * R + r) * Cg + c;
    if (to_last)
      dst[last] = src[i];
    else
      dst[i] = src[last];
  }
}

// One conv2d op's descriptors (set when the shapes change) and its algorithm choices.
template <typename T>
class CudnnConv {
 public:
  explicit CudnnConv(const OpDesc& op)
      : strides_(op.Attr<std::vector<int>>("strides")),
        paddings_(op.Attr<std::vector<int>>("paddings")),
        dilations_(op.Attr<std::vector<int>>("dilations")),
        groups_(op.Attr<int>("groups")),
        layout_(ParseImageLayout(op.Attr<std::string>("data_format"))) {}

  bool nhwc() const { return layout_ == ImageLayout::kNHWC; }

  // Describes Input x, Filter w and Output y; false when there is nothing to compute (an empty
  // batch or plane).
  bool Prepare(const DDim& x, const DDim& w, const DDim& y) {
    // cuDNN has no channels-last float64 convolutions (PyTorch runs them in NCHW).
    KEEL_ENFORCE(!(nhwc() && std::is_same_v<T, double>),
                 "conv2d on CUDA: float64 with data_format NHWC is not supported (cuDNN has no "
                 "channels-last float64 convolutions); use NCHW, or float32 (Input ",
                 x, ", Filter ", w, ")");
    if (x.numel() == 0 || y.numel() == 0) return false;
    if (x == x_ && w == w_) return true;
    for (const DDim* d : {&x, &w, &y})
      KEEL_ENFORCE(d->numel() < INT_MAX, "conv2d on CUDA: a tensor of ", d->numel(),
                   " elements is more than cuDNN's int32 indexing allows (Input ", x, ", Filter ",
                   w, ", Output ", y, ")");
    constexpr cudnnDataType_t t = CudnnType<T>();
    const cudnnTensorFormat_t format = nhwc() ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    const DDim xn = ToNchw(x, layout_), yn = ToNchw(y, layout_);
    xd_.Set4d(t, xn, format);
    yd_.Set4d(t, yn, format);
    wd_.Set(t, w, format);
    // The 16-bit types accumulate in float32.
    constexpr cudnnDataType_t compute = kIsHalf<T> ? CUDNN_DATA_FLOAT : t;
    KEEL_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv_.get(), paddings_[0], paddings_[1], strides_[0], strides_[1], dilations_[0],
        dilations_[1], CUDNN_CROSS_CORRELATION, compute));
    KEEL_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv_.get(), groups_));
    int n, c, h, wo;  // cuDNN's idea of the output must be the shape inference's
    KEEL_CUDNN_CHECK(
        cudnnGetConvolution2dForwardOutputDim(conv_.get(), xd_.get(), wd_.get(), &n, &c, &h, &wo));
    CHECK(n == yn[0] && c == yn[1] && h == yn[2] && wo == yn[3])
        << "cuDNN's conv output " << n << "x" << c << "x" << h << "x" << wo << " vs " << y.str();
    x_ = x;
    w_ = w;
    for (bool& h : have_) h = false;
    return true;
  }

  // The algorithm for `dir` (searched once per shape and flags, process-wide; remembered here while
  // the shape stays), with its math type set on the descriptor. The pointers are the operands a
  // timed search runs on (their contents are overwritten only where the op overwrites them anyway).
  ConvAlgoChoice Algo(const ExecutionContext& ctx, ConvDir dir, const T* x, const T* w, const T* y,
                      T* out) {
    const int i = static_cast<int>(dir);
    if (!have_[i]) {  // first run at this shape: the process-wide cache, else a
                      // search
      chosen_[i] = Lookup(ctx, dir, x, w, y, out);
      have_[i] = true;
    }
    KEEL_CUDNN_CHECK(cudnnSetConvolutionMathType(
        conv_.get(), static_cast<cudnnMathType_t>(chosen_[i].math_type)));
    return chosen_[i];
  }

  const TensorDesc& xd() const { return xd_; }
  const TensorDesc& yd() const { return yd_; }
  const FilterDesc& wd() const { return wd_; }
  const ConvDesc& conv() const { return conv_; }

 private:
  ConvAlgoChoice Lookup(const ExecutionContext& ctx, ConvDir dir, const T* x, const T* w,
                        const T* y, T* out) {
    CudaContext& cu = Cuda(ctx);
    KEEL_ENFORCE(FLAGS_conv_workspace_size_limit >= 0,
                 "FLAGS_conv_workspace_size_limit=", FLAGS_conv_workspace_size_limit,
                 " must be >= 0 (MB)");
    const size_t limit = static_cast<size_t>(FLAGS_conv_workspace_size_limit) << 20;
    AlgoKey key = {static_cast<int64_t>(dir),
                   cu.device(),
                   static_cast<int64_t>(CudnnType<T>()),
                   cu.allow_tf32(),
                   FLAGS_cudnn_deterministic,
                   FLAGS_cudnn_exhaustive_search,
                   static_cast<int64_t>(limit),
                   groups_,
                   static_cast<int64_t>(layout_)};
    for (const DDim* d : {&x_, &w_})
      for (int i = 0; i < 4; ++i) key.push_back((*d)[i]);
    for (const auto* v : {&strides_, &paddings_, &dilations_})
      key.insert(key.end(), v->begin(), v->end());
    return ConvAlgos().GetOrSearch(key, [&] { return Search(cu, dir, limit, x, w, y, out); });
  }

  ConvAlgoChoice Search(CudaContext& cu, ConvDir dir, size_t limit, const T* x, const T* w,
                        const T* y, T* out) {
    cudnnHandle_t h = cu.cudnn();
    // FMA math keeps float32 off TF32 tensor cores; the default lets cuDNN pick either. The
    // 16-bit types ask for Tensor Cores.
    KEEL_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_.get(), kIsHalf<T> ? CUDNN_TENSOR_OP_MATH
                                                              : cu.allow_tf32() ? CUDNN_DEFAULT_MATH
                                                                                : CUDNN_FMA_MATH));
    const bool timed = FLAGS_cudnn_exhaustive_search;
    void* ws = timed ? cu.Workspace(limit) : nullptr;
    std::vector<ConvAlgoPerf> perfs;
    int n = 0;
    if (dir == ConvDir::kForward) {
      cudnnConvolutionFwdAlgoPerf_t p[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      if (timed)
        KEEL_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
            h, xd_.get(), x, wd_.get(), w, conv_.get(), yd_.get(), out,
            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, p, ws, limit));
      else
        KEEL_CUDNN_CHECK(
            cudnnGetConvolutionForwardAlgorithm_v7(h, xd_.get(), wd_.get(), conv_.get(), yd_.get(),
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, p));
      perfs = ToPerfs<cudnnConvolutionFwdAlgoPerf_t, T>(p, n);
    } else if (dir == ConvDir::kBackwardData) {
      cudnnConvolutionBwdDataAlgoPerf_t p[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      if (timed)
        KEEL_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
            h, wd_.get(), w, yd_.get(), y, conv_.get(), xd_.get(), out,
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, p, ws, limit));
      else
        KEEL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            h, wd_.get(), yd_.get(), conv_.get(), xd_.get(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
            &n, p));
      perfs = ToPerfs<cudnnConvolutionBwdDataAlgoPerf_t, T>(p, n);
    } else {
      cudnnConvolutionBwdFilterAlgoPerf_t p[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      if (timed)
        KEEL_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
            h, xd_.get(), x, yd_.get(), y, conv_.get(), wd_.get(), out,
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, p, ws, limit));
      else
        KEEL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            h, xd_.get(), yd_.get(), conv_.get(), wd_.get(),
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, p));
      perfs = ToPerfs<cudnnConvolutionBwdFilterAlgoPerf_t, T>(p, n);
    }
    ConvAlgoChoice c =
        PickConvAlgo(perfs, limit, FLAGS_cudnn_deterministic, cu.allow_tf32(), DirName(dir),
                     StrCat("(Input ", x_, ", Filter ", w_, ", groups ", groups_, ", data_format ",
                            ImageLayoutName(layout_), ")"));
    // The heuristic's memory column is an estimate: ask for the exact size under the math type.
    KEEL_CUDNN_CHECK(
        cudnnSetConvolutionMathType(conv_.get(), static_cast<cudnnMathType_t>(c.math_type)));
    size_t bytes = 0;
    if (dir == ConvDir::kForward)
      KEEL_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(
          h, xd_.get(), wd_.get(), conv_.get(), yd_.get(),
          static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), &bytes));
    else if (dir == ConvDir::kBackwardData)
      KEEL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
          h, wd_.get(), yd_.get(), conv_.get(), xd_.get(),
          static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), &bytes));
    else
      KEEL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
          h, xd_.get(), yd_.get(), conv_.get(), wd_.get(),
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), &bytes));
    c.workspace_bytes = bytes;
    VLOG(1) << DirName(dir) << " Input " << x_.str() << " Filter " << w_.str() << ": algo "
            << c.algo << ", math " << c.math_type << ", workspace " << bytes << " bytes";
    return c;
  }

  std::vector<int> strides_, paddings_, dilations_;
  int groups_;
  ImageLayout layout_;
  DDim x_, w_;
  ConvAlgoChoice chosen_[3];  // per ConvDir at the current shape
  bool have_[3] = {false, false, false};
  TensorDesc xd_, yd_;
  FilterDesc wd_;
  ConvDesc conv_;
};

}  // namespace

template <typename T>
class ConvMath<CUDADevice, T> {
 public:
  explicit ConvMath(const OpDesc& op) : conv_(op) {}

  void Forward(const ExecutionContext& ctx, const Tensor& x, const Tensor& w, const Tensor& y,
               T* yd) {
    if (!conv_.Prepare(x.dims(), w.dims(), y.dims())) {
      KEEL_CUDA_CHECK(cudaMemsetAsync(yd, 0, y.nbytes(), Cuda(ctx).stream()));
      return;
    }
    const T* wd = Filter(ctx, w);
    const ConvAlgoChoice c = conv_.Algo(ctx, ConvDir::kForward, x.data<T>(), wd, nullptr, yd);
    const CudnnScalars<T> s;
    KEEL_CUDNN_CHECK(cudnnConvolutionForward(
        Cuda(ctx).cudnn(), &s.one, conv_.xd().get(), x.data<T>(), conv_.wd().get(), wd,
        conv_.conv().get(), static_cast<cudnnConvolutionFwdAlgo_t>(c.algo),
        Cuda(ctx).Workspace(c.workspace_bytes), c.workspace_bytes, &s.zero, conv_.yd().get(), yd));
  }

  void Backward(const ExecutionContext& ctx, const Tensor& x, const Tensor& w, const Tensor& dy,
                const Tensor* dx, const Tensor* dw, T* dxd, T* dwd) {
    cudaStream_t stream = Cuda(ctx).stream();
    if (!conv_.Prepare(x.dims(), w.dims(), dy.dims())) {  // nothing flows back
      if (dxd) KEEL_CUDA_CHECK(cudaMemsetAsync(dxd, 0, dx->nbytes(), stream));
      if (dwd) KEEL_CUDA_CHECK(cudaMemsetAsync(dwd, 0, dw->nbytes(), stream));
      return;
    }
    const CudnnScalars<T> s;
    cudnnHandle_t h = Cuda(ctx).cudnn();
    if (dxd) {
      const T* wd = Filter(ctx, w);
      const ConvAlgoChoice c =
          conv_.Algo(ctx, ConvDir::kBackwardData, nullptr, wd, dy.data<T>(), dxd);
      KEEL_CUDNN_CHECK(cudnnConvolutionBackwardData(
          h, &s.one, conv_.wd().get(), wd, conv_.yd().get(), dy.data<T>(), conv_.conv().get(),
          static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
          Cuda(ctx).Workspace(c.workspace_bytes), c.workspace_bytes, &s.zero, conv_.xd().get(),
          dxd));
    }
    if (dwd) {
      // Channels last, cuDNN writes the gradient as [M, kh, kw, C / groups] into scratch.
      T* dlast = conv_.nhwc() ? Sized(ctx, dw->dims(), &dw_last_) : dwd;
      const ConvAlgoChoice c =
          conv_.Algo(ctx, ConvDir::kBackwardFilter, x.data<T>(), nullptr, dy.data<T>(), dlast);
      KEEL_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
          h, &s.one, conv_.xd().get(), x.data<T>(), conv_.yd().get(), dy.data<T>(),
          conv_.conv().get(), static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo),
          Cuda(ctx).Workspace(c.workspace_bytes), c.workspace_bytes, &s.zero, conv_.wd().get(),
          dlast));
      if (conv_.nhwc()) Permute(ctx, dw->dims(), /*to_last=*/false, dlast, dwd);
    }
  }

 private:
  // The filter as cuDNN reads it: as it is for NCHW; channels last, copied to [M, kh, kw, C / g].
  const T* Filter(const ExecutionContext& ctx, const Tensor& w) {
    if (!conv_.nhwc()) return w.data<T>();
    T* last = Sized(ctx, w.dims(), &w_last_);
    Permute(ctx, w.dims(), /*to_last=*/true, w.data<T>(), last);
    return last;
  }
  static void Permute(const ExecutionContext& ctx, const DDim& w, bool to_last, const T* src,
                      T* dst) {
    const int64_t n = w.numel();
    if (n == 0) return;
    PermuteFilter<T>
        <<<GridFor(n), 256, 0, Cuda(ctx).stream()>>>(w[0], w[1], w[2] * w[3], to_last, src, dst);
    KEEL_CUDA_LAUNCH_CHECK();
  }
  static T* Sized(const ExecutionContext& ctx, const DDim& d, Tensor* t) {
    t->Resize(d);
    return t->mutable_data<T>(ctx.place());
  }

  CudnnConv<T> conv_;
  Tensor w_last_, dw_last_;  // channels last: the filter and its gradient as cuDNN has them
};

int64_t CudnnConvAlgoSearches() { return ConvAlgos().searches(); }

KEEL_REGISTER_KERNEL(CUDA, conv2d, Conv2DKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, conv2d_grad, Conv2DGradKernel, float, double, bfloat16, float16);

}  // namespace keel
