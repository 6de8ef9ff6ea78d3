// The kernel of coalesce_tensor (fuse_ops.cc has the op and its shape), once for every device
// (ops/device.h): FusedOutput is one allocation of the op's place and every Output becomes a view
// of its slice. Fills and copies run on the device (on CUDA, on the compute stream).
#pragma once

#include <cstdint>
#include <vector>

#include "ops/device.h"

namespace keel {

// The buffer's length: the inputs' elements, rounded up to a multiple of `multiple` (the tail is
// padding that no input covers, e.g. for a reduce-scatter over that many ranks).
inline int64_t CoalescedLength(const std::vector<int64_t>& numels, int64_t multiple) {
  int64_t t = 0;
  for (int64_t n : numels) t += n;
  return multiple > 1 ? (t + multiple - 1) / multiple * multiple : t;
}

// The device math:
//   CopyIn(ctx, i, in, slot, bytes)  copies Input[i] into its slot of the buffer; it may already
//                                    lie in the buffer, overlapping the slot
template <typename D>
struct CoalesceMath;

template <typename D>
class CoalesceKernel : public OpKernel {
 public:
  explicit CoalesceKernel(const OpDesc& op)
      : numels_(op.Attr<std::vector<int64_t>>("numels")),
        dtype_(static_cast<DType>(op.Attr<int>("dtype"))),
        copy_data_(op.Attr<bool>("copy_data")),
        set_constant_(op.Attr<bool>("set_constant")),
        constant_(op.Attr<float>("constant")),
        multiple_(op.Attr<int>("pad_to_multiple")) {}

  void Compute(ExecutionContext& ctx) override {
    Tensor* fused = ctx.Output("FusedOutput");
    fused->Resize(DDim{CoalescedLength(numels_, multiple_)});
    char* base = static_cast<char*>(fused->mutable_data(dtype_, ctx.place()));
    const size_t esize = SizeOf(dtype_);
    if (set_constant_ && dtype_ == DType::kBFloat16) {
      Device<D>::Fill(ctx, reinterpret_cast<bfloat16*>(base), fused->numel(), bfloat16(constant_));
    } else if (set_constant_ && dtype_ == DType::kFloat16) {
      Device<D>::Fill(ctx, reinterpret_cast<float16*>(base), fused->numel(), float16(constant_));
    } else if (set_constant_) {
      VisitDType(dtype_, [&](auto v) {
        using T = decltype(v);
        Device<D>::Fill(ctx, reinterpret_cast<T*>(base), fused->numel(), static_cast<T>(constant_));
      });
    }
    int64_t covered = 0;
    for (int64_t n : numels_) covered += n;
    if (fused->numel() > covered && !set_constant_)  // the padding holds zeros
      Device<D>::Zero(ctx, base + covered * esize, (fused->numel() - covered) * esize);
    int64_t offset = 0;
    for (size_t i = 0; i < numels_.size(); ++i) {
      Tensor* out = ctx.Output("Output", static_cast<int>(i));
      if (copy_data_) {
        const Tensor& in = ctx.Input("Input", static_cast<int>(i));
        KEEL_ENFORCE(in.initialized() && in.numel() == numels_[i] && in.dtype() == dtype_,
                     "copy_data: Input[", i, "] '", ctx.op().Input("Input")[i], "' holds ",
                     in.initialized() ? in.dims().str() : "nothing", ", expected ", numels_[i],
                     " elements of ", DTypeName(dtype_));
        CoalesceMath<D>::CopyIn(ctx, i, in, base + offset * esize, numels_[i] * esize);
      }
      // A view of the slice; it keeps the var's own shape once it has one.
      const DDim dims =
          out->initialized() && out->dims().known() && out->dims().numel() == numels_[i]
              ? out->dims()
              : DDim{numels_[i]};
      *out = fused->Slice(offset, offset + numels_[i]);
      out->Resize(dims);
      offset += numels_[i];
    }
  }

 private:
  std::vector<int64_t> numels_;
  DType dtype_;
  bool copy_data_, set_constant_;
  float constant_;
  int multiple_;
};

// The registry wants a kernel per dtype; the dtype is attr `dtype`.
template <typename D, typename T>
class CoalesceKernelT : public CoalesceKernel<D> {
 public:
  using CoalesceKernel<D>::CoalesceKernel;
};

}  // namespace keel
