// CUDA twins of nn_ops.cc's dropout and layer_norm (pool2d and batch_norm go through cuDNN
// elsewhere). Dropout draws its mask from the same Philox blocks as the CPU kernel
// (fn::DropoutBlock): same seed and run, same mask, on any place.
#include "ops/cuda_util.cuh"
#include "ops/functors/philox.h"

namespace keel {
namespace {

// ------------------------------------------------------------------------------------ dropout

struct DropoutAttrs {
  explicit DropoutAttrs(const OpDesc& op)
      : p(op.Attr<float>("dropout_prob")),
        is_test(op.Attr<bool>("is_test")),
        fix_seed(op.Attr<bool>("fix_seed")),
        upscale(op.Attr<std::string>("dropout_implementation") == "upscale_in_train") {}
  double TrainScale() const { return !upscale ? 1.0 : p >= 1.0f ? 0.0 : 1.0 / (1.0 - p); }
  double TestScale() const { return upscale ? 1.0 : 1.0 - p; }
  float p;
  bool is_test, fix_seed, upscale;
};

// One thread per Philox block of four elements: Mask = (draw >= threshold), Out = X * Mask * s.
// The Philox offset is `offset`, or *device_offset when set (a CUDA graph replays this launch's
// arguments; the run index it reads from device memory changes every replay).
template <typename T>
__global__ void DropoutBlocks(const T* x, T* out, uint8_t* mask, int64_t n, uint64_t seed,
                              uint64_t offset, const int64_t* device_offset, uint64_t threshold,
                              T s) {
  if (device_offset) offset = static_cast<uint64_t>(*device_offset);
  const int64_t blocks = (n + 3) / 4;
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < blocks;
       b += int64_t(blockDim.x) * gridDim.x) {
    const fn::Philox4 r = fn::DropoutBlock(seed, offset, static_cast<uint64_t>(b));
    for (int k = 0; k < 4 && 4 * b + k < n; ++k) {
      const int64_t i = 4 * b + k;
      const bool keep = r.v[k] >= threshold;
      mask[i] = keep;
      out[i] = fn::DropoutApply(keep, x[i], s);
    }
  }
}

template <typename T>
class DropoutKernel : public OpKernel {
 public:
  explicit DropoutKernel(const OpDesc& op) : a_(op) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const int64_t n = x.numel();
    const T* xd = x.data<T>();
    T* od = ctx.Output("Out")->mutable_data<T>(ctx.place());
    if (a_.is_test) {
      const T s = static_cast<T>(a_.TestScale());
      ForEach(ctx, n, [=] __device__(int64_t i) { od[i] = xd[i] * s; });
      return;
    }
    const uint64_t offset = a_.fix_seed ? 0 : static_cast<uint64_t>(ctx.run_index());
    uint8_t* mask = ctx.Output("Mask")->mutable_data<uint8_t>(ctx.place());
    if (n == 0) return;
    DropoutBlocks<T><<<GridFor((n + 3) / 4), 256, 0, Cuda(ctx).stream()>>>(
        xd, od, mask, n, ctx.seed(), offset, a_.fix_seed ? nullptr : ctx.device_run_index(),
        fn::DropoutThreshold(a_.p),
        static_cast<T>(a_.TrainScale()));
    KEEL_CUDA_LAUNCH_CHECK();
  }

 private:
  DropoutAttrs a_;
};

// dx = dout * Mask * TrainScale; is_test: dx = dout * TestScale.
template <typename T>
class DropoutGradKernel : public OpKernel {
 public:
  explicit DropoutGradKernel(const OpDesc& op) : a_(op) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    if (dx == nullptr) return;
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    const int64_t n = dout.numel();
    const T* gd = dout.data<T>();
    T* dxd = dx->mutable_data<T>(ctx.place());
    if (a_.is_test) {
      const T s = static_cast<T>(a_.TestScale());
      ForEach(ctx, n, [=] __device__(int64_t i) { dxd[i] = gd[i] * s; });
      return;
    }
    const Tensor& mask = ctx.Input("Mask");
    KEEL_ENFORCE(mask.numel() == n, "Mask ", mask.dims(), " and Out@GRAD ", dout.dims(),
                 " differ in size");
    const uint8_t* md = mask.data<uint8_t>();
    const T s = static_cast<T>(a_.TrainScale());
    ForEach(ctx, n, [=] __device__(int64_t i) { dxd[i] = fn::DropoutApply(md[i] != 0, gd[i], s); });
  }

 private:
  DropoutAttrs a_;
};

// --------------------------------------------------------------------------------- layer_norm

// One block per row of R elements: mean, biased variance (two passes), then
// Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias.
template <typename T>
__global__ void LayerNormRows(const T* x, const T* scale, const T* bias, T* y, T* mean, T* var,
                              int64_t R, T eps) {
  const int64_t i = blockIdx.x;
  const T* xr = x + i * R;
  T s = 0;
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) s += xr[j];
  const T mu = BlockSum(s) / static_cast<T>(R);
  T q = 0;
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) q += (xr[j] - mu) * (xr[j] - mu);
  const T v = BlockSum(q) / static_cast<T>(R);
  if (threadIdx.x == 0) {
    mean[i] = mu;
    var[i] = v;
  }
  const T inv_std = T(1) / fn::Sqrt(v + eps);
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) {
    T o = (xr[j] - mu) * inv_std;
    if (scale) o *= scale[j];
    if (bias) o += bias[j];
    y[i * R + j] = o;
  }
}

