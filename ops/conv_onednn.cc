#include "ops/conv_onednn.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include <glog/logging.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define KEEL_CONV_X86 1
#endif

#include "framework/error.h"
#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/half_convert.h"

namespace keel {
namespace onednn {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using DT = memory::data_type;

const dnnl::engine& Engine() {
  static const dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

// The calling thread's stream (oneDNN streams are not to be shared between threads).
dnnl::stream& ThreadStream() {
  thread_local dnnl::stream s(Engine());
  return s;
}

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

#ifdef KEEL_CONV_X86
// 16x16 16-bit values: row i of s (rows ls apart) becomes column i of d (rows ld apart). Four
// rounds of AVX2 unpacks (16-, 32-, 64-bit, then 128-bit halves), 64 shuffles per 256 values.
__attribute__((target("avx2"))) void Transpose16x16(const uint16_t* s, int64_t ls, uint16_t* d,
                                                    int64_t ld) {
  __m256i r[16], t[16], u[16], v[8], w[8];
  for (int i = 0; i < 16; ++i)
    r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i * ls));
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm256_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // u[4g + k]: rows 4g..4g+3, columns 2k and 2k+1 of each half
    const __m256i* a = t + 4 * g;
    u[4 * g] = _mm256_unpacklo_epi32(a[0], a[2]);
    u[4 * g + 1] = _mm256_unpackhi_epi32(a[0], a[2]);
    u[4 * g + 2] = _mm256_unpacklo_epi32(a[1], a[3]);
    u[4 * g + 3] = _mm256_unpackhi_epi32(a[1], a[3]);
  }
  for (int k = 0; k < 4; ++k) {  // v: rows 0..7, w: rows 8..15, column j of each half
    v[2 * k] = _mm256_unpacklo_epi64(u[k], u[4 + k]);
    v[2 * k + 1] = _mm256_unpackhi_epi64(u[k], u[4 + k]);
    w[2 * k] = _mm256_unpacklo_epi64(u[8 + k], u[12 + k]);
    w[2 * k + 1] = _mm256_unpackhi_epi64(u[8 + k], u[12 + k]);
  }
  for (int j = 0; j < 8; ++j) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + j * ld),
                        _mm256_permute2x128_si256(v[j], w[j], 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + (j + 8) * ld),
                        _mm256_permute2x128_si256(v[j], w[j], 0x31));
  }
}
#endif

// One image's block of 16 channels: [16, HW] (rows HW apart) to [HW, 16] when to_blocks, else
// back.
void TransposeChannelBlock(const uint16_t* s, uint16_t* d, int64_t HW, bool to_blocks) {
  int64_t hw = 0;
#ifdef KEEL_CONV_X86
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    for (; hw + 16 <= HW; hw += 16) {
      if (to_blocks) {
        Transpose16x16(s + hw, HW, d + hw * 16, 16);
      } else {
        Transpose16x16(s + hw * 16, 16, d + hw, HW);
      }
    }
  }
#endif
  for (; hw < HW; ++hw)
    for (int64_t c = 0; c < 16; ++c) {
      if (to_blocks) {
        d[hw * 16 + c] = s[c * HW + hw];
      } else {
        d[c * HW + hw] = s[hw * 16 + c];
      }
    }
}

void TransposeChannelBlocks(const uint16_t* s, uint16_t* d, int64_t N, int64_t C, int64_t HW,
                            bool to_blocks) {
  for (int64_t b = 0; b < N * C / 16; ++b)
    TransposeChannelBlock(s + b * 16 * HW, d + b * 16 * HW, HW, to_blocks);
}

// A reorder between a plain layout and a primitive's, or nothing when the two are the same.
//
// 16-bit activations between NCHW and 16-channel blocks (nChw16c, what the AVX-512 convolutions
// take) are moved by keel's own transposes: oneDNN 2.6 runs them with its generic jit:uni
// reorder, measured 3.1x slower on ResNet-20's shapes (8x16x32x32 bfloat16: 31.6 against 10.3 us
// one way, 31.6 against 11.3 back; the same bits), which made these reorders a third of the
// bfloat16 convolutions' time. Every other layout pair is oneDNN's reorder.
struct Reorder {
  enum class Own { kNo, kToBlocks, kFromBlocks };
  bool needed = false;
  Own own = Own::kNo;
  int64_t N = 0, C = 0, HW = 0;
  dnnl::reorder::primitive_desc pd;
  dnnl::reorder prim;
  memory::desc to;

