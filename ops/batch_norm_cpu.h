// batch_norm's CPU math (BatchNormMath<CPUDevice, T>), shared by batch_norm (batch_norm_ops.cc)
// and sync_batch_norm (sync_batch_norm_ops.cc), which plugs a cross-rank sum into it
// (BatchNormSync).
//
// Legend: N = batch, C = channels, S = the spatial size per channel (H * W, 1 for [N, C]),
// m = N * S (the values one batch_norm channel sees); M = the sum of m over the ranks.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>

#include "framework/op/execution_context.h"
#include "framework/runtime/cpu_threads.h"
#include "ops/batch_norm_ops.h"
#include "ops/functors/norm_functors.h"
#include "ops/op_util.h"

namespace keel {

// batch_norm's work in pieces of whole samples (contiguous memory), cut by the shape only, on the
// CPU thread budget. Per-channel sums are summed per piece, then over the pieces in order, so
// results are the same bits on any number of threads.
struct SamplePieces {
  int64_t per, count;
  SamplePieces(int64_t N, int64_t C, int64_t S)
      : per(std::max<int64_t>(1, cpu_threads::kElementwiseGrain / std::max<int64_t>(1, C * S))),
        count((N + per - 1) / per) {}
  // fn(n0, n1, piece) for each piece [n0, n1) of the samples.
  template <typename Fn>
  void Run(int64_t N, const Fn& fn) const {
    cpu_threads::ParallelFor(count, [&](int64_t p) { fn(p * per, std::min(N, (p + 1) * per), p); });
  }
};

// sums[c] = sum over pieces p (in order) of partial[p * C + c].
inline void SumPieces(const ScratchVector<double>& partial, int64_t pieces, int64_t C,
                      double* sums) {
  for (int64_t c = 0; c < C; ++c) {
    double acc = 0;
    for (int64_t p = 0; p < pieces; ++p) acc += partial[p * C + c];
    sums[c] = acc;
  }
}

// The 16-bit types run the float32 math on X (and dY) widened plane by plane and round Y (dX) once.
// Training: Y = Scale * (X - mean) / sqrt(var + epsilon) + Bias with the batch's per-channel mean
// and biased variance (divided by m, as Paddle does), and the moving stats become momentum * moving
// + (1 - momentum) * batch, using the same biased batch variance (Paddle's convention; PyTorch
// would use the unbiased one here). SavedMean = mean, SavedVariance = 1 / sqrt(var + epsilon).
// is_test or use_global_stats: the moving stats normalize, stay unchanged, and are copied to the
// Saved* outputs (as mean and inverse std) for the grad.
// With xhat = (x - mean) * inv_std, sums over the channel's m values:
//   dBias = sum(dy), dScale = sum(dy * xhat)
//   training: dx = scale * inv_std * (dy - dBias / m - xhat * dScale / m)
//   is_test or use_global_stats (fixed stats): dx = scale * inv_std * dy
template <typename T>
class BatchNormMath<CPUDevice, T> {
 public:
  BatchNormMath(float momentum, float epsilon, bool fixed_stats, ImageLayout layout)
      : momentum_(momentum), epsilon_(epsilon), is_test_(fixed_stats), layout_(layout) {}

  // Makes training sum over the ranks (BatchNormSync); an empty hook: this batch alone.
  void set_sync(BatchNormSync sync) { sync_ = std::move(sync); }

  // x: X's dims; channels last, the math runs on its [N * ..., C] view.
  void Forward(const ExecutionContext&, const DDim& x, const BatchNormIO<T>& io) {
    ForwardP(PerChannelView(x, layout_), io);
  }

  void Backward(const ExecutionContext&, const DDim& x, const BatchNormGradIO<T>& io) {
    BackwardP(PerChannelView(x, layout_), io);
  }

 private:
  using P = Acc<T>;

