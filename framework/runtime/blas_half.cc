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
// A batched GEMM (batch > 1) adds its matrices' strides sa, sb, sc (sb 0: one B for all).
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                       float, float, int64_t, int64_t, int64_t, int64_t>;

struct Plan {
  bool native = false;  // oneDNN has an implementation of its own (not its reference loops)
  memory::desc a, b, c;
  dnnl::matmul prim;
  size_t scratch_bytes = 0;
  std::string impl;  // oneDNN's implementation name
};

std::unique_ptr<Plan> MakePlan(const Key& k) {
  const auto [ta, tb, M, N, K, lda, ldb, ldc, ab_type, c_type, alpha, beta, batch, sa, sb, sc] = k;
  auto plan = std::make_unique<Plan>();
  const DT ab = static_cast<DT>(ab_type), ct = static_cast<DT>(c_type);
  if (batch == 1) {
    plan->a = memory::desc({M, K}, ab, ta ? memory::dims{1, lda} : memory::dims{lda, 1});
    plan->b = memory::desc({K, N}, ab, tb ? memory::dims{1, ldb} : memory::dims{ldb, 1});
    plan->c = memory::desc({M, N}, ct, memory::dims{ldc, 1});
  } else {
    plan->a =
        memory::desc({batch, M, K}, ab, ta ? memory::dims{sa, 1, lda} : memory::dims{sa, lda, 1});
    const int64_t bb = sb == 0 ? 1 : batch, bs = sb == 0 ? K * N : sb;
    plan->b =
        memory::desc({bb, K, N}, ab, tb ? memory::dims{bs, 1, ldb} : memory::dims{bs, ldb, 1});
    plan->c = memory::desc({batch, M, N}, ct, memory::dims{sc, ldc, 1});
  }
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
    plan->impl = pd.impl_info_str();
    if (plan->impl.rfind("ref", 0) == 0) return plan;  // reference loops
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
            int64_t ldc, float alpha, float beta, int64_t batch = 1, int64_t sa = 0, int64_t sb = 0,
            int64_t sc = 0) {
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
             beta,
             batch,
             sa,
             sb,
             sc};
}

