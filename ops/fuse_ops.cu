// CUDA twin of fuse_ops.cc's coalesce_tensor: FusedOutput is one device allocation and every
// Output becomes a view of its slice (the host fallback cannot do this: it would copy results
// back into each var's own allocation, and the views would be lost). Fills and copies run on
// the compute stream.
#include <vector>

#include "ops/cuda_util.cuh"

namespace keel {
namespace {

int64_t Total(const std::vector<int64_t>& numels, int64_t multiple) {
  int64_t t = 0;
  for (int64_t n : numels) t += n;
  return multiple > 1 ? (t + multiple - 1) / multiple * multiple : t;
}

template <typename T>
void Fill(const ExecutionContext& ctx, void* base, int64_t n, float value) {
  T* p = static_cast<T*>(base);
  const T v = static_cast<T>(value);
  ForEach(ctx, n, [=] __device__(int64_t i) { p[i] = v; });
}

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
    fused->Resize(DDim{Total(numels_, multiple_)});
    char* base = static_cast<char*>(fused->mutable_data(dtype_, ctx.place()));
    const size_t esize = SizeOf(dtype_);
    cudaStream_t stream = Cuda(ctx).stream();
    if (set_constant_) {
      switch (dtype_) {
        case DType::kFloat32:
          Fill<float>(ctx, base, fused->numel(), constant_);
          break;
        case DType::kFloat64:
          Fill<double>(ctx, base, fused->numel(), constant_);
          break;
        case DType::kInt32:
          Fill<int32_t>(ctx, base, fused->numel(), constant_);
          break;
        case DType::kInt64:
          Fill<int64_t>(ctx, base, fused->numel(), constant_);
          break;
        default:
          KEEL_THROW("coalesce_tensor: set_constant is not supported for ", DTypeName(dtype_));
      }
    }
    int64_t covered = 0;
    for (int64_t n : numels_) covered += n;
    if (fused->numel() > covered && !set_constant_)  // the padding holds zeros
      KEEL_CUDA_CHECK(
          cudaMemsetAsync(base + covered * esize, 0, (fused->numel() - covered) * esize, stream));
    int64_t offset = 0;
    for (size_t i = 0; i < numels_.size(); ++i) {
      Tensor* out = ctx.Output("Output", static_cast<int>(i));
      char* slot = base + offset * esize;
      const size_t bytes = numels_[i] * esize;
      if (copy_data_) {
        const Tensor& in = ctx.Input("Input", static_cast<int>(i));
        KEEL_ENFORCE(in.initialized() && in.numel() == numels_[i] && in.dtype() == dtype_,
                     "copy_data: Input[", i, "] '", ctx.op().Input("Input")[i], "' holds ",
                     in.initialized() ? in.dims().str() : "nothing", ", expected ", numels_[i],
                     " elements of ", DTypeName(dtype_));
        KEEL_ENFORCE(in.place() == ctx.place(), "copy_data: Input[", i, "] '",
                     ctx.op().Input("Input")[i], "' is on ", in.place().str(), ", not ",
                     ctx.place().str());
        const char* src = static_cast<const char*>(in.raw_data());
        if (src != slot) {
          // An input that already lies in this buffer at another offset overlaps its slot:
          // stage it through a temporary (a device copy between overlapping ranges is undefined).
          const bool overlaps = src < slot + bytes && slot < src + bytes;
          if (overlaps) {
            Tensor tmp = in.Clone();
            KEEL_CUDA_CHECK(
                cudaMemcpyAsync(slot, tmp.raw_data(), bytes, cudaMemcpyDeviceToDevice, stream));
          } else {
            KEEL_CUDA_CHECK(cudaMemcpyAsync(slot, src, bytes, cudaMemcpyDeviceToDevice, stream));
          }
        }
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

template <typename T>
class CoalesceKernelT : public CoalesceKernel {
 public:
  using CoalesceKernel::CoalesceKernel;
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(coalesce_tensor, CoalesceKernelT, float, double, int32_t, int64_t);

}  // namespace keel
