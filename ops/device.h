// Kernels written once for every device. An op's kernel is a class template over a device tag and
// a dtype, FooKernel<D, T> (Paddle's FooKernel<DeviceContext, T>), in its family's header
// ops/<family>_ops.h: the front of the kernel (attributes, input and output slots, checks,
// allocation, what a grad kernel does when its output is not wanted) exists once. What differs
// per device is the math, reached in one of two ways:
//   - the device vocabulary Device<D> below: element-wise for-each (with Paddle's broadcasting),
//     fills and copies, batched GEMM, late reports of bad input; CPU side in ops/device_cpu.h,
//     CUDA side in ops/cuda_util.cuh;
//   - a family's math struct (e.g. SoftmaxMath<D, T>), declared in the family header and
//     specialised in the .cc (Eigen loops, oneDNN: the CPU's bits) and the .cu (CUDA kernels,
//     cuDNN, cuBLAS).
// The .cc keeps the schemas, shape functions and CPU registrations, the .cu the CUDA ones.
//
// A front instantiated for CUDADevice is compiled by nvcc: family headers include this header,
// ops/axis_layout.h and ops/functors/, never Eigen or ops/op_util.h, and element-wise lambdas they
// hand to the vocabulary are KEEL_HD_LAMBDA (host and device). Fronts live in namespace keel, not
// in an anonymous namespace: the CPU and CUDA objects instantiate them for different tags, so no
// class is defined in both (tests/cmake/odr_check.sh), and math structs are partial
// specialisations on the tag.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/float16.h"
#include "framework/runtime/place.h"
#include "ops/functors/elementwise_functors.h"
#include "ops/functors/hd.h"