// A plan's primitive on the calling thread (one OpenMP thread), over A, B and C.
template <typename T, typename TC>
void Execute(const Plan& p, const T* A, const T* B, TC* C) {
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

// One GEMM by its plan's primitive.
template <typename T, typename TC>
void RunNative(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  const Plan& p = GetPlan(MakeKey<T, TC>(ta, tb, M, N, K, lda, ldb, ldc, alpha, beta));
  KEEL_ENFORCE(p.native, "oneDNN refused a piece of a ", M, "x", N, "x", K,
               " GEMM it accepted whole");
  Execute(p, A, B, C);
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

// rows x cols of a strided matrix (row stride ld) as a dense one: src itself where it is dense,
// else a copy in *buf.
template <typename U>
U* Dense(U* src, int64_t rows, int64_t cols, int64_t ld, std::vector<std::remove_const_t<U>>* buf) {
  if (ld == cols) return src;
  buf->resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(src + r * ld, cols, buf->data() + r * cols);
  return buf->data();
}

// How a 16-bit GEMM is cut: pieces of C's longer side, as the float32 GEMM cuts them, a function
// of the shape alone (and, for a square C, of the layout: the side whose pieces need fewer copies
// below), so every element is computed the same way whatever the number of threads.
//
// Each piece runs on dense operands: oneDNN 2.6 takes its brgemm kernels only for a dense B and C,
// and a piece of a strided view otherwise gets its older gemm:jit, 10-25 % slower on the MLP's
// GEMMs here. The operand that is not cut is made dense once; each piece copies its part of the
// cut one and of C where they are strided (a few hundred KB against a GEMM piece of ~0.1 ms).
struct Cut {
  int64_t pieces = 1;
  bool split_n = true;
  int64_t len = 0, step = 0;  // the cut side's length and a full piece's
  int64_t last() const { return len - (len - 1) / step * step; }

  Cut(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc)
      : pieces(GemmPieces(M, N, K)) {
    const bool a_rows_dense = !ta && lda == K, b_rows_dense = tb && ldb == K;
    const int64_t copies_n = (b_rows_dense ? 0 : K * N) + M * N;
    const int64_t copies_m = (a_rows_dense ? 0 : M * K) + (ldc == N ? 0 : M * N);
    split_n = N != M ? N > M : copies_n <= copies_m;
    len = split_n ? N : M;
    step = pieces == 1 ? len : GemmPieceLength(len, pieces);
  }
};

// The key of a dense piece of n rows or columns of C (the whole GEMM's own for one piece).
template <typename T, typename TC>
Key PieceKey(const Cut& cut, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda,
             int64_t ldb, int64_t ldc, int64_t n, float alpha, float beta) {
  if (cut.pieces == 1) return MakeKey<T, TC>(ta, tb, M, N, K, lda, ldb, ldc, alpha, beta);
  return cut.split_n ? MakeKey<T, TC>(ta, tb, M, n, K, ta ? M : K, tb ? K : n, n, alpha, beta)
                     : MakeKey<T, TC>(ta, tb, n, N, K, ta ? n : K, tb ? K : N, N, alpha, beta);
}

// Whether oneDNN has a kernel of its own for every piece of the cut (a full one and the last).
template <typename T, typename TC>
bool PiecesNative(const Cut& cut, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                  int64_t ldb, int64_t ldc, float alpha, float beta) {
  for (const int64_t n : {cut.step, cut.last()}) {
    if (!GetPlan(PieceKey<T, TC>(cut, ta, tb, M, N, K, lda, ldb, ldc, n, alpha, beta)).native)
      return false;
  }
  return true;
}

// Those pieces' implementation names, or "" where one has none of its own (tests and logs).
template <typename T, typename TC>
std::string PiecesImpl(const Cut& cut, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                       int64_t lda, int64_t ldb, int64_t ldc, float alpha, float beta) {
  std::string impl;
  for (const int64_t n : {cut.step, cut.last()}) {
    const Plan& p = GetPlan(PieceKey<T, TC>(cut, ta, tb, M, N, K, lda, ldb, ldc, n, alpha, beta));
    if (!p.native) return "";
    if (!impl.empty() && impl != p.impl) impl += "+";
    if (impl != p.impl) impl += p.impl;
  }
  return impl;
}

template <typename T, typename TC>
void HalfGemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
              int64_t lda, const T* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  KEEL_ENFORCE(K > 0, "16-bit GEMM of ", M, "x", N, "x", K, ": K must be positive");
  const Cut cut(ta, tb, M, N, K, lda, ldb, ldc);
  if (!PiecesNative<T, TC>(cut, ta, tb, M, N, K, lda, ldb, ldc, alpha, beta))
    return RunWidened(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (cut.pieces == 1) return RunNative(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const bool split_n = cut.split_n;
  const int64_t len = cut.len, step = cut.step, a_cols = ta ? M : K, b_cols = tb ? K : N;
  // The call's own buffer: this thread may run other GEMMs' pieces while it waits for its own.
  std::vector<T> whole;
  if (split_n) {
    A = Dense(A, ta ? K : M, a_cols, lda, &whole);
  } else {
    B = Dense(B, tb ? N : K, b_cols, ldb, &whole);
  }
  cpu_threads::ParallelFor((len + step - 1) / step, [&](int64_t p) {
    // A piece runs start to end on its thread, so the buffers can be the thread's.
    thread_local std::vector<T> part;
    thread_local std::vector<TC> out;
    const int64_t begin = p * step, n = std::min(step, len - begin);
    const T* a = A;
    const T* b = B;
    TC* c = split_n ? C + begin : C + begin * ldc;
    const int64_t rows_c = split_n ? M : n, cols_c = split_n ? n : N;
    if (split_n) {
      b = tb ? Dense(B + begin * ldb, n, K, ldb, &part) : Dense(B + begin, K, n, ldb, &part);
    } else {
      a = ta ? Dense(A + begin, K, n, lda, &part) : Dense(A + begin * lda, n, K, lda, &part);
    }
    TC* dense_c = c;
    if (ldc != cols_c) {
      out.resize(static_cast<size_t>(rows_c * cols_c));
      dense_c = out.data();
      if (beta != 0.0f) Dense(c, rows_c, cols_c, ldc, &out);
    }
    if (split_n) {
      RunNative(ta, tb, M, n, K, alpha, a, a_cols, b, tb ? K : n, beta, dense_c, n);
    } else {
      RunNative(ta, tb, n, N, K, alpha, a, ta ? n : K, b, b_cols, beta, dense_c, N);
    }
    if (dense_c != c) {
      for (int64_t r = 0; r < rows_c; ++r) std::copy_n(dense_c + r * cols_c, cols_c, c + r * ldc);
    }
  });
}

// batch GEMMs of contiguous matrices (the b-th at A + b * sa, B + b * sb, C + b * sc), float32
// or 16-bit. Small ones (one piece each, as the attention's per-head products) run as batched
// matmul primitives over runs of the batch: one primitive call per run instead of one per matrix,
// whose fixed cost (~1 us: the plan's lookup, four memory objects, the call; sgemm's own for
// float32) was most of an 8x16x8 product's time, and made the transformer's bfloat16 step 3x
// float32's. The runs are cut by the shape alone. Larger matrices, or where oneDNN has no batched
// kernel of its own, go one by one through Gemm.
template <typename T, typename TC>
void GemmBatchedImpl(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                     int64_t sa, const T* B, int64_t sb, float beta, TC* C, int64_t sc,
                     int64_t batch) {
  const int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
  auto one_by_one = [&] {
    for (int64_t b = 0; b < batch; ++b)
      Gemm(ta, tb, M, N, K, alpha, A + b * sa, lda, B + b * sb, ldb, beta, C + b * sc, ldc);
  };
  if (M == 0 || N == 0 || batch <= 0) return;
  if (batch == 1 || K == 0 || sa == 0 || GemmPieces(M, N, K) > 1) return one_by_one();
  // Runs of about 32 MFLOP over the whole batch, at most 8: small products, whose call costs
  // more than the repacking that makes GemmPieces cut larger ones less often.
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) *
                       static_cast<double>(K) * static_cast<double>(batch);
  const int64_t runs =
      std::clamp<int64_t>(static_cast<int64_t>(flops / 32e6), 1, std::min<int64_t>(8, batch));
  // Runs of `per` matrices and a last one of `last` (there may be fewer than `runs`: 17 in 8 runs
  // are 6 runs, the last of 2).
  const int64_t per = (batch + runs - 1) / runs, last = batch - (batch - 1) / per * per;
  // A run of n matrices' key (one matrix: the single GEMM's).
  auto key = [&](int64_t n) {
    return n > 1 ? MakeKey<T, TC>(ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, n, sa, sb, sc)
                 : MakeKey<T, TC>(ta, tb, M, N, K, lda, ldb, ldc, alpha, beta);
  };
  for (const int64_t n : {per, last}) {
    if (!GetPlan(key(n)).native) return one_by_one();
  }
  cpu_threads::ParallelFor((batch + per - 1) / per, [&](int64_t r) {
    const int64_t b0 = r * per, n = std::min(per, batch - b0);
    Execute(GetPlan(key(n)), A + b0 * sa, B + b0 * sb, C + b0 * sc);
  });
}

}  // namespace

void GemmBatched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t sa, const float* B, int64_t sb, float beta, float* C, int64_t sc,
                 int64_t batch) {
  GemmBatchedImpl(ta, tb, M, N, K, alpha, A, sa, B, sb, beta, C, sc, batch);
}