  // One (sample, channel) plane of S values, as the synced statistics read it: float32 and
  // float64 in place; the 16-bit types widened into `buf` (S floats of the calling piece's own),
  // without a float32 copy of the whole tensor.
  static ConstVec<P> In(const T* p, int64_t S, float* buf) {
    if constexpr (kIsHalf<T>) {
      WidenN(p, buf, S);
      return ConstVec<P>(buf, S);
    } else {
      return ConstVec<P>(p, S);
    }
  }
  // A block of `planes` consecutive (sample, channel) planes, S values each, as math reads and
  // writes them: float32 and float64 in place; the 16-bit types converted a block at a time (one
  // WidenN / NarrowN per block, not per plane: ResNet-20's 8 x 8 planes hold 64 values) through
  // `buf`, a piece's own planes * S floats, aligned as Eigen's packets are.
  static const P* InBlock(const T* p, int64_t n, float* buf) {
    if constexpr (kIsHalf<T>) {
      WidenN(p, buf, n);
      return buf;
    } else {
      return p;
    }
  }
  static P* OutBlock(T* p, float* buf) {
    if constexpr (kIsHalf<T>) {
      return buf;
    } else {
      return p;
    }
  }
  static void FinishOutBlock(T* p, int64_t n, const float* buf) {
    if constexpr (kIsHalf<T>) NarrowN(buf, p, n);
  }
  // Planes per block: a sample's C planes lie one after another; as many as fit 2 Ki floats (at
  // least one) for the 16-bit types, all of them for float32 and float64 (no conversion). The
  // blocks stay in L1 (the backward's three are 24 KiB); blocks of 16 Ki floats, measured on
  // ResNet-20 bf16, made batch_norm_grad half again slower than one plane at a time.
  static int64_t PlanesPerBlock(int64_t C, int64_t S) {
    if constexpr (!kIsHalf<T>) return std::max<int64_t>(C, 1);
    return std::clamp<int64_t>(2048 / std::max<int64_t>(S, 1), 1, std::max<int64_t>(C, 1));
  }
  // Plane k of a piece's buffers (null for float32 and float64, which have none).
  static float* Plane(ScratchVector<float>& buf, int64_t k, int64_t S) {
    return buf.empty() ? nullptr : buf.data() + k * S;
  }
  // A piece's plane buffers: `k` planes of S floats (none for float32 and float64), aligned as
  // Eigen's packets are, so that a plane's sum adds in the same order wherever the buffer lies.
  static ScratchVector<float> Buffers(int64_t k, int64_t S) {
    return ScratchVector<float>(kIsHalf<T> ? static_cast<size_t>(k * S) : 0);
  }

  // S == 1: X is rows of C values ([N, C], and channels last's [N * H * W, C] view, where a
  // plane per (row, channel) would cost a loop per value). fn(n, k) for blocks of k rows from row n
  // on in [n0, n1): rows of a piece one after another, a block's k * C values as InBlock converts
  // them (as many rows as fit 2 Ki floats for the 16-bit types). The per-channel sums then add
  // along the rows in the channels' order, vectorized over the channels, kRowChunk rows in P at a
  // time, then into double (AddRows).
  template <typename Fn>
  static void ForRowBlocks(int64_t n0, int64_t n1, int64_t C, const Fn& fn) {
    const int64_t R = kIsHalf<T> ? RowsPerBlock(C) : n1 - n0;
    for (int64_t n = n0; n < n1; n += R) fn(n, std::min(R, n1 - n));
  }
  // Per-channel sums over rows add kRowChunk rows in P (as a plane's sum adds its S values), then
  // into double: a double add per value made the rows path of bfloat16 ResNet-20's batch norms a
  // third slower than the planes'.
  static constexpr int64_t kRowChunk = 64;
  // acc[c] += sum over rows [0, k) of fn(row r, channel c), kRowChunk rows at a time in P; part is
  // the caller's C values of scratch.
  template <typename Fn>
  static void AddRows(int64_t k, int64_t C, P* part, double* acc, const Fn& fn) {
    for (int64_t r0 = 0; r0 < k; r0 += kRowChunk) {
      std::fill(part, part + C, P(0));
      for (int64_t r = r0; r < std::min(k, r0 + kRowChunk); ++r)
        for (int64_t c = 0; c < C; ++c) part[c] += fn(r, c);
      for (int64_t c = 0; c < C; ++c) acc[c] += part[c];
    }
  }
  // Rows per block of the 16-bit types (their buffers' rows); 0 for float32 and float64.
  static int64_t RowsPerBlock(int64_t C) {
    return kIsHalf<T> ? std::max<int64_t>(1, 2048 / std::max<int64_t>(C, 1)) : 0;
  }

