// CUDA twins of nn_ops.cc's pool2d and batch_norm through cuDNN (the element-wise CUDA kernels of
// nn_ops.cc's other ops live in their own .cu; this file holds what cuDNN computes).
//
// pool2d: cuDNN pools whole windows inside the symmetrically padded input, which is the CPU
// kernel's result except for ceil_mode's extra partial window and paddings as large as the window:
// those are refused (cudnn_plan.h says why), never approximated. Max pooling uses cuDNN's
// deterministic mode. batch_norm: cuDNN's spatial mode normalizes; the moving mean and variance are
// updated by keel's own per-channel kernel with the CPU op's formula (momentum, and the biased
// batch variance where cuDNN would use the unbiased one).
//
// Legend: N = batch, C = channels, S = spatial size per channel, m = N * S.
#include <glog/logging.h>

#include <climits>

#include "ops/cuda_util.cuh"
#include "ops/cudnn_plan.h"
#include "ops/cudnn_util.h"
#include "ops/functors/norm_functors.h"

namespace keel {
namespace {

// ------------------------------------------------------------------------------------- pool2d

template <typename T>
class CudnnPool {
 public:
  explicit CudnnPool(const OpDesc &op)
      : max_(op.Attr<std::string>("pooling_type") == "max"),
        ksize_(op.Attr<std::vector<int>>("ksize")),
        strides_(op.Attr<std::vector<int>>("strides")),
        paddings_(op.Attr<std::vector<int>>("paddings")),
        global_(op.Attr<bool>("global_pooling")),
        ceil_mode_(op.Attr<bool>("ceil_mode")),
        exclusive_(op.Attr<bool>("exclusive")) {}

  // Describes X and Out; a keel::Error naming the attribute when cuDNN cannot pool like the CPU.
  void Prepare(const ExecutionContext &ctx, const DDim &x, const DDim &y) {
    if (x == x_) return;
    const std::string why =
        CudnnPoolUnsupported(x, ksize_, strides_, paddings_, global_, ceil_mode_);
    KEEL_ENFORCE(why.empty(), "pool2d on ", ctx.place().str(), " (X ", x, "): ", why);
    KEEL_ENFORCE(x.numel() < INT_MAX, "pool2d on ", ctx.place().str(), ": X ", x,
                 " has more elements than cuDNN's int32 indexing allows");
    const int kh = global_ ? int(x[2]) : ksize_[0], kw = global_ ? int(x[3]) : ksize_[1];
    const int ph = global_ ? 0 : paddings_[0], pw = global_ ? 0 : paddings_[1];
    const int sh = global_ ? 1 : strides_[0], sw = global_ ? 1 : strides_[1];
    const cudnnPoolingMode_t mode = max_         ? CUDNN_POOLING_MAX_DETERMINISTIC
                                    : exclusive_ ? CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING
                                                 : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
    KEEL_CUDNN_CHECK(cudnnSetPooling2dDescriptor(pool_.get(), mode, CUDNN_PROPAGATE_NAN, kh, kw,
                                                 ph, pw, sh, sw));
    xd_.Set4d(CudnnType<T>(), x);
    yd_.Set4d(CudnnType<T>(), y);
    int n, c, h, w;
    KEEL_CUDNN_CHECK(cudnnGetPooling2dForwardOutputDim(pool_.get(), xd_.get(), &n, &c, &h, &w));
    CHECK(n == y[0] && c == y[1] && h == y[2] && w == y[3])
        << "cuDNN's pool output " << n << "x" << c << "x" << h << "x" << w << " vs " << y.str();
    x_ = x;
  }
  const TensorDesc &xd() const { return xd_; }
  const TensorDesc &yd() const { return yd_; }
  const PoolDesc &pool() const { return pool_; }

