// batch_norm on CUDA: the kernels are batch_norm_ops.h's; here is the math. cuDNN's spatial mode
// normalizes (its persistent variant for channels-last training in float32 and float16); the
// moving mean and variance are updated by keel's own per-channel kernel with the CPU op's formula
// (momentum, and the biased batch variance where cuDNN would use the unbiased one).
// sync_batch_norm's training (sync_batch_norm_ops.h) is keel's own kernels instead, the
// per-channel sums all-reduced over the ring between them, with the CPU math's formulas
// (sync_batch_norm_ops.cc); its kernels are registered here, where the math is.
//
// Legend: N = batch, C = channels, S = spatial size per channel, m = N * S; M = the sum of m
// over the ranks.
//
// Channels last (data_layout NHWC): cuDNN gets X as an NHWC tensor [N, C, S, 1] (the real batch:
// PyTorch keeps batches past some 880 K rows in training, 64 K in inference, from cuDNN's batch
// norms, which fail on them; N * S would make a million for ResNet-20 at batch 1024) and trains in
// CUDNN_BATCHNORM_SPATIAL_PERSISTENT, the mode its fast channels-last kernels are selected in (as
// PyTorch does for channels-last training in float32 and float16; float64 and bfloat16, which
// PyTorch does not send to cuDNN, keep SPATIAL until a GPU run has checked them); keel's own
// kernels index X as its [N * S, C] view (PerChannelView).
#include <climits>
#include <type_traits>

#include "ops/batch_norm_ops.h"
#include "ops/cuda_util.cuh"
#include "ops/cudnn_util.h"
#include "ops/functors/norm_functors.h"
#include "ops/sync_batch_norm_ops.h"

