// batch_norm on CUDA: the kernels are batch_norm_ops.h's; here is the math. cuDNN's spatial mode
// normalizes; the moving mean and variance are updated by keel's own per-channel kernel with the
// CPU op's formula (momentum, and the biased batch variance where cuDNN would use the unbiased
// one).
//
// Legend: N = batch, C = channels, S = spatial size per channel, m = N * S.
#include <climits>

#include "ops/batch_norm_ops.h"
#include "ops/cuda_util.cuh"
#include "ops/cudnn_util.h"
#include "ops/functors/norm_functors.h"

namespace keel {
namespace {

// The descriptors of X ([N, C, S, 1]) and of the per-channel parameters cuDNN derives from it.
template <typename T>
struct BatchNormDescs {
  void Set(const DDim& x) {
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
                                  const T* mean_in, const T* var_in, T* mean_out, T* var_out,
                                  T* saved_mean, T* saved_inv_std) {
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
__global__ void FixedStats(int64_t C, double epsilon, const T* mean_in, const T* var_in,
                           T* mean_out, T* var_out, T* saved_mean, T* saved_inv_std) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
       c += int64_t(blockDim.x) * gridDim.x) {
    const T m = mean_in[c], v = var_in[c];
    saved_mean[c] = m;
    saved_inv_std[c] = static_cast<T>(fn::InvStd(v, epsilon));
    mean_out[c] = m;
    var_out[c] = v;
  }
}

// Fixed stats: sum_dy[c] = sum(dy), sum_dy_xc[c] = sum(dy * (x - mean)) over the channel's m
// values; one block per channel. x and dy of T, the per-channel values of P.
template <typename T, typename P>
__global__ void ChannelGradSums(int64_t N, int64_t C, int64_t S, const T* x, const T* dy,
                                const P* mean, const P* scale, const P* inv_std, P* dscale,
                                P* dbias) {
  const int64_t c = blockIdx.x;
  const double mc = mean[c];
  double sum_dy = 0, sum_dy_xc = 0;
  for (int64_t t = threadIdx.x; t < N * S; t += blockDim.x) {
    const int64_t i = ((t / S) * C + c) * S + t % S;
    const double g = Widen(dy[i]);
    sum_dy += g;
    sum_dy_xc += g * (Widen(x[i]) - mc);
  }
  sum_dy = BlockSum(sum_dy);
  sum_dy_xc = BlockSum(sum_dy_xc);
  if (threadIdx.x == 0) {
    if (dbias) dbias[c] = static_cast<P>(sum_dy);
    if (dscale) dscale[c] = static_cast<P>(sum_dy_xc * inv_std[c]);
  }
}

}  // namespace

// Y = Scale * (X - mean) / sqrt(var + epsilon) + Bias: cuDNN's training forward (batch stats,
// saved as mean and inverse std) or inference forward (the moving stats). The grad, with
// xhat = (x - mean) * inv_std: dBias = sum(dy), dScale = sum(dy * xhat); training: dx = scale *
// inv_std * (dy - dBias / m - xhat * dScale / m) (cuDNN, from the saved batch stats); fixed stats:
// dx = scale * inv_std * dy. X, Y of T (float16 and bfloat16 too), the parameters and statistics of
// P = Acc<T> (cuDNN's float32 parameters for 16-bit data).
template <typename T>
class BatchNormMath<CUDADevice, T> {
 public:
  BatchNormMath(float momentum, float epsilon, bool fixed_stats)
      : momentum_(momentum), epsilon_(epsilon), fixed_stats_(fixed_stats) {}

