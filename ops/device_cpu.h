// The device vocabulary on the CPU (ops/device.h lists it): plain loops, so a front that states
// its element-wise math once computes on the CPU what the CPU kernels always have, bit for bit.
// Work is cut into pieces by the shape only (cpu_threads.h), never by the number of threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "framework/runtime/blas.h"
#include "framework/runtime/cpu_threads.h"
#include "ops/device.h"
#include "ops/functors/elementwise_functors.h"

namespace keel {

template <>
struct Device<CPUDevice> {
  // The loops below call a copy of the kernel's lambda made on their own stack. Called through
  // the caller's reference, the lambda's captured pointers were read again at every element (a
  // store through a float* might have changed the closure, as far as the compiler could tell), and
  // no loop was vectorized: sgd's update of the seed MLP's 1280 x 1280 weight ran one float at a
  // time. The copy's address does not escape, so the pointers stay in registers and GCC
  // vectorizes (checking at run time that output and inputs do not overlap). The bits do not
  // change: without -ffast-math each element is computed by the same operations. The copy must be
  // cheap (it is made per piece): the lambdas capture pointers and small functors.
  template <typename F>
  static void ForEach(const ExecutionContext&, int64_t n, const F& f) {
    static_assert(std::is_trivially_copyable_v<F>, "copied per piece: capture pointers");
    const F local = f;
    for (int64_t i = 0; i < n; ++i) local(i);
  }

  template <typename F>
  static void ForEachInPieces(const ExecutionContext&, int64_t n, int64_t grain, const F& f) {
    static_assert(std::is_trivially_copyable_v<F>, "copied per piece: capture pointers");
    cpu_threads::ParallelForRange(n, grain, [&](int64_t b, int64_t e) {
      const F local = f;
      for (int64_t i = b; i < e; ++i) local(i);
    });
  }

  // Runs of X's flat indices that pair with one Y entry (post > 1) or with consecutive ones
  // (post == 1), so no index is divided per element; in pieces of the flat index.
  template <typename F>
  static void ForEachBroadcast(const ExecutionContext&, const fn::BroadcastMid& m, const F& f) {
    static_assert(std::is_trivially_copyable_v<F>, "copied per piece: capture pointers");
    cpu_threads::ParallelForRange(
        m.pre * m.n * m.post, cpu_threads::kElementwiseGrain, [&](int64_t b, int64_t e) {
          const F local = f;
          for (int64_t idx = b; idx < e;) {
            if (m.post == 1) {
              const int64_t j = idx % m.n, len = std::min(e - idx, m.n - j);
              for (int64_t k = 0; k < len; ++k) local(idx + k, j + k);
              idx += len;
            } else {
              const int64_t k0 = idx % m.post, len = std::min(e - idx, m.post - k0);
              const int64_t j = (idx / m.post) % m.n;
              for (int64_t k = 0; k < len; ++k) local(idx + k, j);
              idx += len;
            }
          }
        });
  }

  // Pieces of Y's entries; each entry adds its terms over i in order, as on one thread: with
  // post == 1 term by term (the bias-add gradient's column sums), else a sum over each run of
  // post terms first (LaneSum). The sums are Acc<T> (float32 for the 16-bit types, f returning
  // Acc<T>), rounded to T once at the end.
  template <typename T, typename F>
  static void SumBroadcast(const ExecutionContext&, const fn::BroadcastMid& m, T* out, const F& f) {
    static_assert(std::is_trivially_copyable_v<F>, "copied per piece: capture pointers");
    using A = Acc<T>;
    const int64_t grain =
        std::max<int64_t>(1, cpu_threads::kElementwiseGrain / std::max<int64_t>(1, m.pre * m.post));
    cpu_threads::ParallelForRange(m.n, grain, [&](int64_t j0, int64_t j1) {
      const F g = f;         // a copy of the lambda, as ForEach's
      std::vector<A> local;  // the 16-bit types' float32 sums
      A* sums = nullptr;     // sums[j - j0]: Y entry j's
      if constexpr (std::is_same_v<A, T>) {
        sums = out + j0;
      } else {
        local.resize(static_cast<size_t>(j1 - j0));
        sums = local.data();
      }
      std::fill(sums, sums + (j1 - j0), A(0));
      if (m.post == 1) {
        for (int64_t i = 0; i < m.pre; ++i)
          for (int64_t j = j0; j < j1; ++j) sums[j - j0] += g(i * m.n + j, j);
      } else {
        for (int64_t i = 0; i < m.pre; ++i) {
          for (int64_t j = j0; j < j1; ++j) {
            const int64_t base = (i * m.n + j) * m.post;
            sums[j - j0] += LaneSum<A>(m.post, [&](int64_t k) { return g(base + k, j); });
          }
        }
      }
      if constexpr (!std::is_same_v<A, T>)
        for (int64_t j = j0; j < j1; ++j) out[j] = Narrow<T>(sums[j - j0]);
    });
  }