namespace keel {

// Mixed precision: a kernel registered for the 16-bit types (float16, bfloat16; see
// framework/runtime/float16.h) loads them, computes in Acc<T> (float32) and rounds the result
// once: Widen(x), Narrow<T>(acc). For float and double both are the identity.

// The device tags.
struct CPUDevice {
  static constexpr Place::Kind kPlace = Place::Kind::kCPU;
};
struct CUDADevice {
  static constexpr Place::Kind kPlace = Place::Kind::kCUDA;
};

// The vocabulary of device math; every specialisation has these static members (ctx: the op's
// execution context, whose place picks the CUDA stream):
//   ForEach(ctx, n, f)              f(i) for i in [0, n); CPU: in order on the calling thread
//   ForEachInPieces(ctx, n, g, f)   as ForEach; CPU: in pieces of g on the thread budget (work
//                                   whose elements are independent)
//   ForEachBroadcast(ctx, m, f)     f(i, j) for every X index i, j = m.YIndex(i)
//   SumBroadcast(ctx, m, out, f)    out[j] = sum of f(i, j) over the X indices i of Y entry j, in
//                                   the device's fixed order; the sum and f's values are Acc<T>
//                                   (float32 for the 16-bit types), rounded to T at the end
//   Fill(ctx, p, n, v), Zero(ctx, p, n)
//   Copy(ctx, src, dst, n)          nothing when src == dst
//   CopyRows(ctx, src, src_stride, dst, dst_stride, rows, width)   a strided slab copy
//   FromHost(ctx, dst, n, staging, fill)   fill(p, n) writes n values on the host (a random draw
//                                   with the CPU's generator); CUDA stages them in `staging`
//   Upload(ctx, host, bytes, keep)  where device code reads `bytes` of host memory (a table of
//                                   constants): the host memory itself on the CPU, a copy in
//                                   tensor `keep` on CUDA
//   Gemm(ctx, ta, tb, M, N, K, alpha, A, sa, B, sb, beta, C, sc, batch)
//                                   C_b = alpha op(A_b) op(B_b) + beta C_b, row-major, operand b
//                                   at b * stride (0: shared by the batch); K == 0 is allowed.
//                                   alpha, beta: Acc<T>; C: T, or float32 for 16-bit A and B
//                                   (float32 accumulation on every device)
//   GemmAdd(ctx, ta, tb, M, N, K, alpha, A, B, C)
//                                   C += alpha op(A) op(B), contiguous, the product rounded to T
//                                   before it is added (a GEMM then a sum, bit for bit)
//   Scalar, ScalarOf(t)             a one-element float tensor (a learning rate) as device code
//                                   reads it: Get() gives a double; CPU: read at once
//   Reports                         where kernels record bad input (an id or label out of range)
//                                   for the op's next run to throw; CPU math throws at once
template <typename D>
struct Device;

// Bad input a kernel finds on the device: the first (value, index), written by the device into
// host memory it maps (ops/cuda_util.cuh), read by the host without waiting.
struct DeviceReport {
  int state;  // 0: none; 1: being written; 2: written
  long long value, index;
};

// X@GRAD-style output `slot`@GRAD, or nullptr when nobody wants it (a grad kernel then skips it).
inline Tensor* GradOutput(const ExecutionContext& ctx, const std::string& slot, int i = 0) {
  return ctx.OutputOrNull(GradVarName(slot), i);
}

namespace detail {
// K<D, T> as a template of T alone, for the registry.
template <typename D, template <typename, typename> class K>
struct OnDevice {
  template <typename T>
  using Of = K<D, T>;
};
}  // namespace detail

// ---------------------------------------------------------------- narrowed outputs

// The type a kernel computing in T stores output `slot`'s i-th var in: float16 or bfloat16 where T
// is float32, the op narrows the slot (OpTraits::narrows_outputs) and the program declares the var
// so (transpiler/narrow_grads_pass.h); T otherwise.
template <typename T>
DType StoredDType(const ExecutionContext& ctx, const std::string& slot, int i = 0) {
  if constexpr (std::is_same_v<T, float>) {
    return NarrowedDType(ctx.op(), slot, ctx.DeclaredOutputDType(slot, i, DType::kFloat32),
                         DType::kFloat32);
  }
  return DTypeOf<T>::value;
}

// Whether the op adds output `slot` into the values its var holds (OpTraits::accumulates_outputs,
// selected by the op's attribute accumulate_into).
inline bool AccumulatesInto(const ExecutionContext& ctx, const std::string& slot) {
  // (A program loaded from a file may lack the attribute: nothing accumulates then.)
  if (!OpRegistry::Traits(ctx.op().type()).AccumulatesOutput(slot) ||
      !ctx.op().HasAttr("accumulate_into"))
    return false;
  const auto& slots = ctx.op().Attr<std::vector<std::string>>("accumulate_into");
  for (const std::string& s : slots)
    if (s == slot) return true;
  return false;
}

// The values output `slot`'s tensor `out` holds, which the op adds its M x N result into
// (AccumulatesInto): a keel::Error naming the op and the var where they are not there.
template <typename T>
T* AccumulatedData(const ExecutionContext& ctx, const std::string& slot, Tensor* out, int64_t n) {
  KEEL_ENFORCE(out->initialized() && out->numel() == n && out->dtype() == DTypeOf<T>::value &&
                   out->place() == ctx.place(),
               ctx.op().type(), ": output ", slot, " '", ctx.op().Output(slot)[0],
               "' accumulates (accumulate_into) but holds ",
               out->initialized()
                   ? out->dims().str() + " " + DTypeName(out->dtype()) + " on " + out->place().str()
                   : std::string("nothing"),
               ", not the ", n, " ", DTypeName(DTypeOf<T>::value), " values on ", ctx.place().str(),
               " to add into (run the startup program first)");
  return out->mutable_data<T>(ctx.place());
}

// out = alpha op(A) op(B) over contiguous matrices (Device::Gemm, beta 0), stored into output
// `slot`'s tensor `out` in its StoredDType: a narrowed one gets the float32 result rounded once;
// or, where the op accumulates the slot (AccumulatesInto), out += alpha op(A) op(B) (GemmAdd: the
// product rounded before it is added, as a sum op after the GEMM would add it).
template <typename D, typename T>
void GemmInto(const ExecutionContext& ctx, const std::string& slot, Tensor* out, bool ta, bool tb,
              int64_t M, int64_t N, int64_t K, Acc<T> alpha, const T* A, const T* B) {
  const Place& place = ctx.place();
  if (AccumulatesInto(ctx, slot)) {
    Device<D>::GemmAdd(ctx, ta, tb, M, N, K, alpha, A, B,
                       AccumulatedData<T>(ctx, slot, out, M * N));
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    const DType stored = StoredDType<T>(ctx, slot);
    if (stored == DType::kBFloat16)
      return Device<D>::Gemm(ctx, ta, tb, M, N, K, alpha, A, 0, B, 0, 0.0f,
                             out->mutable_data<bfloat16>(place), 0);
    if (stored == DType::kFloat16)
      return Device<D>::Gemm(ctx, ta, tb, M, N, K, alpha, A, 0, B, 0, 0.0f,
                             out->mutable_data<float16>(place), 0);
  }
  Device<D>::Gemm(ctx, ta, tb, M, N, K, alpha, A, 0, B, 0, Acc<T>(0), out->mutable_data<T>(place),
                  0);
}

// Device::SumBroadcast(ctx, m, out's data, f) into output `slot`'s tensor `out` in its
// StoredDType: the Acc<T> sums rounded once to the stored type; or, where the op accumulates the
// slot (AccumulatesInto), the sums rounded to T and added into out's values, as a sum op after
// the op would add them.
template <typename D, typename T, typename F>
void SumBroadcastInto(const ExecutionContext& ctx, const std::string& slot, Tensor* out,
                      const fn::BroadcastMid& m, const F& f) {
  const Place& place = ctx.place();
  if (AccumulatesInto(ctx, slot)) {
    T* acc = AccumulatedData<T>(ctx, slot, out, m.n);
    Tensor sums;
    T* s = static_cast<T*>(sums.Alloc(DTypeOf<T>::value, DDim{m.n}, place));
    Device<D>::SumBroadcast(ctx, m, s, f);
    Device<D>::ForEach(ctx, m.n, [=] KEEL_HD_LAMBDA(int64_t j) {
      acc[j] = Narrow<T>(Widen(acc[j]) + Widen(s[j]));
    });
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    const DType stored = StoredDType<T>(ctx, slot);
    if (stored == DType::kBFloat16)
      return Device<D>::SumBroadcast(ctx, m, out->mutable_data<bfloat16>(place), f);
    if (stored == DType::kFloat16)
      return Device<D>::SumBroadcast(ctx, m, out->mutable_data<float16>(place), f);
  }
  Device<D>::SumBroadcast(ctx, m, out->mutable_data<T>(place), f);
}

// ---------------------------------------------------------------- fronts several families use

// Makes `out` the input `from`'s buffer in out's own shape (set by shape inference) and returns
// true, where the executor lets output `slot` share it (OpTraits::may_share); false otherwise,
// when the kernel copies.
inline bool ShareInput(const ExecutionContext& ctx, const std::string& slot, const Tensor& from,
                       Tensor* out) {
  if (!ctx.MayShare(slot) || from.numel() != out->numel()) return false;
  const DDim dims = out->dims();
  out->ShareDataWith(from);
  out->Resize(dims);
  return true;
}

// Out = X's elements in Out's shape (reshape, flatten, squeeze, unsqueeze, assign): X's own buffer
// where the executor allows it (ShareInput), else a copy, none when they share memory. Copying
// keeps Out's allocation (maybe a view into a fused buffer) in place.
template <typename D, typename T>
class CopyKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    Tensor* out = ctx.Output("Out");
    KEEL_ENFORCE(x.numel() == out->numel(), "cannot copy ", x.dims().str(), " into ",
                 out->dims().str());
    if (ShareInput(ctx, "Out", x, out)) return;
    Device<D>::Copy(ctx, x.data<T>(), out->mutable_data<T>(ctx.place()), x.numel());
  }
};

// X@GRAD = Out@GRAD's elements in X's shape.
template <typename D, typename T>
class CopyGradKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "X");
    if (dx == nullptr) return;
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    KEEL_ENFORCE(dout.numel() == dx->numel(), "cannot copy ", dout.dims().str(), " into ",
                 dx->dims().str());
    if (ShareInput(ctx, GradVarName("X"), dout, dx)) return;
    Device<D>::Copy(ctx, dout.data<T>(), dx->mutable_data<T>(ctx.place()), dout.numel());
  }
};

}  // namespace keel

// KEEL_REGISTER_KERNEL(CPU, mean, MeanKernel, float, double): MeanKernel<CPUDevice, T> for each
// listed T, for CPU places (CUDA: MeanKernel<CUDADevice, T>, for CUDA places).
#define KEEL_REGISTER_KERNEL(device, type, kernel, ...)                                           \
  [[maybe_unused]] static bool KEEL_CONCAT(keel_kernel_, type) = ::keel::detail::RegisterKernels< \
      ::keel::detail::OnDevice<::keel::device##Device, kernel>::Of, __VA_ARGS__>(                 \
      #type, ::keel::device##Device::kPlace)