// blas.h's 16-bit entry points for operands of type T and C of type TC.
#define KEEL_HALF_GEMM_ENTRIES(T, TC)                                                          \
  void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A,        \
            int64_t lda, const T* B, int64_t ldb, float beta, TC* C, int64_t ldc) {            \
    HalfGemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);                            \
  }                                                                                            \
  void GemmBatched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, \
                   int64_t sa, const T* B, int64_t sb, float beta, TC* C, int64_t sc,          \
                   int64_t batch) {                                                            \
    GemmBatchedImpl(ta, tb, M, N, K, alpha, A, sa, B, sb, beta, C, sc, batch);                 \
  }
KEEL_HALF_GEMM_ENTRIES(bfloat16, bfloat16)
KEEL_HALF_GEMM_ENTRIES(bfloat16, float)
KEEL_HALF_GEMM_ENTRIES(float16, float16)
KEEL_HALF_GEMM_ENTRIES(float16, float)
#undef KEEL_HALF_GEMM_ENTRIES

std::string HalfGemmImplementation(DType dtype, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                   int64_t lda, int64_t ldb, int64_t ldc) {
  KEEL_ENFORCE(dtype == DType::kBFloat16 || dtype == DType::kFloat16,
               "HalfGemmImplementation: not a 16-bit float type: ", DTypeName(dtype));
  const Cut cut(ta, tb, M, N, K, lda, ldb, ldc);
  const std::string impl =
      dtype == DType::kBFloat16
          ? PiecesImpl<bfloat16, bfloat16>(cut, ta, tb, M, N, K, lda, ldb, ldc, 1.0f, 0.0f)
          : PiecesImpl<float16, float16>(cut, ta, tb, M, N, K, lda, ldb, ldc, 1.0f, 0.0f);
  return impl.empty() ? "widened" : impl;
}

bool HalfGemmIsNative(DType dtype) {
  KEEL_ENFORCE(dtype == DType::kBFloat16 || dtype == DType::kFloat16,
               "HalfGemmIsNative: not a 16-bit float type: ", DTypeName(dtype));
  const int t = static_cast<int>(dtype == DType::kBFloat16 ? DT::bf16 : DT::f16);
  return GetPlan(Key{false, false, 64, 64, 64, 64, 64, 64, t, t, 1.0f, 0.0f, 1, 0, 0, 0}).native;
}

}  // namespace blas
}  // namespace keel
