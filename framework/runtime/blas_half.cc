// The 16-bit GEMMs of blas.h: oneDNN's matmul primitive over bfloat16 or float16 operands with
// float32 accumulation, one primitive per (shape, strides, types, alpha, beta), created on first
// use and kept for the process; or, where oneDNN has only its reference loops for the types on
// this CPU, the float32 GEMM over widened operands.
#include <glog/logging.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "framework/error.h"
#include "framework/runtime/blas.h"
#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/half_convert.h"

namespace keel {
namespace blas {
namespace {

using dnnl::memory;
using DT = memory::data_type;

const dnnl::engine& Engine() {
  static const dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

// oneDNN streams are not to be shared between threads.
dnnl::stream& ThreadStream() {
  thread_local dnnl::stream s(Engine());
  return s;
}

template <typename T>
constexpr DT DataType() {
  if constexpr (std::is_same_v<T, bfloat16>) return DT::bf16;
  if constexpr (std::is_same_v<T, float16>) return DT::f16;
  return DT::f32;
}

// One GEMM's shape as oneDNN sees it: C [M, N] = alpha * op(A) [M, K] * op(B) [K, N] + beta * C,
// every operand a strided view (a transposed operand is the same memory with swapped strides).
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                       float, float>;

struct Plan {
  bool native = false;  // oneDNN has an implementation of its own (not its reference loops)
  memory::desc a, b, c;
  dnnl::matmul prim;
  size_t scratch_bytes = 0;
};

std::unique_ptr<Plan> MakePlan(const Key& k) {
  const auto [ta, tb, M, N, K, lda, ldb, ldc, ab_type, c_type, alpha, beta] = k;
  auto plan = std::make_unique<Plan>();
  const DT ab = static_cast<DT>(ab_type), ct = static_cast<DT>(c_type);
  plan->a = memory::desc({M, K}, ab, ta ? memory::dims{1, lda} : memory::dims{lda, 1});
  plan->b = memory::desc({K, N}, ab, tb ? memory::dims{1, ldb} : memory::dims{ldb, 1});
  plan->c = memory::desc({M, N}, ct, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(plan->a, plan->b, plan->c), attr, Engine());
    VLOG(1) << "16-bit GEMM " << M << "x" << N << "x" << K << (ta ? " A'" : "") << (tb ? " B'" : "")
            << ": oneDNN " << pd.impl_info_str();
    if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return plan;  // reference loops
    plan->prim = dnnl::matmul(pd);
    plan->scratch_bytes = pd.scratchpad_desc().get_size();
    plan->native = true;
  } catch (const dnnl::error&) {
    // No implementation for these types here: the widened path runs it.
  }
  return plan;
}

// The plan of a key, created once; plans are never removed, so references stay valid.
const Plan& GetPlan(const Key& k) {
  static std::mutex mu;
  static auto* plans = new std::map<Key, std::unique_ptr<Plan>>;
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Plan>& p = (*plans)[k];
  if (p == nullptr) p = MakePlan(k);
  return *p;
}

// The primitive's working memory: per thread, grown to the largest use (a primitive runs start to
// end on its thread).
void* Scratch(size_t bytes) {
  struct Buffer {
    std::unique_ptr<void, decltype(&std::free)> scratch{nullptr, &std::free};
    size_t scratch_size = 0;
  };
  thread_local Buffer t;
  const size_t need = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  if (t.scratch_size < need) {
    t.scratch.reset(std::aligned_alloc(64, need));
    if (t.scratch == nullptr) throw std::bad_alloc();
    t.scratch_size = need;
  }
  return t.scratch.get();
}

template <typename T, typename TC>
Key MakeKey(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
            int64_t ldc, float alpha, float beta) {
  return Key{ta,
             tb,
             M,
             N,
             K,
             lda,
             ldb,
             ldc,
             static_cast<int>(DataType<T>()),
             static_cast<int>(DataType<TC>()),
             alpha,
             beta};
}

// One primitive call on the calling thread (one OpenMP thread).
template <typename T, typename TC>
void RunNative(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  const Plan& p = GetPlan(MakeKey<T, TC>(ta, tb, M, N, K, lda, ldb, ldc, alpha, beta));
  KEEL_ENFORCE(p.native, "oneDNN refused a piece of a ", M, "x", N, "x", K,
               " GEMM it accepted whole");
  cpu_threads::UseOneOpenMPThread();
  const memory a(p.a, Engine(), const_cast<T*>(A));
  const memory b(p.b, Engine(), const_cast<T*>(B));
  const memory c(p.c, Engine(), C);
  const memory scratch(memory::desc({static_cast<int64_t>(std::max<size_t>(p.scratch_bytes, 1))},
                                    DT::u8, memory::format_tag::x),
                       Engine(), Scratch(p.scratch_bytes));
  p.prim.execute(ThreadStream(), {{DNNL_ARG_SRC, a},
                                  {DNNL_ARG_WEIGHTS, b},
                                  {DNNL_ARG_DST, c},
                                  {DNNL_ARG_SCRATCHPAD, scratch}});
  ThreadStream().wait();
}

// rows x cols of a strided 16-bit matrix (row stride ld) into a packed float one.
template <typename T>
void WidenMatrix(const T* src, int64_t rows, int64_t cols, int64_t ld, std::vector<float>* dst) {
  dst->resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) WidenN(src + r * ld, dst->data() + r * cols, cols);
}

// Where oneDNN would run its reference loops: float32 operands, the float32 GEMM (in its pieces on
// the thread budget), the result narrowed. Each element is the float32 product rounded once. The
// buffers are the call's own: this thread may run other kernels' pieces while the GEMM's wait.
template <typename T, typename TC>
void RunWidened(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                int64_t lda, const T* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  struct {
    std::vector<float> a, b, c;
  } t;
  WidenMatrix(A, ta ? K : M, ta ? M : K, lda, &t.a);
  WidenMatrix(B, tb ? N : K, tb ? K : N, ldb, &t.b);
  if constexpr (std::is_same_v<TC, float>) {
    Gemm(ta, tb, M, N, K, alpha, t.a.data(), ta ? M : K, t.b.data(), tb ? K : N, beta, C, ldc);
  } else {
    if (beta != 0.0f) {
      WidenMatrix(C, M, N, ldc, &t.c);
    } else {
      t.c.resize(static_cast<size_t>(M * N));
    }
    Gemm(ta, tb, M, N, K, alpha, t.a.data(), ta ? M : K, t.b.data(), tb ? K : N, beta, t.c.data(),
         N);
    for (int64_t r = 0; r < M; ++r) NarrowN(t.c.data() + r * N, C + r * ldc, N);
  }
}

template <typename T, typename TC>
void HalfGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
              int64_t lda, const T* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  KEEL_ENFORCE(K > 0, "16-bit GEMM of ", M, "x", N, "x", K, ": K must be positive");
  const int64_t pieces = GemmPieces(M, N, K);
  // Pieces of C's longer side, as the float32 GEMM cuts them: a function of the shape alone.
  const bool split_n = N >= M;
  const int64_t len = split_n ? N : M;
  const int64_t step = pieces == 1 ? len : (len / pieces + 15) / 16 * 16;
  // Every piece's shape (a full one and the last) must have a kernel of oneDNN's own.
  for (const int64_t n : {step, len - (len - 1) / step * step}) {
    const Key k = split_n ? MakeKey<T, TC>(ta, tb, M, n, K, lda, ldb, ldc, alpha, beta)
                          : MakeKey<T, TC>(ta, tb, n, N, K, lda, ldb, ldc, alpha, beta);
    if (!GetPlan(k).native) return RunWidened(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  if (pieces == 1) return RunNative(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  cpu_threads::ParallelFor((len + step - 1) / step, [&](int64_t p) {
    const int64_t begin = p * step, n = std::min(step, len - begin);
    if (split_n) {
      RunNative(ta, tb, M, n, K, alpha, A, lda, tb ? B + begin * ldb : B + begin, ldb, beta,
                C + begin, ldc);
    } else {
      RunNative(ta, tb, n, N, K, alpha, ta ? A + begin : A + begin * lda, lda, B, ldb, beta,
                C + begin * ldc, ldc);
    }
  });
}

}  // namespace

void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A,
          int64_t lda, const bfloat16* B, int64_t ldb, float beta, bfloat16* C, int64_t ldc) {
  HalfGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A,
          int64_t lda, const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  HalfGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float16* A,
          int64_t lda, const float16* B, int64_t ldb, float beta, float16* C, int64_t ldc) {
  HalfGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float16* A,
          int64_t lda, const float16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  HalfGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool HalfGemmIsNative(DType dtype) {
  KEEL_ENFORCE(dtype == DType::kBFloat16 || dtype == DType::kFloat16,
               "HalfGemmIsNative: not a 16-bit float type: ", DTypeName(dtype));
  const int t = static_cast<int>(dtype == DType::kBFloat16 ? DT::bf16 : DT::f16);
  return GetPlan(Key{false, false, 64, 64, 64, 64, 64, 64, t, t, 1.0f, 0.0f}).native;
}

}  // namespace blas
}  // namespace keel