  Reorder() = default;
  Reorder(const memory::desc& from_md, const memory::desc& to_md)
      : needed(from_md != to_md), to(to_md) {
    if (!needed) return;
    const memory::dims d = from_md.dims();
    const DT dt = from_md.data_type();
    if ((dt == DT::bf16 || dt == DT::f16) && d.size() == 4 && d[1] % 16 == 0) {
      const memory::desc nchw(d, dt, Tag::nchw), blocks(d, dt, Tag::nChw16c);
      if (from_md == nchw && to_md == blocks) own = Own::kToBlocks;
      if (from_md == blocks && to_md == nchw) own = Own::kFromBlocks;
      N = d[0], C = d[1], HW = d[2] * d[3];
    }
    if (own != Own::kNo) return;
    pd = dnnl::reorder::primitive_desc(Engine(), from_md, Engine(), to_md, UserScratchpad());
    prim = dnnl::reorder(pd);
  }
  size_t scratch_bytes() const {
    return needed && own == Own::kNo ? pd.scratchpad_desc().get_size() : 0;
  }
  void Run(const memory& from, const memory& dst, const memory& scratch) const {
    if (own != Own::kNo) {
      return TransposeChannelBlocks(static_cast<const uint16_t*>(from.get_data_handle()),
                                    static_cast<uint16_t*>(dst.get_data_handle()), N, C, HW,
                                    own == Own::kToBlocks);
    }
    std::unordered_map<int, memory> args{{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, dst}};
    if (scratch.get(true) != nullptr) args[DNNL_ARG_SCRATCHPAD] = scratch;
    prim.execute(ThreadStream(), args);
  }
};

memory::dims Dims(std::initializer_list<int64_t> v) { return memory::dims(v.begin(), v.end()); }

// Allocates `m` with `md` unless it already has that layout.
void Ensure(memory* m, const memory::desc& md) {
  if (m->get(true) == nullptr || m->get_desc() != md) *m = memory(md, Engine());
}

// Working memory of one call, by role. Each role is a raw buffer per thread, grown to the largest
// use and wrapped with the call's layout: a piece runs start to end on one thread, so every conv
// op a thread runs shares it, and memory does not grow with the number of conv ops (it did by
// ~90 MB on ResNet-20 with a set of buffers per op and piece).
enum Slot { kSrc, kDst, kDiffDstD, kDiffDstW, kSrcW, kDiffSrc, kDiffWeights, kScratch, kSlots };

memory ThreadMem(Slot slot, const memory::desc& md) {
  struct Buffer {
    std::unique_ptr<void, decltype(&std::free)> data{nullptr, &std::free};
    size_t size = 0;
  };
  thread_local Buffer buffers[kSlots];
  Buffer& b = buffers[slot];
  const size_t need = (std::max<size_t>(md.get_size(), 1) + 63) / 64 * 64;
  if (b.size < need) {
    b.data.reset(std::aligned_alloc(64, need));
    if (b.data == nullptr) throw std::bad_alloc();
    b.size = need;
  }
  return memory(md, Engine(), b.data.get());
}

memory Wrap(const memory::desc& md, const void* p) {
  return memory(md, Engine(), const_cast<void*>(p));
}

size_t ElemSize(DT dt) { return dt == DT::f32 ? 4 : 2; }