// One block per row, with xhat = (x - mean) * inv_std and g = dy * Scale:
//   dx = inv_std * (g - mean(g) - xhat * mean(g * xhat))
template <typename T>
__global__ void LayerNormGradRows(const T* x, const T* dy, const T* scale, const T* mean,
                                  const T* var, T* dx, int64_t R, T eps) {
  const int64_t i = blockIdx.x;
  const T* xr = x + i * R;
  const T* gr = dy + i * R;
  const T mu = mean[i];
  const T inv_std = T(1) / fn::Sqrt(var[i] + eps);
  T sg = 0, sgx = 0;
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) {
    const T g = scale ? gr[j] * scale[j] : gr[j];
    sg += g;
    sgx += g * (xr[j] - mu) * inv_std;
  }
  const T mean_g = BlockSum(sg) / static_cast<T>(R);
  const T mean_gx = BlockSum(sgx) / static_cast<T>(R);
  for (int64_t j = threadIdx.x; j < R; j += blockDim.x) {
    const T g = scale ? gr[j] * scale[j] : gr[j];
    const T xhat = (xr[j] - mu) * inv_std;
    dx[i * R + j] = inv_std * (g - mean_g - xhat * mean_gx);
  }
}

// dScale[j] = sum over rows of dy * xhat, dBias[j] = sum over rows of dy: one thread per column,
// rows summed in order (deterministic).
template <typename T>
__global__ void LayerNormParamGrads(const T* x, const T* dy, const T* mean, const T* var, T* dscale,
                                    T* dbias, int64_t rows, int64_t R, T eps) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < R;
       j += int64_t(blockDim.x) * gridDim.x) {
    T ds = 0, db = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const T g = dy[i * R + j];
      ds += g * (x[i * R + j] - mean[i]) * (T(1) / fn::Sqrt(var[i] + eps));
      db += g;
    }
    if (dscale) dscale[j] = ds;
    if (dbias) dbias[j] = db;
  }
}

inline int RowThreads(int64_t n) { return n >= 256 ? 256 : n > 64 ? 128 : 32; }

template <typename T>
class LayerNormKernel : public OpKernel {
 public:
  explicit LayerNormKernel(const OpDesc& op)
      : axis_(op.Attr<int>("begin_norm_axis")), epsilon_(op.Attr<float>("epsilon")) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const int64_t rows = x.dims().prod(0, axis_), R = x.dims().prod(axis_, x.dims().size());
    const Tensor* scale = ctx.InputOrNull("Scale");
    const Tensor* bias = ctx.InputOrNull("Bias");
    T* yd = ctx.Output("Y")->mutable_data<T>(ctx.place());
    T* mean = ctx.Output("Mean")->mutable_data<T>(ctx.place());
    T* var = ctx.Output("Variance")->mutable_data<T>(ctx.place());
    if (rows == 0 || R == 0) return;
    KEEL_ENFORCE(rows < (int64_t(1) << 31), "layer_norm: ", rows, " rows exceed the grid");
    LayerNormRows<T><<<rows, RowThreads(R), 0, Cuda(ctx).stream()>>>(
        x.data<T>(), scale ? scale->data<T>() : nullptr, bias ? bias->data<T>() : nullptr, yd, mean,
        var, R, static_cast<T>(epsilon_));
    KEEL_CUDA_LAUNCH_CHECK();
  }

 private:
  int axis_;
  float epsilon_;
};

template <typename T>
class LayerNormGradKernel : public OpKernel {
 public:
  explicit LayerNormGradKernel(const OpDesc& op)
      : axis_(op.Attr<int>("begin_norm_axis")), epsilon_(op.Attr<float>("epsilon")) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = ctx.OutputOrNull(GradVarName("X"));
    Tensor* dscale = ctx.OutputOrNull(GradVarName("Scale"));
    Tensor* dbias = ctx.OutputOrNull(GradVarName("Bias"));
    const Tensor& x = ctx.Input("X");
    const Tensor& dy = ctx.Input(GradVarName("Y"));
    KEEL_ENFORCE(dy.dims() == x.dims(), "Y@GRAD ", dy.dims(), " must have X's shape ", x.dims());
    const int64_t rows = x.dims().prod(0, axis_), R = x.dims().prod(axis_, x.dims().size());
    const Tensor* scale = ctx.InputOrNull("Scale");
    const T* mean = ctx.Input("Mean").data<T>();
    const T* var = ctx.Input("Variance").data<T>();
    const T eps = static_cast<T>(epsilon_);
    T* dsd = dscale ? dscale->mutable_data<T>(ctx.place()) : nullptr;
    T* dbd = dbias ? dbias->mutable_data<T>(ctx.place()) : nullptr;
    T* dxd = dx ? dx->mutable_data<T>(ctx.place()) : nullptr;
    if (R == 0) return;
    if (dsd || dbd) {
      LayerNormParamGrads<T><<<GridFor(R), 256, 0, Cuda(ctx).stream()>>>(
          x.data<T>(), dy.data<T>(), mean, var, dsd, dbd, rows, R, eps);
      KEEL_CUDA_LAUNCH_CHECK();
    }
    if (dxd && rows > 0) {
      LayerNormGradRows<T><<<rows, RowThreads(R), 0, Cuda(ctx).stream()>>>(
          x.data<T>(), dy.data<T>(), scale ? scale->data<T>() : nullptr, mean, var, dxd, R, eps);
      KEEL_CUDA_LAUNCH_CHECK();
    }
  }

 private:
  int axis_;
  float epsilon_;
};

}  // namespace

KEEL_REGISTER_CUDA_KERNEL(dropout, DropoutKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(dropout_grad, DropoutGradKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(layer_norm, LayerNormKernel, float, double);
KEEL_REGISTER_CUDA_KERNEL(layer_norm_grad, LayerNormGradKernel, float, double);

}  // namespace keel