  // The sum of g(k) over k < n in 16 interleaved partial sums (lane l adds k = l, l + 16, ...),
  // the lanes then added pairwise and the tail in order: a fixed order (the same bits on any
  // number of threads) that vector registers add 16 terms at a time. One running sum, as before,
  // waited for each add in turn: a conv's bias gradient (LeNet's: 784 terms per channel and
  // sample) ran at one add per FP-add latency.
  template <typename A, typename G>
  static A LaneSum(int64_t n, const G& g) {
    constexpr int kLanes = 16;
    A lane[kLanes] = {};
    int64_t k = 0;
    for (; k + kLanes <= n; k += kLanes)
      for (int l = 0; l < kLanes; ++l) lane[l] += g(k + l);
    for (int w = kLanes / 2; w >= 1; w /= 2)
      for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
    A acc = lane[0];
    for (; k < n; ++k) acc += g(k);
    return acc;
  }

  template <typename T>
  static void Fill(const ExecutionContext&, T* p, int64_t n, T v) {
    std::fill_n(p, n, v);
  }
  template <typename T>
  static void Zero(const ExecutionContext&, T* p, int64_t n) {
    std::fill_n(p, n, T(0));
  }

  template <typename T>
  static void Copy(const ExecutionContext&, const T* src, T* dst, int64_t n) {
    if (src != dst && n > 0) std::memmove(dst, src, static_cast<size_t>(n) * sizeof(T));
  }

  template <typename T>
  static void CopyRows(const ExecutionContext&, const T* src, int64_t src_stride, T* dst,
                       int64_t dst_stride, int64_t rows, int64_t width) {
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(src + r * src_stride, width, dst + r * dst_stride);
  }

  template <typename T, typename F>
  static void FromHost(const ExecutionContext&, T* dst, int64_t n, std::vector<T>*, const F& fill) {
    fill(dst, n);
  }

  static const void* Upload(const ExecutionContext&, const void* host, size_t, Tensor*) {
    return host;
  }

  // One GEMM per batch entry, in order.
  template <typename T, typename TC>
  static void Gemm(const ExecutionContext&, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   Acc<T> alpha, const T* A, int64_t sa, const T* B, int64_t sb, Acc<T> beta, TC* C,
                   int64_t sc, int64_t batch = 1) {
    if constexpr (kIsHalf<T> || std::is_same_v<TC, float>) {
      if (batch > 1 && K > 0) {
        return blas::GemmBatched(ta, tb, M, N, K, alpha, A, sa, B, sb, beta, C, sc, batch);
      }
    }
    for (int64_t b = 0; b < batch; ++b)
      Gemm1(ta, tb, M, N, K, alpha, A + b * sa, B + b * sb, beta, C + b * sc);
  }

  // C += alpha op(A) op(B) over contiguous matrices, the product rounded to T before it is added
  // (a GEMM into a temporary and a sum after, bit for bit): float32 without the temporary
  // (blas::GemmAccumulate).
  template <typename T>
  static void GemmAdd(const ExecutionContext& ctx, bool ta, bool tb, int64_t M, int64_t N,
                      int64_t K, Acc<T> alpha, const T* A, const T* B, T* C) {
    if (M == 0 || N == 0 || K == 0) return;  // an empty product adds nothing
    if constexpr (std::is_same_v<T, float>) {
      blas::GemmAccumulate(ta, tb, M, N, K, alpha, A, ta ? M : K, B, tb ? K : N, C, N);
    } else {
      std::vector<T> product(static_cast<size_t>(M * N));
      Gemm(ctx, ta, tb, M, N, K, alpha, A, 0, B, 0, Acc<T>(0), product.data(), 0);
      for (int64_t i = 0; i < M * N; ++i) C[i] = Narrow<T>(Widen(C[i]) + Widen(product[i]));
    }
  }

  // A one-element float tensor's value, read at once.
  struct Scalar {
    double v;
    double Get() const { return v; }
  };
  static Scalar ScalarOf(const Tensor& t) { return Scalar{t.item<double>()}; }

  // CPU math throws bad input at once: nothing is reported late.
  struct Reports {
    template <typename F>
    void Check(F&&) {}
    DeviceReport* device(const ExecutionContext&) { return nullptr; }
  };

 private:
  // C = alpha * op(A) * op(B) + beta * C over contiguous row-major matrices; also right when
  // K == 0 (C = beta * C), which BLAS would reject for its zero leading dimension.
  template <typename T, typename TC>
  static void Gemm1(bool ta, bool tb, int64_t M, int64_t N, int64_t K, Acc<T> alpha, const T* A,
                    const T* B, Acc<T> beta, TC* C) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
      if (beta == Acc<T>(0)) {
        std::fill(C, C + M * N, TC(0));
      } else {
        for (int64_t i = 0; i < M * N; ++i) C[i] = TC(beta * static_cast<Acc<T>>(C[i]));
      }
      return;
    }
    blas::Gemm<T>(ta, tb, M, N, K, alpha, A, B, beta, C);
  }
};

}  // namespace keel