// A 16-bit convolution oneDNN would run by its reference loops, or by im2col and a GEMM, is
// refused: the caller's float32 path (the data widened, float32's direct kernels) is faster.
// LeNet's first convolution (one input channel) got `x64:gemm:jit` for its bfloat16 filter
// gradient, 0.55 ms a piece against float32's direct kernel's 0.094 (ONEDNN_VERBOSE, one thread),
// which made LeNet's bfloat16 step slower than float32's.
void RefuseReference(DT dt, const char* impl) {
  const std::string name(impl);
  if (dt != DT::f32 && (name.rfind("ref", 0) == 0 || name.find("gemm") != std::string::npos))
    throw dnnl::error(dnnl_unimplemented,
                      "only oneDNN's reference or im2col convolution for 16-bit data");
}

}  // namespace

bool ConvShape::operator==(const ConvShape& o) const {
  return N == o.N && C == o.C && H == o.H && W == o.W && M == o.M && kh == o.kh && kw == o.kw &&
         sh == o.sh && sw == o.sw && ph == o.ph && pw == o.pw && dh == o.dh && dw == o.dw &&
         groups == o.groups && Ho == o.Ho && Wo == o.Wo && nhwc == o.nhwc;
}

struct ConvPrimitives::Impl {
  memory::desc src_md, w_md, dst_md;  // NCHW (NHWC), OIHW (GOIHW with groups), NCHW (NHWC)
  memory::desc dw_md;                 // the filter gradient's: float32 OIHW (GOIHW)
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data::primitive_desc bd_pd;
  dnnl::convolution_backward_data bd;
  dnnl::convolution_backward_weights::primitive_desc bw_pd;
  dnnl::convolution_backward_weights bw;
  Reorder src_fwd, w_fwd, dst_fwd;  // forward: x in, w in, y out
  Reorder ddst_bd, w_bd, dsrc_bd;   // data gradient: dy in, w in, dx out
  Reorder src_bw, ddst_bw, dw_bw;   // weights gradient: x in, dy in, dw out
  memory::desc scratch_md;
  bool backward = false;
};

ConvPrimitives::ConvPrimitives(const ConvShape& s, bool backward, DT dt) : shape_(s) {
  auto impl = std::make_shared<Impl>();
  Impl& p = *impl;
  p.backward = backward;
  const Tag data_tag = s.nhwc ? Tag::nhwc : Tag::nchw;
  p.src_md = memory::desc(Dims({s.N, s.C, s.H, s.W}), dt, data_tag);
  p.dst_md = memory::desc(Dims({s.N, s.M, s.Ho, s.Wo}), dt, data_tag);
  const memory::dims w_dims = s.groups == 1
                                  ? Dims({s.M, s.C, s.kh, s.kw})
                                  : Dims({s.groups, s.M / s.groups, s.C / s.groups, s.kh, s.kw});
  const Tag w_tag = s.groups == 1 ? Tag::oihw : Tag::goihw;
  p.w_md = memory::desc(w_dims, dt, w_tag);
  p.dw_md = memory::desc(w_dims, DT::f32, w_tag);
  const memory::desc src_any(p.src_md.dims(), dt, Tag::any);
  const memory::desc dst_any(p.dst_md.dims(), dt, Tag::any);
  const memory::desc w_any(w_dims, dt, Tag::any);
  const memory::desc dw_any(w_dims, DT::f32, Tag::any);
  const memory::dims strides = Dims({s.sh, s.sw}), dilates = Dims({s.dh - 1, s.dw - 1});
  const memory::dims pads = Dims({s.ph, s.pw});
  const dnnl::primitive_attr attr = UserScratchpad();

  p.fwd_pd = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                      dnnl::algorithm::convolution_direct, src_any, w_any, dst_any,
                                      strides, dilates, pads, pads),
      attr, Engine());
  VLOG(1) << "conv2d " << (dt == DT::f32 ? "float32" : "bfloat16") << " N " << s.N << " C " << s.C
          << " M " << s.M << ": oneDNN " << p.fwd_pd.impl_info_str();
  RefuseReference(dt, p.fwd_pd.impl_info_str());
  p.fwd = dnnl::convolution_forward(p.fwd_pd);
  p.src_fwd = Reorder(p.src_md, p.fwd_pd.src_desc());
  p.w_fwd = Reorder(p.w_md, p.fwd_pd.weights_desc());
  p.dst_fwd = Reorder(p.fwd_pd.dst_desc(), p.dst_md);
  size_t scratch = p.fwd_pd.scratchpad_desc().get_size();
  if (backward) {
    p.bd_pd = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src_any, w_any,
                                              dst_any, strides, dilates, pads, pads),
        attr, Engine(), p.fwd_pd);
    RefuseReference(dt, p.bd_pd.impl_info_str());
    p.bd = dnnl::convolution_backward_data(p.bd_pd);
    p.bw_pd = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src_any,
                                                 dw_any, dst_any, strides, dilates, pads, pads),
        attr, Engine(), p.fwd_pd);
    RefuseReference(dt, p.bw_pd.impl_info_str());
    p.bw = dnnl::convolution_backward_weights(p.bw_pd);
    p.ddst_bd = Reorder(p.dst_md, p.bd_pd.diff_dst_desc());
    p.w_bd = Reorder(p.w_md, p.bd_pd.weights_desc());
    p.dsrc_bd = Reorder(p.bd_pd.diff_src_desc(), p.src_md);
    p.src_bw = Reorder(p.src_md, p.bw_pd.src_desc());
    p.ddst_bw = Reorder(p.dst_md, p.bw_pd.diff_dst_desc());
    p.dw_bw = Reorder(p.bw_pd.diff_weights_desc(), p.dw_md);
    scratch = std::max(
        {scratch, p.bd_pd.scratchpad_desc().get_size(), p.bw_pd.scratchpad_desc().get_size()});
  }
  for (const Reorder* r : {&p.src_fwd, &p.w_fwd, &p.dst_fwd, &p.ddst_bd, &p.w_bd, &p.dsrc_bd,
                           &p.src_bw, &p.ddst_bw, &p.dw_bw})
    scratch = std::max(scratch, r->scratch_bytes());
  p.scratch_md =
      memory::desc(Dims({static_cast<int64_t>(std::max<size_t>(scratch, 1))}), DT::u8, Tag::x);
  impl_ = std::move(impl);
}