  void Forward(const ExecutionContext& ctx, const DDim& x, const BatchNormIO<T>& io) {
    const int64_t C = x[1];
    cudaStream_t stream = Cuda(ctx).stream();
    const bool empty = x.numel() == 0;
    if (!empty) d_.Set(x);
    const CudnnScalars<T> s;
    if (fixed_stats_) {
      if (!empty)
        KEEL_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
            Cuda(ctx).cudnn(), CUDNN_BATCHNORM_SPATIAL, &s.one, &s.zero, d_.xd.get(), io.x,
            d_.xd.get(), io.y, d_.bn.get(), io.scale, io.bias, io.mean_in, io.var_in, epsilon_));
      FixedStats<P><<<GridFor(C), 256, 0, stream>>>(C, epsilon_, io.mean_in, io.var_in, io.mean_out,
                                                    io.var_out, io.saved_mean, io.saved_inv_std);
      KEEL_CUDA_LAUNCH_CHECK();
      return;
    }
    if (!empty)  // no running stats for cuDNN (it would use the unbiased variance): ours below
      KEEL_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
          Cuda(ctx).cudnn(), CUDNN_BATCHNORM_SPATIAL, &s.one, &s.zero, d_.xd.get(), io.x,
          d_.xd.get(), io.y, d_.bn.get(), io.scale, io.bias, 0.0, nullptr, nullptr, epsilon_,
          io.saved_mean, io.saved_inv_std));
    UpdateMovingStats<P><<<GridFor(C), 256, 0, stream>>>(C, empty, momentum_, epsilon_, io.mean_in,
                                                         io.var_in, io.mean_out, io.var_out,
                                                         io.saved_mean, io.saved_inv_std);
    KEEL_CUDA_LAUNCH_CHECK();
  }

  void Backward(const ExecutionContext& ctx, const DDim& x, const BatchNormGradIO<T>& io) {
    const int64_t N = x[0], C = x[1], S = x.prod(2, x.size());
    T* dxd = io.dx;
    P* dsd = io.dscale;
    P* dbd = io.dbias;
    const T* xd = io.x;
    const T* gd = io.dy;
    const P* scale = io.scale;
    const P* inv_std = io.saved_inv_std;
    cudaStream_t stream = Cuda(ctx).stream();
    if (fixed_stats_ || x.numel() == 0) {
      if ((dsd || dbd) && C > 0) {
        ChannelGradSums<T, P><<<unsigned(C), 256, 0, stream>>>(N, C, S, xd, gd, io.saved_mean,
                                                               scale, inv_std, dsd, dbd);
        KEEL_CUDA_LAUNCH_CHECK();
      }
      if (dxd)  // dx = scale * inv_std * dy (the training formula's extra terms vanish at m = 0)
        ForEach(ctx, x.numel(), [=] __device__(int64_t i) {
          const int64_t c = (i / S) % C;
          dxd[i] = ConvertTo<T>(static_cast<double>(scale[c]) * inv_std[c] * Widen(gd[i]));
        });
      return;
    }
    // cuDNN writes all three: outputs the program does not want go to scratch.
    if (!dxd) dxd = Scratch<T>(ctx, &scratch_dx_, x);
    if (!dsd) dsd = Scratch<P>(ctx, &scratch_dscale_, DDim{C});
    if (!dbd) dbd = Scratch<P>(ctx, &scratch_dbias_, DDim{C});
    d_.Set(x);
    const CudnnScalars<T> s;
    KEEL_CUDNN_CHECK(cudnnBatchNormalizationBackward(
        Cuda(ctx).cudnn(), CUDNN_BATCHNORM_SPATIAL, &s.one, &s.zero, &s.one, &s.zero, d_.xd.get(),
        xd, d_.xd.get(), gd, d_.xd.get(), dxd, d_.bn.get(), scale, dsd, dbd, epsilon_,
        io.saved_mean, inv_std));
  }

 private:
  using P = Acc<T>;
  template <typename V>
  V* Scratch(const ExecutionContext& ctx, Tensor* t, const DDim& d) {
    t->Resize(d);
    return t->mutable_data<V>(ctx.place());
  }
  double momentum_, epsilon_;
  bool fixed_stats_;
  BatchNormDescs<T> d_;
  Tensor scratch_dx_, scratch_dscale_, scratch_dbias_;
};

KEEL_REGISTER_KERNEL(CUDA, batch_norm, BatchNormKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, batch_norm_grad, BatchNormGradKernel, float, double, bfloat16, float16);

}  // namespace keel