namespace keel {
namespace {

// The descriptors of X ([N, C, S, 1], NCHW or NHWC) and of the per-channel parameters cuDNN
// derives from it.
template <typename T>
struct BatchNormDescs {
  void Set(const DDim& x, ImageLayout layout, cudnnBatchNormMode_t mode) {
    if (x == dims) return;
    KEEL_ENFORCE(x.numel() < INT_MAX, "batch_norm on CUDA: X ", x,
                 " has more elements than cuDNN's int32 indexing allows");
    if (layout == ImageLayout::kNHWC && x.size() > 2) {
      xd.Set(CudnnType<T>(), x[0], x[x.size() - 1], x.prod(1, x.size() - 1), 1, CUDNN_TENSOR_NHWC);
    } else {
      xd.SetPerChannel(CudnnType<T>(), x);
    }
    KEEL_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bn.get(), xd.get(), mode));
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

// sum_dy[c] = sum(dy), sum_dy_xc[c] = sum(dy * (x - mean)) over the channel's m values, as
// dBias and dScale = sum_dy_xc * inv_std (each if wanted) and, for sync_batch_norm, into `sums`
// [sum_dy (C), sum_dy_xc (C), m]; one block per channel. x and dy of T, the per-channel values of
// P.
template <typename T, typename P>
__global__ void ChannelGradSums(int64_t N, int64_t C, int64_t S, const T* x, const T* dy,
                                const P* mean, const P* inv_std, P* dscale, P* dbias,
                                double* sums) {
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
    if (sums) {
      sums[c] = sum_dy;
      sums[C + c] = sum_dy_xc;
      if (c == 0) sums[2 * C] = static_cast<double>(N * S);
    }
  }
}

// sync_batch_norm's forward sums: sums = [sum(x) (C), sum(x^2) (C), m]; one block per channel.
template <typename T>
__global__ void ChannelSums(int64_t N, int64_t C, int64_t S, const T* x, double* sums) {
  const int64_t c = blockIdx.x;
  double sx = 0, sxx = 0;
  for (int64_t t = threadIdx.x; t < N * S; t += blockDim.x) {
    const double v = Widen(x[((t / S) * C + c) * S + t % S]);
    sx += v;
    sxx += v * v;
  }
  sx = BlockSum(sx);
  sxx = BlockSum(sxx);
  if (threadIdx.x == 0) {
    sums[c] = sx;
    sums[C + c] = sxx;
    if (c == 0) sums[2 * C] = static_cast<double>(N * S);
  }
}

// sync_batch_norm's statistics from the ranks' sums: mean = sum(x) / M, the biased var =
// sum(x^2) / M - mean^2 (0 and 0 for M = 0) as Saved*; the moving variance takes the unbiased
// var * M / (M - 1).
template <typename P>
__global__ void SyncedStats(int64_t C, double momentum, double epsilon, const double* sums,
                            const P* mean_in, const P* var_in, P* mean_out, P* var_out,
                            P* saved_mean, P* saved_inv_std) {
  const double M = sums[2 * C];
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
       c += int64_t(blockDim.x) * gridDim.x) {
    const double mean = M > 0 ? sums[c] / M : 0.0;
    const double var = M > 0 ? fmax(0.0, sums[C + c] / M - mean * mean) : 0.0;
    saved_mean[c] = static_cast<P>(mean);
    saved_inv_std[c] = static_cast<P>(fn::InvStd(var, epsilon));
    mean_out[c] = fn::MovingStat(momentum, mean_in[c], mean);
    var_out[c] = fn::MovingStat(momentum, var_in[c], M > 1 ? var * M / (M - 1) : var);
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
  BatchNormMath(float momentum, float epsilon, bool fixed_stats, ImageLayout layout)
      : momentum_(momentum), epsilon_(epsilon), fixed_stats_(fixed_stats), layout_(layout) {}
  ~BatchNormMath() {
    if (after_compute_) cudaEventDestroy(after_compute_);
  }

  // sync_batch_norm: training sums over `ring` (nullptr, or one rank: this rank's values alone).
  void set_sync(Communicator* ring) {
    synced_ = true;
    ring_ = ring;
  }

  // given: X's dims (in the op's layout).
  void Forward(const ExecutionContext& ctx, const DDim& given, const BatchNormIO<T>& io) {
    const DDim x = PerChannelView(given, layout_);
    if (synced_ && !fixed_stats_) return SyncedForward(ctx, x, io);
    const int64_t C = x[1];
    cudaStream_t stream = Cuda(ctx).stream();
    const bool empty = x.numel() == 0;
    if (!empty) d_.Set(given, layout_, TrainingMode(given));
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
          Cuda(ctx).cudnn(), TrainingMode(given), &s.one, &s.zero, d_.xd.get(), io.x, d_.xd.get(),
          io.y, d_.bn.get(), io.scale, io.bias, 0.0, nullptr, nullptr, epsilon_, io.saved_mean,
          io.saved_inv_std));
    UpdateMovingStats<P><<<GridFor(C), 256, 0, stream>>>(C, empty, momentum_, epsilon_, io.mean_in,
                                                         io.var_in, io.mean_out, io.var_out,
                                                         io.saved_mean, io.saved_inv_std);
    KEEL_CUDA_LAUNCH_CHECK();
  }

  void Backward(const ExecutionContext& ctx, const DDim& given, const BatchNormGradIO<T>& io) {
    const DDim x = PerChannelView(given, layout_);
    if (synced_ && !fixed_stats_) return SyncedBackward(ctx, x, io);
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
                                                               inv_std, dsd, dbd, nullptr);
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
    d_.Set(given, layout_, TrainingMode(given));
    const CudnnScalars<T> s;
    KEEL_CUDNN_CHECK(cudnnBatchNormalizationBackward(
        Cuda(ctx).cudnn(), TrainingMode(given), &s.one, &s.zero, &s.one, &s.zero, d_.xd.get(), xd,
        d_.xd.get(), gd, d_.xd.get(), dxd, d_.bn.get(), scale, dsd, dbd, epsilon_, io.saved_mean,
        inv_std));
  }

 private:
  using P = Acc<T>;

 public:  // (nvcc: a function holding a __device__ lambda must be public)
  // sync_batch_norm's stream: the ring's, after the compute stream's work so far (the outputs and
  // the sums were allocated in that stream's order, as c_allreduce's copies are), so that the
  // executor's events for the ring's ops order the op against the rest; the compute stream without
  // a ring.
  cudaStream_t SyncStream(const ExecutionContext& ctx) {
    cudaStream_t compute = Cuda(ctx).stream();
    if (ring_ == nullptr) return compute;
    auto s = static_cast<cudaStream_t>(SyncBatchNormStream(ring_));
    KEEL_ENFORCE(s != nullptr, "sync_batch_norm on ", ctx.place().str(),
                 ": its ring serves CPU tensors");
    if (!after_compute_)
      KEEL_CUDA_CHECK(cudaEventCreateWithFlags(&after_compute_, cudaEventDisableTiming));
    KEEL_CUDA_CHECK(cudaEventRecord(after_compute_, compute));
    KEEL_CUDA_CHECK(cudaStreamWaitEvent(s, after_compute_, 0));
    return s;
  }
  // The 2C + 1 sums (double, on the device, kept from run to run), summed over the ring in place.
  double* Sums(const ExecutionContext& ctx, int64_t C) {
    return Scratch<double>(ctx, &sums_, DDim{2 * C + 1});
  }
  void SumOverRanks(const ExecutionContext& ctx) { SumOnDevice(ctx, ring_, &sums_); }

  // Training over every rank's values: the local sums, one all-reduce, the statistics, then
  // y = (x - mean) * inv_std * scale + bias.
  void SyncedForward(const ExecutionContext& ctx, const DDim& x, const BatchNormIO<T>& io) {
    const int64_t N = x[0], C = x[1], S = x.prod(2, x.size());
    if (C == 0) return;
    double* sums =
        Sums(ctx, C);  // before SyncStream: its block's earlier users are then waited for
    cudaStream_t stream = SyncStream(ctx);
    ChannelSums<T><<<unsigned(C), 256, 0, stream>>>(N, C, S, io.x, sums);
    KEEL_CUDA_LAUNCH_CHECK();
    SumOverRanks(ctx);
    SyncedStats<P><<<GridFor(C), 256, 0, stream>>>(C, momentum_, epsilon_, sums, io.mean_in,
                                                   io.var_in, io.mean_out, io.var_out,
                                                   io.saved_mean, io.saved_inv_std);
    KEEL_CUDA_LAUNCH_CHECK();
    const int64_t n = x.numel();
    if (n == 0) return;
    const T* xd = io.x;
    T* yd = io.y;
    const P *scale = io.scale, *bias = io.bias, *mean = io.saved_mean, *inv_std = io.saved_inv_std;
    ForEachKernel<<<GridFor(n), 256, 0, stream>>>(n, [=] __device__(int64_t i) {
      const int64_t c = (i / S) % C;
      yd[i] = ConvertTo<T>((Widen(xd[i]) - static_cast<double>(mean[c])) * inv_std[c] * scale[c] +
                           bias[c]);
    });
    KEEL_CUDA_LAUNCH_CHECK();
  }

  // dScale and dBias from this rank's sums (the data-parallel all-reduce adds them up); one
  // all-reduce of [sum(dy), sum(dy * (x - mean)), m]; dx = A dy + B x + D per channel with the
  // global sums and M: A = scale * inv_std, B = -A inv_std^2 sum_dy_xc / M,
  // D = -B mean - A sum_dy / M.
  void SyncedBackward(const ExecutionContext& ctx, const DDim& x, const BatchNormGradIO<T>& io) {
    const int64_t N = x[0], C = x[1], S = x.prod(2, x.size());
    if (C == 0) return;
    double* sums = Sums(ctx, C);  // before SyncStream, as in SyncedForward
    cudaStream_t stream = SyncStream(ctx);
    ChannelGradSums<T, P><<<unsigned(C), 256, 0, stream>>>(
        N, C, S, io.x, io.dy, io.saved_mean, io.saved_inv_std, io.dscale, io.dbias, sums);
    KEEL_CUDA_LAUNCH_CHECK();
    SumOverRanks(ctx);
    const int64_t n = x.numel();
    if (io.dx == nullptr || n == 0) return;
    const T *xd = io.x, *gd = io.dy;
    T* dxd = io.dx;
    const P *scale = io.scale, *mean = io.saved_mean, *inv_std = io.saved_inv_std;
    const double* g = sums;
    ForEachKernel<<<GridFor(n), 256, 0, stream>>>(n, [=] __device__(int64_t i) {
      const int64_t c = (i / S) % C;
      const double M = g[2 * C], is = inv_std[c], A = scale[c] * is;
      const double B = -A * is * is * g[C + c] / M;
      const double D = -B * mean[c] - A * g[c] / M;
      dxd[i] = ConvertTo<T>(A * Widen(gd[i]) + B * Widen(xd[i]) + D);
    });
    KEEL_CUDA_LAUNCH_CHECK();
  }

 private:
  // Training's mode for X of `given` dims, the same forward and backward: cuDNN's persistent
  // kernels where X has an NHWC descriptor (channels last, rank 3 or more) in float32 or float16.
  cudnnBatchNormMode_t TrainingMode(const DDim& given) const {
    constexpr bool kPersistentType = std::is_same_v<T, float> || std::is_same_v<T, float16>;
    return kPersistentType && layout_ == ImageLayout::kNHWC && given.size() > 2
               ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT
               : CUDNN_BATCHNORM_SPATIAL;
  }
  template <typename V>
  V* Scratch(const ExecutionContext& ctx, Tensor* t, const DDim& d) {
    t->Resize(d);
    return t->mutable_data<V>(ctx.place());
  }
  double momentum_, epsilon_;
  bool fixed_stats_;
  ImageLayout layout_;
  BatchNormDescs<T> d_;
  Tensor scratch_dx_, scratch_dscale_, scratch_dbias_;
  // sync_batch_norm.
  bool synced_ = false;
  Communicator* ring_ = nullptr;
  Tensor sums_;
  cudaEvent_t after_compute_ = nullptr;
};

KEEL_REGISTER_KERNEL(CUDA, batch_norm, BatchNormKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, batch_norm_grad, BatchNormGradKernel, float, double, bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, sync_batch_norm, Synced<BatchNormKernel>::Kernel, float, double,
                     bfloat16, float16);
KEEL_REGISTER_KERNEL(CUDA, sync_batch_norm_grad, Synced<BatchNormGradKernel>::Kernel, float, double,
                     bfloat16, float16);

}  // namespace keel