bool ConvPrimitives::has_backward() const { return impl_->backward; }

void ConvPrimitives::PrepareForwardWeights(const void* w, memory* out) const {
  const Impl& p = *impl_;
  if (!p.w_fwd.needed) {
    *out = Wrap(p.w_md, w);
    return;
  }
  Ensure(out, p.w_fwd.to);
  memory scratch(p.scratch_md, Engine());
  cpu_threads::UseOneOpenMPThread();
  p.w_fwd.Run(Wrap(p.w_md, w), *out, scratch);
  ThreadStream().wait();
}

void ConvPrimitives::PrepareBackwardWeights(const void* w, memory* out) const {
  const Impl& p = *impl_;
  CHECK(p.backward) << "conv primitives built without the backward pass";
  if (!p.w_bd.needed) {
    *out = Wrap(p.w_md, w);
    return;
  }
  Ensure(out, p.w_bd.to);
  memory scratch(p.scratch_md, Engine());
  cpu_threads::UseOneOpenMPThread();
  p.w_bd.Run(Wrap(p.w_md, w), *out, scratch);
  ThreadStream().wait();
}

void ConvPrimitives::Forward(const void* x, const memory& w, void* y) const {
  const Impl& p = *impl_;
  cpu_threads::UseOneOpenMPThread();
  const memory scratch = ThreadMem(kScratch, p.scratch_md);
  memory src = Wrap(p.src_md, x), dst = Wrap(p.dst_md, y);
  if (p.src_fwd.needed) {
    const memory blocked = ThreadMem(kSrc, p.src_fwd.to);
    p.src_fwd.Run(src, blocked, scratch);
    src = blocked;
  }
  memory out = dst;
  if (p.dst_fwd.needed) {
    out = ThreadMem(kDst, p.fwd_pd.dst_desc());
  }
  p.fwd.execute(ThreadStream(), {{DNNL_ARG_SRC, src},
                                 {DNNL_ARG_WEIGHTS, w},
                                 {DNNL_ARG_DST, out},
                                 {DNNL_ARG_SCRATCHPAD, scratch}});
  if (p.dst_fwd.needed) p.dst_fwd.Run(out, dst, scratch);
  ThreadStream().wait();
}