 private:
  bool max_;
  std::vector<int> ksize_, strides_, paddings_;
  bool global_, ceil_mode_, exclusive_;
  DDim x_;
  TensorDesc xd_, yd_;
  PoolDesc pool_;
};

template <typename T>
class Pool2DKernel : public OpKernel {
 public:
  explicit Pool2DKernel(const OpDesc &op) : pool_(op) {}
  void Compute(ExecutionContext &ctx) override {
    const Tensor &x = ctx.Input("X");
    Tensor *out = ctx.Output("Out");
    T *od = out->mutable_data<T>(ctx.place());
    if (x.numel() == 0 || out->numel() == 0) return;
    pool_.Prepare(ctx, x.dims(), out->dims());
    const CudnnScalars<T> s;
    KEEL_CUDNN_CHECK(cudnnPoolingForward(Cuda(ctx).cudnn(), pool_.pool().get(), &s.one,
                                         pool_.xd().get(), x.data<T>(), &s.zero, pool_.yd().get(),
                                         od));
  }

 private:
  CudnnPool<T> pool_;
};

// max: dOut goes to the window's max (ties: one position, cuDNN's choice); avg: dOut / size to
// every position of the window.
template <typename T>
class Pool2DGradKernel : public OpKernel {
 public:
  explicit Pool2DGradKernel(const OpDesc &op) : pool_(op) {}
  void Compute(ExecutionContext &ctx) override {
    Tensor *dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor &x = ctx.Input("X");
    const Tensor &out = ctx.Input("Out");
    const Tensor &dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(dout.dims() == out.dims(), "Out@GRAD ", dout.dims(), " and Out ", out.dims(),
                 " differ");
    T *dxd = dx->mutable_data<T>(ctx.place());
    if (x.numel() == 0) return;
    if (out.numel() == 0) {
      KEEL_CUDA_CHECK(cudaMemsetAsync(dxd, 0, dx->nbytes(), Cuda(ctx).stream()));
      return;
    }
    pool_.Prepare(ctx, x.dims(), out.dims());
    const CudnnScalars<T> s;
    KEEL_CUDNN_CHECK(cudnnPoolingBackward(Cuda(ctx).cudnn(), pool_.pool().get(), &s.one,
                                          pool_.yd().get(), out.data<T>(), pool_.yd().get(),
                                          dout.data<T>(), pool_.xd().get(), x.data<T>(), &s.zero,
                                          pool_.xd().get(), dxd));
  }

 private:
  CudnnPool<T> pool_;
};

// --------------------------------------------------------------------------------- batch_norm

// The descriptors of X ([N, C, S, 1]) and of the per-channel parameters cuDNN derives from it.
template <typename T>
struct BatchNormDescs {
  void Set(const DDim &x) {
    if (x == dims) return;
    KEEL_ENFORCE(x.numel() < INT_MAX, "batch_norm on CUDA: X ", x,
                 " has more elements than cuDNN's int32 indexing allows");
    xd.SetPerChannel(CudnnType<T>(), x);
    KEEL_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bn.get(), xd.get(), CUDNN_BATCHNORM_SPATIAL));
    dims = x;
  }
  DDim dims;
  TensorDesc xd, bn;
};

// Training: the moving stats from cuDNN's saved batch mean and inverse std, by the CPU formula. An
// empty batch (m = 0) has mean 0 and variance 0, as on the CPU.
template <typename T>
__global__ void UpdateMovingStats(int64_t C, bool empty, double momentum, double epsilon,
                                  const T *mean_in, const T *var_in, T *mean_out, T *var_out,
                                  T *saved_mean, T *saved_inv_std) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
       c += int64_t(blockDim.x) * gridDim.x) {
    if (empty) {
      saved_mean[c] = T(0);
      saved_inv_std[c] = static_cast<T>(fn::InvStd(0.0, epsilon));
    }
    const double mean = saved_mean[c];
    const double var = empty ? 0.0 : fn::VarianceFromInvStd(saved_inv_std[c], epsilon);
    mean_out[c] = fn::MovingStat(momentum, mean_in[c], mean);
    var_out[c] = fn::MovingStat(momentum, var_in[c], var);
  }
}

// is_test / use_global_stats: the moving stats normalize; Saved* get them as mean and inverse std,
// and the moving stats are copied to their outputs (no-ops when MeanOut is Mean).
template <typename T>
__global__ void FixedStats(int64_t C, double epsilon, const T *mean_in, const T *var_in,
                           T *mean_out, T *var_out, T *saved_mean, T *saved_inv_std) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
       c += int64_t(blockDim.x) * gridDim.x) {
    const T m = mean_in[c], v = var_in[c];
    saved_mean[c] = m;
    saved_inv_std[c] = static_cast<T>(fn::InvStd(v, epsilon));
    mean_out[c] = m;
    var_out[c] = v;
  }
}

