// pool2d on CUDA through cuDNN: the kernels are pool_ops.h's; here is the math, in either layout
// (cuDNN's NHWC descriptors read channels-last tensors as they lie). cuDNN pools whole
// windows inside the symmetrically padded input, which is the CPU kernel's result except for
// ceil_mode's extra partial window and paddings as large as the window: those are refused
// (cudnn_plan.h says why), never approximated. Max pooling uses cuDNN's deterministic mode.
#include <glog/logging.h>

#include <climits>
#include <string>

#include "ops/cuda_util.cuh"
#include "ops/cudnn_plan.h"
#include "ops/cudnn_util.h"
#include "ops/pool_ops.h"

namespace keel {

template <typename T>
class PoolMath<CUDADevice, T> {
 public:
  explicit PoolMath(const PoolAttrs& a) : a_(a) {}

  void Forward(const ExecutionContext& ctx, const Tensor& x, const Tensor& out, T* od) {
    if (x.numel() == 0 || out.numel() == 0) return;
    Prepare(ctx, x.dims(), out.dims());
    const CudnnScalars<T> s;
    KEEL_CUDNN_CHECK(cudnnPoolingForward(Cuda(ctx).cudnn(), pool_.get(), &s.one, xd_.get(),
                                         x.data<T>(), &s.zero, yd_.get(), od));
  }

  // max: dOut goes to the window's max (ties: one position, cuDNN's choice); avg: dOut / size to
  // every position of the window.
  void Backward(const ExecutionContext& ctx, const Tensor& x, const Tensor& out, const Tensor& dout,
                const Tensor& dx, T* dxd) {
    if (x.numel() == 0) return;
    if (out.numel() == 0) {
      KEEL_CUDA_CHECK(cudaMemsetAsync(dxd, 0, dx.nbytes(), Cuda(ctx).stream()));
      return;
    }
    Prepare(ctx, x.dims(), out.dims());
    const CudnnScalars<T> s;
    KEEL_CUDNN_CHECK(cudnnPoolingBackward(Cuda(ctx).cudnn(), pool_.get(), &s.one, yd_.get(),
                                          out.data<T>(), yd_.get(), dout.data<T>(), xd_.get(),
                                          x.data<T>(), &s.zero, xd_.get(), dxd));
  }

 private:
  // Describes X and Out; a keel::Error naming the attribute when cuDNN cannot pool like the CPU.
  void Prepare(const ExecutionContext& ctx, const DDim& given, const DDim& given_y) {
    if (given == x_) return;
    const DDim x = ToNchw(given, a_.layout), y = ToNchw(given_y, a_.layout);
    const cudnnTensorFormat_t format =
        a_.layout == ImageLayout::kNHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    const std::string why =
        CudnnPoolUnsupported(x, a_.ksize, a_.strides, a_.paddings, a_.global, a_.ceil_mode);
    KEEL_ENFORCE(why.empty(), "pool2d on ", ctx.place().str(), " (X ", given, "): ", why);
    KEEL_ENFORCE(x.numel() < INT_MAX, "pool2d on ", ctx.place().str(), ": X ", given,
                 " has more elements than cuDNN's int32 indexing allows");
    const PoolWindow w = Window(x, a_.ksize, a_.strides, a_.paddings, a_.global);
    const cudnnPoolingMode_t mode = a_.max         ? CUDNN_POOLING_MAX_DETERMINISTIC
                                    : a_.exclusive ? CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING
                                                   : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
    KEEL_CUDNN_CHECK(cudnnSetPooling2dDescriptor(pool_.get(), mode, CUDNN_PROPAGATE_NAN, int(w.kh),
                                                 int(w.kw), int(w.ph), int(w.pw), int(w.sh),
                                                 int(w.sw)));
    xd_.Set4d(CudnnType<T>(), x, format);
    yd_.Set4d(CudnnType<T>(), y, format);
    int n, c, h, wo;
    KEEL_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(pool_.get(), xd_.get(), &n, &c, &h, &wo));
    CHECK(n == y[0] && c == y[1] && h == y[2] && wo == y[3])
        << "cuDNN's pool output " << n << "x" << c << "x" << h << "x" << wo << " vs " << y.str();
    x_ = given;
  }

  PoolAttrs a_;
  DDim x_;
  TensorDesc xd_, yd_;
  PoolDesc pool_;
};

KEEL_REGISTER_KERNEL(CUDA, pool2d, Pool2DKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, pool2d_grad, Pool2DGradKernel, float, double, bfloat16, float16);

}  // namespace keel