  void ForwardP(const DDim& x, const BatchNormIO<T>& io) {
    const int64_t N = x[0], C = x[1], S = x.prod(2, x.size());
    const T* xd = io.x;
    const P* scale = io.scale;
    const P* bias = io.bias;
    const P* mean_in = io.mean_in;
    const P* var_in = io.var_in;
    P* mean_out = io.mean_out;
    P* var_out = io.var_out;
    P* saved_mean = io.saved_mean;
    P* saved_inv_std = io.saved_inv_std;
    T* yd = io.y;
    mean_.assign(C, 0.0);
    var_.assign(C, 0.0);
    if (is_test_) {
      for (int64_t c = 0; c < C; ++c) {
        mean_[c] = mean_in[c];
        var_[c] = var_in[c];
        mean_out[c] = mean_in[c];  // no-ops when MeanOut is Mean, as in programs
        var_out[c] = var_in[c];
      }
    } else if (sync_.all_reduce) {
      SyncedStats(N, C, S, xd, mean_in, var_in, mean_out, var_out);
    } else if (S == 1) {
      RowStats(N, C, xd, mean_in, var_in, mean_out, var_out);
    } else {
      const double m = static_cast<double>(N * S);
      // Two passes (mean, then squared deviations): exact enough in float for large m. Pieces of
      // channels; each channel sums over n in order, as on one thread.
      const SamplePieces pieces(N, C, S);
      partial_.assign(static_cast<size_t>(pieces.count * C), 0.0);
      const int64_t K = PlanesPerBlock(C, S);
      pieces.Run(N, [&](int64_t n0, int64_t n1, int64_t p) {
        double* acc = partial_.data() + p * C;
        ScratchVector<float> buf = Buffers(K, S);
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t c0 = 0; c0 < C; c0 += K) {
            const int64_t k = std::min(K, C - c0);
            const P* x = InBlock(xd + (n * C + c0) * S, k * S, buf.data());
            for (int64_t c = c0; c < c0 + k; ++c) acc[c] += ConstVec<P>(x + (c - c0) * S, S).sum();
          }
      });
      SumPieces(partial_, pieces.count, C, mean_.data());
      for (int64_t c = 0; c < C; ++c) mean_[c] = m > 0 ? mean_[c] / m : 0.0;
      partial_.assign(static_cast<size_t>(pieces.count * C), 0.0);
      pieces.Run(N, [&](int64_t n0, int64_t n1, int64_t p) {
        double* acc = partial_.data() + p * C;
        ScratchVector<float> buf = Buffers(K, S);
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t c0 = 0; c0 < C; c0 += K) {
            const int64_t k = std::min(K, C - c0);
            const P* x = InBlock(xd + (n * C + c0) * S, k * S, buf.data());
            for (int64_t c = c0; c < c0 + k; ++c)
              acc[c] +=
                  (ConstVec<P>(x + (c - c0) * S, S) - static_cast<P>(mean_[c])).square().sum();
          }
      });
      SumPieces(partial_, pieces.count, C, var_.data());
      const double mom = momentum_;
      for (int64_t c = 0; c < C; ++c) {
        var_[c] = m > 0 ? var_[c] / m : 0.0;
        mean_out[c] = fn::MovingStat(mom, mean_in[c], mean_[c]);
        var_out[c] = fn::MovingStat(mom, var_in[c], var_[c]);
      }
    }
    for (int64_t c = 0; c < C; ++c) {
      const double inv_std = fn::InvStd(var_[c], epsilon_);
      saved_mean[c] = static_cast<P>(mean_[c]);
      saved_inv_std[c] = static_cast<P>(inv_std);
      // y = x * a + b with a = scale * inv_std, b = bias - mean * a.
      mean_[c] = scale[c] * inv_std;
      var_[c] = bias[c] - saved_mean[c] * mean_[c];
    }
    if (S == 1) return RowAffine(N, C, xd, yd);
    const int64_t K = PlanesPerBlock(C, S);
    SamplePieces(N, C, S).Run(N, [&](int64_t n0, int64_t n1, int64_t) {
      ScratchVector<float> buf = Buffers(2 * K, S);
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t c0 = 0; c0 < C; c0 += K) {
          const int64_t k = std::min(K, C - c0), off = (n * C + c0) * S;
          const P* x = InBlock(xd + off, k * S, buf.data());
          P* y = OutBlock(yd + off, Plane(buf, K, S));
          for (int64_t c = c0; c < c0 + k; ++c)
            Vec<P>(y + (c - c0) * S, S) =
                ConstVec<P>(x + (c - c0) * S, S) * static_cast<P>(mean_[c]) +
                static_cast<P>(var_[c]);
          FinishOutBlock(yd + off, k * S, Plane(buf, K, S));
        }
    });
  }

  // Training, S == 1: mean_ and var_ (biased) in two passes, as the planes' path; the moving
  // stats.
  void RowStats(int64_t N, int64_t C, const T* xd, const P* mean_in, const P* var_in, P* mean_out,
                P* var_out) {
    const double m = static_cast<double>(N);
    const SamplePieces pieces(N, C, 1);
    for (int pass = 0; pass < 2; ++pass) {
      partial_.assign(static_cast<size_t>(pieces.count * C), 0.0);
      if (pass == 1) {  // the mean in P, as the planes' path subtracts it
        coef_a_.resize(C);
        for (int64_t c = 0; c < C; ++c) coef_a_[c] = static_cast<P>(mean_[c]);
      }
      pieces.Run(N, [&](int64_t n0, int64_t n1, int64_t p) {
        double* acc = partial_.data() + p * C;
        const P* mean = coef_a_.data();
        ScratchVector<float> buf = Buffers(RowsPerBlock(C), C);
        ScratchVector<P> part(static_cast<size_t>(C));
        ForRowBlocks(n0, n1, C, [&](int64_t n, int64_t k) {
          const P* x = InBlock(xd + n * C, k * C, buf.data());
          if (pass == 0) {
            AddRows(k, C, part.data(), acc, [&](int64_t r, int64_t c) { return x[r * C + c]; });
          } else {
            AddRows(k, C, part.data(), acc, [&](int64_t r, int64_t c) {
              const P d = x[r * C + c] - mean[c];
              return d * d;
            });
          }
        });
      });
      double* out = pass == 0 ? mean_.data() : var_.data();
      SumPieces(partial_, pieces.count, C, out);
      for (int64_t c = 0; c < C; ++c) out[c] = m > 0 ? out[c] / m : 0.0;
    }
    const double mom = momentum_;
    for (int64_t c = 0; c < C; ++c) {
      mean_out[c] = fn::MovingStat(mom, mean_in[c], mean_[c]);
      var_out[c] = fn::MovingStat(mom, var_in[c], var_[c]);
    }
  }

  // S == 1: y = x * a + b per channel (a, b in mean_ and var_ by then), a row at a time.
  void RowAffine(int64_t N, int64_t C, const T* xd, T* yd) {
    coef_a_.resize(C), coef_b_.resize(C);
    for (int64_t c = 0; c < C; ++c) {
      coef_a_[c] = static_cast<P>(mean_[c]);
      coef_b_[c] = static_cast<P>(var_[c]);
    }
    const P* a = coef_a_.data();
    const P* b = coef_b_.data();
    SamplePieces(N, C, 1).Run(N, [&](int64_t n0, int64_t n1, int64_t) {
      const int64_t R = RowsPerBlock(C);
      ScratchVector<float> buf = Buffers(2 * R, C);
      ForRowBlocks(n0, n1, C, [&](int64_t n, int64_t k) {
        const P* x = InBlock(xd + n * C, k * C, buf.data());
        P* y = OutBlock(yd + n * C, Plane(buf, R, C));
        for (int64_t r = 0; r < k; ++r)
          for (int64_t c = 0; c < C; ++c) y[r * C + c] = x[r * C + c] * a[c] + b[c];
        FinishOutBlock(yd + n * C, k * C, Plane(buf, R, C));
      });
    });
  }

  // Training under BatchNormSync: mean_ and var_ (biased) of every rank's values together, in
  // one pass and one all-reduce of [sum(x), sum(x^2), m]; the moving variance takes the unbiased
  // variance. An empty global batch (M = 0) has mean 0 and variance 0, as batch_norm's.
  void SyncedStats(int64_t N, int64_t C, int64_t S, const T* xd, const P* mean_in, const P* var_in,
                   P* mean_out, P* var_out) {
    const SamplePieces pieces(N, C, S);
    partial_.assign(static_cast<size_t>(2 * pieces.count * C), 0.0);
    pieces.Run(N, [&](int64_t n0, int64_t n1, int64_t p) {
      double* sx = partial_.data() + p * C;
      double* sxx = partial_.data() + (pieces.count + p) * C;
      if (S == 1) {
        ScratchVector<float> buf = Buffers(RowsPerBlock(C), C);
        ForRowBlocks(n0, n1, C, [&](int64_t n, int64_t k) {
          const P* x = InBlock(xd + n * C, k * C, buf.data());
          for (int64_t r = 0; r < k; ++r, x += C)
            for (int64_t c = 0; c < C; ++c) {
              const double v = x[c];
              sx[c] += v;
              sxx[c] += v * v;
            }
        });
        return;
      }
      ScratchVector<float> buf = Buffers(1, S);
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t c = 0; c < C; ++c) {
          ConstVec<P> v = In(xd + (n * C + c) * S, S, buf.data());
          sx[c] += v.template cast<double>().sum();
          sxx[c] += v.template cast<double>().square().sum();
        }
    });
    reduced_.assign(static_cast<size_t>(2 * C + 1), 0.0);
    SumPieces(partial_, pieces.count, C, reduced_.data());
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < pieces.count; ++p)
        reduced_[C + c] += partial_[(pieces.count + p) * C + c];
    reduced_[2 * C] = static_cast<double>(N * S);
    sync_.all_reduce(reduced_.data(), 2 * C + 1);
    const double M = reduced_[2 * C], mom = momentum_;
    for (int64_t c = 0; c < C; ++c) {
      const double mean = M > 0 ? reduced_[c] / M : 0.0;
      mean_[c] = mean;
      var_[c] = M > 0 ? std::max(0.0, reduced_[C + c] / M - mean * mean) : 0.0;
      mean_out[c] = fn::MovingStat(mom, mean_in[c], mean_[c]);
      var_out[c] = fn::MovingStat(mom, var_in[c], M > 1 ? var_[c] * M / (M - 1) : var_[c]);
    }
  }

  void BackwardP(const DDim& x, const BatchNormGradIO<T>& io) {
    const int64_t N = x[0], C = x[1], S = x.prod(2, x.size());
    const T* xd = io.x;
    const T* gd = io.dy;
    const P* scale = io.scale;
    const P* mean = io.saved_mean;
    const P* inv_std = io.saved_inv_std;
    sum_dy_.assign(C, 0.0);
    sum_dy_xc_.assign(C, 0.0);  // sum(dy * (x - mean))
    const SamplePieces pieces(N, C, S);
    partial_.assign(static_cast<size_t>(2 * pieces.count * C), 0.0);
    const int64_t K = PlanesPerBlock(C, S);
    pieces.Run(N, [&](int64_t n0, int64_t n1, int64_t p) {
      double* dy_acc = partial_.data() + p * C;
      double* dyxc_acc = partial_.data() + (pieces.count + p) * C;
      if (S == 1) {
        const int64_t R = RowsPerBlock(C);
        ScratchVector<float> buf = Buffers(2 * R, C);
        ScratchVector<P> part(static_cast<size_t>(C));
        ForRowBlocks(n0, n1, C, [&](int64_t n, int64_t k) {
          const P* g = InBlock(gd + n * C, k * C, buf.data());
          const P* x = InBlock(xd + n * C, k * C, Plane(buf, R, C));
          AddRows(k, C, part.data(), dy_acc, [&](int64_t r, int64_t c) { return g[r * C + c]; });
          AddRows(k, C, part.data(), dyxc_acc,
                  [&](int64_t r, int64_t c) { return g[r * C + c] * (x[r * C + c] - mean[c]); });
        });
        return;
      }
      ScratchVector<float> buf = Buffers(2 * K, S);
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t c0 = 0; c0 < C; c0 += K) {
          const int64_t k = std::min(K, C - c0), off = (n * C + c0) * S;
          const P* gb = InBlock(gd + off, k * S, buf.data());
          const P* xb = InBlock(xd + off, k * S, Plane(buf, K, S));
          for (int64_t c = c0; c < c0 + k; ++c) {
            ConstVec<P> g(gb + (c - c0) * S, S);
            dy_acc[c] += g.sum();
            dyxc_acc[c] += (g * (ConstVec<P>(xb + (c - c0) * S, S) - mean[c])).sum();
          }
        }
    });
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t p = 0; p < pieces.count; ++p) {
        sum_dy_[c] += partial_[p * C + c];
        sum_dy_xc_[c] += partial_[(pieces.count + p) * C + c];
      }
    }
    if (P* p = io.dbias)
      for (int64_t c = 0; c < C; ++c) p[c] = static_cast<P>(sum_dy_[c]);
    if (P* p = io.dscale)
      for (int64_t c = 0; c < C; ++c) p[c] = static_cast<P>(sum_dy_xc_[c] * inv_std[c]);
    T* dxd = io.dx;
    if (dxd == nullptr) return;
    // dx = A * dy + B * x + D per channel: the training formula expanded in x.
    double m = static_cast<double>(N * S);
    if (sync_.all_reduce && !is_test_) {  // the sums and m of every rank (dScale, dBias: local)
      reduced_.resize(static_cast<size_t>(2 * C + 1));
      std::copy(sum_dy_.begin(), sum_dy_.end(), reduced_.begin());
      std::copy(sum_dy_xc_.begin(), sum_dy_xc_.end(), reduced_.begin() + C);
      reduced_[2 * C] = m;
      sync_.all_reduce(reduced_.data(), 2 * C + 1);
      std::copy(reduced_.begin(), reduced_.begin() + C, sum_dy_.begin());
      std::copy(reduced_.begin() + C, reduced_.begin() + 2 * C, sum_dy_xc_.begin());
      m = reduced_[2 * C];
    }
    coef_a_.resize(C), coef_b_.resize(C), coef_d_.resize(C);
    for (int64_t c = 0; c < C; ++c) {
      const double is = inv_std[c], A = scale[c] * is;
      const double B = is_test_ ? 0.0 : -A * is * is * sum_dy_xc_[c] / m;
      coef_a_[c] = static_cast<P>(A);
      coef_b_[c] = static_cast<P>(B);
      coef_d_[c] = static_cast<P>(is_test_ ? 0.0 : -B * mean[c] - A * sum_dy_[c] / m);
    }
    pieces.Run(N, [&](int64_t n0, int64_t n1, int64_t) {
      if (S == 1) {
        const int64_t R = RowsPerBlock(C);
        ScratchVector<float> buf = Buffers(3 * R, C);
        const P *a = coef_a_.data(), *b = coef_b_.data(), *d = coef_d_.data();
        ForRowBlocks(n0, n1, C, [&](int64_t n, int64_t k) {
          const P* g = InBlock(gd + n * C, k * C, buf.data());
          const P* x = InBlock(xd + n * C, k * C, Plane(buf, R, C));
          P* dx = OutBlock(dxd + n * C, Plane(buf, 2 * R, C));
          for (int64_t i = 0; i < k * C; i += C)
            for (int64_t c = 0; c < C; ++c) dx[i + c] = g[i + c] * a[c] + x[i + c] * b[c] + d[c];
          FinishOutBlock(dxd + n * C, k * C, Plane(buf, 2 * R, C));
        });
        return;
      }
      ScratchVector<float> buf = Buffers(3 * K, S);
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t c0 = 0; c0 < C; c0 += K) {
          const int64_t k = std::min(K, C - c0), off = (n * C + c0) * S;
          const P* gb = InBlock(gd + off, k * S, buf.data());
          const P* xb = InBlock(xd + off, k * S, Plane(buf, K, S));
          P* db = OutBlock(dxd + off, Plane(buf, 2 * K, S));
          for (int64_t c = c0; c < c0 + k; ++c)
            Vec<P>(db + (c - c0) * S, S) = ConstVec<P>(gb + (c - c0) * S, S) * coef_a_[c] +
                                           ConstVec<P>(xb + (c - c0) * S, S) * coef_b_[c] +
                                           coef_d_[c];
          FinishOutBlock(dxd + off, k * S, Plane(buf, 2 * K, S));
        }
    });
  }

  float momentum_, epsilon_;
  bool is_test_;
  ImageLayout layout_;
  BatchNormSync sync_;
  ScratchVector<double> reduced_;  // what the sync hook sums: 2C + 1 values
  // Forward, per channel: the mean and variance, then the affine coefficients a and b.
  ScratchVector<double> mean_, var_;
  ScratchVector<double> partial_;  // per piece of samples, per channel
  // Backward.
  ScratchVector<double> sum_dy_, sum_dy_xc_;   // per channel
  ScratchVector<P> coef_a_, coef_b_, coef_d_;  // per channel
};

}  // namespace keel