// Y = Scale * (X - mean) / sqrt(var + epsilon) + Bias: cuDNN's training forward (batch stats, saved
// as mean and inverse std) or inference forward (the moving stats).
template <typename T>
class BatchNormKernel : public OpKernel {
 public:
  explicit BatchNormKernel(const OpDesc &op)
      : momentum_(op.Attr<float>("momentum")),
        epsilon_(op.Attr<float>("epsilon")),
        fixed_stats_(op.Attr<bool>("is_test") || op.Attr<bool>("use_global_stats")) {}

  void Compute(ExecutionContext &ctx) override {
    const Tensor &x = ctx.Input("X");
    const int64_t C = x.dims()[1];
    const T *mean_in = ctx.Input("Mean").data<T>();
    const T *var_in = ctx.Input("Variance").data<T>();
    T *mean_out = ctx.Output("MeanOut")->mutable_data<T>(ctx.place());
    T *var_out = ctx.Output("VarianceOut")->mutable_data<T>(ctx.place());
    T *saved_mean = ctx.Output("SavedMean")->mutable_data<T>(ctx.place());
    T *saved_inv_std = ctx.Output("SavedVariance")->mutable_data<T>(ctx.place());
    T *y = ctx.Output("Y")->mutable_data<T>(ctx.place());
    cudaStream_t stream = Cuda(ctx).stream();
    const bool empty = x.numel() == 0;
    if (!empty) d_.Set(x.dims());
    const CudnnScalars<T> s;
    if (fixed_stats_) {
      if (!empty)
        KEEL_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
            Cuda(ctx).cudnn(), CUDNN_BATCHNORM_SPATIAL, &s.one, &s.zero, d_.xd.get(), x.data<T>(),
            d_.xd.get(), y, d_.bn.get(), ctx.Input("Scale").data<T>(), ctx.Input("Bias").data<T>(),
            mean_in, var_in, epsilon_));
      FixedStats<T><<<GridFor(C), 256, 0, stream>>>(C, epsilon_, mean_in, var_in, mean_out, var_out,
                                                    saved_mean, saved_inv_std);
      KEEL_CUDA_LAUNCH_CHECK();
      return;
    }
    if (!empty)  // no running stats for cuDNN (it would use the unbiased
                 // variance): ours below
      KEEL_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
          Cuda(ctx).cudnn(), CUDNN_BATCHNORM_SPATIAL, &s.one, &s.zero, d_.xd.get(), x.data<T>(),
          d_.xd.get(), y, d_.bn.get(), ctx.Input("Scale").data<T>(), ctx.Input("Bias").data<T>(),
          0.0, nullptr, nullptr, epsilon_, saved_mean, saved_inv_std));
    UpdateMovingStats<T><<<GridFor(C), 256, 0, stream>>>(C, empty, momentum_, epsilon_, mean_in,
                                                         var_in, mean_out, var_out, saved_mean,
                                                         saved_inv_std);
    KEEL_CUDA_LAUNCH_CHECK();
  }

 private:
  double momentum_, epsilon_;
  bool fixed_stats_;
  BatchNormDescs<T> d_;
};

// Fixed stats: sum_dy[c] = sum(dy), sum_dy_xc[c] = sum(dy * (x - mean)) over the channel's m
// values; one block per channel.
template <typename T>
__global__ void ChannelGradSums(int64_t N, int64_t C, int64_t S, const T *x, const T *dy,
                                const T *mean, const T *scale, const T *inv_std, T *dscale,
                                T *dbias) {
  const int64_t c = blockIdx.x;
  const double mc = mean[c];
  double sum_dy = 0, sum_dy_xc = 0;
  for (int64_t t = threadIdx.x; t < N * S; t += blockDim.x) {
    const int64_t i = ((t / S) * C + c) * S + t % S;
    sum_dy += dy[i];
    sum_dy_xc += dy[i] * (x[i] - mc);
  }
  sum_dy = BlockSum(sum_dy);
  sum_dy_xc = BlockSum(sum_dy_xc);
  if (threadIdx.x == 0) {
    if (dbias) dbias[c] = static_cast<T>(sum_dy);
    if (dscale) dscale[c] = static_cast<T>(sum_dy_xc * inv_std[c]);
  }
}