void ConvPrimitives::Backward(const void* x, const memory& w, const void* dy, void* dx,
                              float* dw) const {
  const Impl& p = *impl_;
  CHECK(p.backward) << "conv primitives built without the backward pass";
  cpu_threads::UseOneOpenMPThread();
  const memory scratch = ThreadMem(kScratch, p.scratch_md);
  const memory dy_plain = Wrap(p.dst_md, dy);
  memory ddst_d;  // dy in the data gradient's layout, when reordered
  if (dx != nullptr) {
    memory ddst = dy_plain;
    if (p.ddst_bd.needed) {
      ddst = ThreadMem(kDiffDstD, p.ddst_bd.to);
      p.ddst_bd.Run(dy_plain, ddst, scratch);
      ddst_d = ddst;
    }
    const memory dx_plain = Wrap(p.src_md, dx);
    memory dsrc = dx_plain;
    if (p.dsrc_bd.needed) {
      dsrc = ThreadMem(kDiffSrc, p.bd_pd.diff_src_desc());
    }
    p.bd.execute(ThreadStream(), {{DNNL_ARG_DIFF_DST, ddst},
                                  {DNNL_ARG_WEIGHTS, w},
                                  {DNNL_ARG_DIFF_SRC, dsrc},
                                  {DNNL_ARG_SCRATCHPAD, scratch}});
    if (p.dsrc_bd.needed) p.dsrc_bd.Run(dsrc, dx_plain, scratch);
  }
  if (dw != nullptr) {
    memory src = Wrap(p.src_md, x);
    if (p.src_bw.needed) {
      const memory blocked = ThreadMem(kSrcW, p.src_bw.to);
      p.src_bw.Run(src, blocked, scratch);
      src = blocked;
    }
    memory ddst = dy_plain;
    if (p.ddst_bw.needed) {
      // The data gradient's reorder of dy is reused when both want the same layout.
      if (dx != nullptr && p.ddst_bd.needed && p.ddst_bd.to == p.ddst_bw.to) {
        ddst = ddst_d;
      } else {
        ddst = ThreadMem(kDiffDstW, p.ddst_bw.to);
        p.ddst_bw.Run(dy_plain, ddst, scratch);
      }
    }
    const memory dw_plain = Wrap(p.dw_md, dw);
    memory dweights = dw_plain;
    if (p.dw_bw.needed) {
      dweights = ThreadMem(kDiffWeights, p.bw_pd.diff_weights_desc());
    }
    p.bw.execute(ThreadStream(), {{DNNL_ARG_SRC, src},
                                  {DNNL_ARG_DIFF_DST, ddst},
                                  {DNNL_ARG_DIFF_WEIGHTS, dweights},
                                  {DNNL_ARG_SCRATCHPAD, scratch}});
    if (p.dw_bw.needed) p.dw_bw.Run(dweights, dw_plain, scratch);
  }
  ThreadStream().wait();
}

void ToChannelBlocks16(const uint16_t* nchw, uint16_t* blocked, int64_t N, int64_t C, int64_t HW) {
  CHECK_EQ(C % 16, 0) << "channel blocks of 16";
  TransposeChannelBlocks(nchw, blocked, N, C, HW, /*to_blocks=*/true);
}
void FromChannelBlocks16(const uint16_t* blocked, uint16_t* nchw, int64_t N, int64_t C,
                         int64_t HW) {
  CHECK_EQ(C % 16, 0) << "channel blocks of 16";
  TransposeChannelBlocks(blocked, nchw, N, C, HW, /*to_blocks=*/false);
}

bool Supports(const ConvShape& s) {
  return s.N > 0 && s.C > 0 && s.M > 0 && s.Ho > 0 && s.Wo > 0 && s.groups >= 1 &&
         s.C % s.groups == 0 && s.M % s.groups == 0;
}

