// CUDA twins of control_ops.cc: the comparisons and logical ops (fn:: functors shared with the
// CPU kernels), assign, and conditional_block, whose condition comes to the host: deciding
// whether to run a block is a host decision, so that one op waits for the device (a one-byte
// copy); the block's ops then run on the device as usual.
#include "framework/runtime/allocator.h"
#include "ops/cuda_util.cuh"
#include "ops/functors/compare_functors.h"

namespace keel {
namespace {

template <typename T>
class ConditionalBlockKernel : public OpKernel {
 public:
  explicit ConditionalBlockKernel(const OpDesc& op) : block_(op.Attr<BlockRef>("sub_block").idx) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& cond = ctx.Input("Cond");
    KEEL_ENFORCE(cond.numel() == 1, "Cond must hold one element, got ", cond.dims());
    bool run = false;
    MemCopy(CPUPlace(), &run, cond.place(), cond.raw_data(), sizeof(bool));  // waits
    if (run) ctx.RunBlock(block_);
  }

 private:
  int block_;
};

// Out = Cmp(X, Y) with Y of X's shape or of one element.
template <typename Cmp>
struct CompareOp {
  template <typename T>
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
      ForEach(ctx, n, [=] __device__(int64_t i) { o[i] = f(a[i], b[scalar_y ? 0 : i]); });
    }
  };
};

template <bool kAnd>
struct LogicalOp {
  template <typename T>
  class Kernel : public OpKernel {
   public:
    void Compute(ExecutionContext& ctx) override {
      const bool* a = ctx.Input("X").data<bool>();
      const bool* b = ctx.Input("Y").data<bool>();
      Tensor* out = ctx.Output("Out");
      bool* o = out->mutable_data<bool>(ctx.place());
      const fn::Logical<kAnd> f;
      ForEach(ctx, out->numel(), [=] __device__(int64_t i) { o[i] = f(a[i], b[i]); });
    }
  };
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(conditional_block, ConditionalBlockKernel, bool);
KEEL_REGISTER_CUDA_KERNEL(less_than, CompareOp<fn::LessThan>::Kernel, float, double, int32_t,
                          int64_t);
KEEL_REGISTER_CUDA_KERNEL(less_equal, CompareOp<fn::LessEqual>::Kernel, float, double, int32_t,
                          int64_t);
KEEL_REGISTER_CUDA_KERNEL(greater_than, CompareOp<fn::GreaterThan>::Kernel, float, double, int32_t,
                          int64_t);
KEEL_REGISTER_CUDA_KERNEL(greater_equal, CompareOp<fn::GreaterEqual>::Kernel, float, double,
                          int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(equal, CompareOp<fn::Equal>::Kernel, float, double, int32_t, int64_t);
KEEL_REGISTER_CUDA_KERNEL(not_equal, CompareOp<fn::NotEqual>::Kernel, float, double, int32_t,
                          int64_t);
KEEL_REGISTER_CUDA_KERNEL(logical_and, LogicalOp<true>::Kernel, bool);
KEEL_REGISTER_CUDA_KERNEL(logical_or, LogicalOp<false>::Kernel, bool);
KEEL_REGISTER_CUDA_KERNEL(assign, CudaCopyKernel, float, double, int32_t, int64_t, bool);

}  // namespace keel
