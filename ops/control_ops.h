// The kernels of the control-flow ops (control_ops.cc has the ops and their shapes):
// conditional_block, the comparisons and the logical ops, once for every device (ops/device.h).
// The comparisons are ops/functors/compare_functors.h.
#pragma once

#include "framework/runtime/allocator.h"
#include "ops/device.h"
#include "ops/functors/compare_functors.h"

namespace keel {

// Runs the sub-block when Cond holds. Whether to run a block is a host decision: on CUDA this op
// waits for the device to copy the one-byte condition back.
template <typename D, typename T>
class ConditionalBlockKernel : public OpKernel {
 public:
  explicit ConditionalBlockKernel(const OpDesc& op) : block_(op.Attr<BlockRef>("sub_block").idx) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& cond = ctx.Input("Cond");
    KEEL_ENFORCE(cond.numel() == 1, "Cond must hold one element, got ", cond.dims());
    bool run = false;
    MemCopy(CPUPlace(), &run, cond.place(), cond.raw_data(), sizeof(bool));
    if (run) ctx.RunBlock(block_);
  }

 private:
  int block_;
};

// Out = Cmp(X, Y) with Y of X's shape or of one element.
template <typename Cmp>
struct CompareOp {
  template <typename D, typename T>
  class Kernel : public OpKernel {
   public:
    void Compute(ExecutionContext& ctx) override {
      const Tensor& x = ctx.Input("X");
      const Tensor& y = ctx.Input("Y");
      const T* a = x.data<T>();
      const T* b = y.data<T>();
      bool* o = ctx.Output("Out")->mutable_data<bool>(ctx.place());
      const int64_t n = x.numel();
      const bool scalar_y = y.numel() == 1 && n != 1;
      KEEL_ENFORCE(scalar_y || y.numel() == n, "Y ", y.dims(), " must have X's shape ", x.dims(),
                   " or hold one element");
      const Cmp f;
      Device<D>::ForEach(ctx, n,
                         [=] KEEL_HD_LAMBDA(int64_t i) { o[i] = f(a[i], b[scalar_y ? 0 : i]); });
    }
  };
};

// Out = X && Y (kAnd) or X || Y, over bools of one shape.
template <bool kAnd>
struct LogicalOp {
  template <typename D, typename T>
  class Kernel : public OpKernel {
   public:
    void Compute(ExecutionContext& ctx) override {
      const bool* a = ctx.Input("X").data<bool>();
      const bool* b = ctx.Input("Y").data<bool>();
      Tensor* out = ctx.Output("Out");
      bool* o = out->mutable_data<bool>(ctx.place());
      const fn::Logical<kAnd> f;
      Device<D>::ForEach(ctx, out->numel(),
                         [=] KEEL_HD_LAMBDA(int64_t i) { o[i] = f(a[i], b[i]); });
    }
  };
};

}  // namespace keel