bool PiecedConv::Forward(const ConvShape& s, int64_t per, const void* x, const void* f, void* y) {
  const int64_t pieces = (s.N + per - 1) / per;
  if (!Supports(s) || !Prepare(s, per, pieces, /*backward=*/false, f)) return false;
  const size_t e = ElemSize(dt_);
  cpu_threads::ParallelFor(pieces, [&](int64_t p) {
    const Entry& en = *piece_entry_[static_cast<size_t>(p)];
    en.prims->Forward(static_cast<const char*>(x) + p * per * s.C * s.H * s.W * e, en.w,
                      static_cast<char*>(y) + p * per * s.M * s.Ho * s.Wo * e);
  });
  return true;
}

bool PiecedConv::Backward(const ConvShape& s, int64_t per, const void* x, const void* f,
                          const void* dy, void* dx, void* df) {
  const int64_t pieces = (s.N + per - 1) / per;
  const int64_t fsize = s.M * (s.C / s.groups) * s.kh * s.kw;
  if (!Supports(s) || !Prepare(s, per, pieces, /*backward=*/true, dx != nullptr ? f : nullptr))
    return false;
  const size_t e = ElemSize(dt_);
  // One float32 piece writes the filter gradient in place; otherwise each piece its own part.
  const bool direct = dt_ == DT::f32 && pieces == 1;
  if (df != nullptr && !direct) dw_.resize(static_cast<size_t>(pieces * fsize));
  cpu_threads::ParallelFor(pieces, [&](int64_t p) {
    const Entry& en = *piece_entry_[static_cast<size_t>(p)];
    const int64_t xoff = p * per * s.C * s.H * s.W, yoff = p * per * s.M * s.Ho * s.Wo;
    float* dwp = df == nullptr ? nullptr
                 : direct      ? static_cast<float*>(df)
                               : dw_.data() + p * fsize;
    en.prims->Backward(static_cast<const char*>(x) + xoff * e, en.w,
                       static_cast<const char*>(dy) + yoff * e,
                       dx != nullptr ? static_cast<char*>(dx) + xoff * e : nullptr, dwp);
  });
  if (df != nullptr && !direct) {
    for (int64_t p = 1; p < pieces; ++p)
      for (int64_t i = 0; i < fsize; ++i) dw_[i] += dw_[p * fsize + i];
    if (dt_ == DT::f32) {
      std::copy(dw_.begin(), dw_.begin() + fsize, static_cast<float*>(df));
    } else {
      NarrowN(dw_.data(), static_cast<bfloat16*>(df), fsize);
    }
  }
  return true;
}

bool PiecedConv::Prepare(const ConvShape& s, int64_t per, int64_t pieces, bool backward,
                         const void* f) {
  for (const ConvShape& r : refused_)
    if (r == s) return false;
  if (entries_.size() > 8) entries_.clear();  // batch sizes keep changing
  piece_entry_.assign(static_cast<size_t>(pieces), nullptr);
  std::vector<Entry*> used;
  for (int64_t p = 0; p < pieces; ++p) {
    ConvShape ps = s;
    ps.N = std::min(per, s.N - p * per);
    Entry* e = nullptr;
    for (auto& c : entries_)
      if (c->prims->shape() == ps) e = c.get();
    if (e == nullptr || (backward && !e->prims->has_backward())) {
      std::unique_ptr<ConvPrimitives> prims;
      try {
        prims = std::make_unique<ConvPrimitives>(ps, backward, dt_);
      } catch (const dnnl::error&) {
        // No implementation for this geometry (extreme strides or dilations), or for 16-bit data
        // only the reference one.
        refused_.push_back(s);
        return false;
      }
      if (e == nullptr) {
        entries_.push_back(std::make_unique<Entry>());
        e = entries_.back().get();
      }
      e->prims = std::move(prims);
    }
    piece_entry_[static_cast<size_t>(p)] = e;
    if (std::find(used.begin(), used.end(), e) == used.end()) used.push_back(e);
  }
  if (f == nullptr) return true;
  for (Entry* e : used) {
    if (backward)
      e->prims->PrepareBackwardWeights(f, &e->w);
    else
      e->prims->PrepareForwardWeights(f, &e->w);
  }
  return true;
}

}  // namespace onednn
}  // namespace keel