// With xhat = (x - mean) * inv_std: dBias = sum(dy), dScale = sum(dy * xhat); training: dx = scale
// * inv_std * (dy - dBias / m - xhat * dScale / m) (cuDNN, from the saved batch stats); fixed
// stats: dx = scale * inv_std * dy.
template <typename T>
class BatchNormGradKernel : public OpKernel {
 public:
  explicit BatchNormGradKernel(const OpDesc &op)
      : epsilon_(op.Attr<float>("epsilon")),
        fixed_stats_(op.Attr<bool>("is_test") || op.Attr<bool>("use_global_stats")) {}

  void Compute(ExecutionContext &ctx) override {
    const Tensor &x = ctx.Input("X");
    const Tensor &dy = ctx.Input(GradVarName("Y"));
    KEEL_ENFORCE(dy.dims() == x.dims(), "Y@GRAD ", dy.dims(), " must have X's shape ", x.dims());
    const int64_t N = x.dims()[0], C = x.dims()[1], S = x.dims().prod(2, x.dims().size());
    Tensor *dx = ctx.OutputOrNull(GradVarName("X"));
    Tensor *dscale = ctx.OutputOrNull(GradVarName("Scale"));
    Tensor *dbias = ctx.OutputOrNull(GradVarName("Bias"));
    T *dxd = dx ? dx->mutable_data<T>(ctx.place()) : nullptr;
    T *dsd = dscale ? dscale->mutable_data<T>(ctx.place()) : nullptr;
    T *dbd = dbias ? dbias->mutable_data<T>(ctx.place()) : nullptr;
    const T *xd = x.data<T>();
    const T *gd = dy.data<T>();
    const T *scale = ctx.Input("Scale").data<T>();
    const T *mean = ctx.Input("SavedMean").data<T>();
    const T *inv_std = ctx.Input("SavedVariance").data<T>();
    cudaStream_t stream = Cuda(ctx).stream();
    if (fixed_stats_ || x.numel() == 0) {
      if ((dsd || dbd) && C > 0) {
        ChannelGradSums<T>
            <<<unsigned(C), 256, 0, stream>>>(N, C, S, xd, gd, mean, scale, inv_std, dsd, dbd);
        KEEL_CUDA_LAUNCH_CHECK();
      }
      if (dxd)  // dx = scale * inv_std * dy (the training formula's extra terms
                // vanish at m = 0)
        ForEach(ctx, x.numel(), [=] __device__(int64_t i) {
          const int64_t c = (i / S) % C;
          dxd[i] = static_cast<T>(static_cast<double>(scale[c]) * inv_std[c] * gd[i]);
        });
      return;
    }
    // cuDNN writes all three: outputs the program does not want go to scratch.
    if (!dxd) dxd = Scratch(ctx, &scratch_dx_, x.dims());
    if (!dsd) dsd = Scratch(ctx, &scratch_dscale_, DDim{C});
    if (!dbd) dbd = Scratch(ctx, &scratch_dbias_, DDim{C});
    d_.Set(x.dims());
    const CudnnScalars<T> s;
    KEEL_CUDNN_CHECK(cudnnBatchNormalizationBackward(
        Cuda(ctx).cudnn(), CUDNN_BATCHNORM_SPATIAL, &s.one, &s.zero, &s.one, &s.zero, d_.xd.get(),
        xd, d_.xd.get(), gd, d_.xd.get(), dxd, d_.bn.get(), scale, dsd, dbd, epsilon_, mean,
        inv_std));
  }

 private:
  T *Scratch(const ExecutionContext &ctx, Tensor *t, const DDim &d) {
    t->Resize(d);
    return t->mutable_data<T>(ctx.place());
  }
  double epsilon_;
  bool fixed_stats_;
  BatchNormDescs<T> d_;
  Tensor scratch_dx_, scratch_dscale_, scratch_dbias_;
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(pool2d, Pool2DKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(pool2d_grad, Pool2DGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(batch_norm, BatchNormKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(batch_norm_grad, BatchNormGradKernel, float, double);

}  // namespace keel
