// The kernels of dropout (dropout_ops.cc has the op and its shape), forward and grad, once for
// every device (ops/device.h), the math itself included: the mask comes from Philox4x32-10 blocks
// (fn::DropoutBlock, ops/functors/philox.h) keyed by the op's seed, so the same seed and run draw
// the same mask on any place.
#pragma once

#include <cstdint>
#include <string>

#include "ops/device.h"
#include "ops/functors/philox.h"

namespace keel {

struct DropoutAttrs {
  explicit DropoutAttrs(const OpDesc& op)
      : p(op.Attr<float>("dropout_prob")),
        is_test(op.Attr<bool>("is_test")),
        fix_seed(op.Attr<bool>("fix_seed")),
        upscale(op.Attr<std::string>("dropout_implementation") == "upscale_in_train") {}
  // The factor on kept values in training: 1 / (1 - p) when upscaling (0 when all drop).
  double TrainScale() const { return !upscale ? 1.0 : p >= 1.0f ? 0.0 : 1.0 / (1.0 - p); }
  // The factor on every value at test time.
  double TestScale() const { return upscale ? 1.0 : 1.0 - p; }
  float p;
  bool is_test, fix_seed, upscale;
};

// Training: Mask = (u >= p) for a uniform 32-bit draw u per element, Out = X * Mask * TrainScale.
// is_test: Out = X * TestScale and Mask is left unwritten. The draws are keyed by ctx.seed() (the
// executor resolves attr seed, else the program's random_seed, else a random one) with the
// executor's run index as counter (restored on resume, so a resumed run draws the masks of the
// uninterrupted run); with fix_seed every run uses counter 0, the same mask each run (Paddle
// 1.x's fix_seed). A CUDA graph replays a launch's arguments, so a captured step reads the run
// index from device memory (ctx.device_run_index()). With ReplayMask (recompute's replay of a
// forward dropout) Out = X * ReplayMask * TrainScale and nothing is drawn.
template <typename D, typename T>
class DropoutKernel : public OpKernel {
 public:
  explicit DropoutKernel(const OpDesc& op) : a_(op) {}
  void Compute(ExecutionContext& ctx) override {
    const Tensor& x = ctx.Input("X");
    const int64_t n = x.numel();
    const T* xd = x.data<T>();
    T* od = ctx.Output("Out")->mutable_data<T>(ctx.place());
    if (a_.is_test) {
      const Acc<T> s = static_cast<Acc<T>>(a_.TestScale());
      Device<D>::ForEach(ctx, n,
                         [=] KEEL_HD_LAMBDA(int64_t i) { od[i] = Narrow<T>(Widen(xd[i]) * s); });
      return;
    }
    if (const Tensor* replay = ctx.InputOrNull("ReplayMask")) {
      // Recompute: Out from the mask the forward drew, nothing drawn.
      KEEL_ENFORCE(replay->numel() == n, "ReplayMask ", replay->dims(), " and X ", x.dims(),
                   " differ in size");
      const uint8_t* md = replay->data<uint8_t>();
      const Acc<T> s = static_cast<Acc<T>>(a_.TrainScale());
      Device<D>::ForEach(ctx, n, [=] KEEL_HD_LAMBDA(int64_t i) {
        od[i] = Narrow<T>(fn::DropoutApply(md[i] != 0, Widen(xd[i]), s));
      });
      return;
    }
    const uint64_t seed = ctx.seed();
    const uint64_t host_offset = a_.fix_seed ? 0 : static_cast<uint64_t>(ctx.run_index());
    const int64_t* device_offset =
        a_.fix_seed || D::kPlace != Place::Kind::kCUDA ? nullptr : ctx.device_run_index();
    uint8_t* mask = ctx.Output("Mask")->mutable_data<uint8_t>(ctx.place());
    const uint64_t threshold = fn::DropoutThreshold(a_.p);
    const Acc<T> s = static_cast<Acc<T>>(a_.TrainScale());
    // One Philox block serves four elements.
    Device<D>::ForEach(ctx, (n + 3) / 4, [=] KEEL_HD_LAMBDA(int64_t b) {
      const uint64_t offset = device_offset ? static_cast<uint64_t>(*device_offset) : host_offset;
      const fn::Philox4 r = fn::DropoutBlock(seed, offset, static_cast<uint64_t>(b));
      for (int k = 0; k < 4 && 4 * b + k < n; ++k) {
        const int64_t i = 4 * b + k;
        const bool keep = r.v[k] >= threshold;
        mask[i] = keep;
        od[i] = Narrow<T>(fn::DropoutApply(keep, Widen(xd[i]), s));
      }
    });
  }

 private:
  DropoutAttrs a_;
};

// dx = dout * Mask * TrainScale; is_test: dx = dout * TestScale.
template <typename D, typename T>
class DropoutGradKernel : public OpKernel {
 public:
  explicit DropoutGradKernel(const OpDesc& op) : a_(op) {}
  void Compute(ExecutionContext& ctx) override {
    Tensor* dx = GradOutput(ctx, "X");
    if (dx == nullptr) return;
    const Tensor& dout = ctx.Input(GradVarName("Out"));
    const int64_t n = dout.numel();
    const T* gd = dout.data<T>();
    T* dxd = dx->mutable_data<T>(ctx.place());
    if (a_.is_test) {
      const Acc<T> s = static_cast<Acc<T>>(a_.TestScale());
      Device<D>::ForEach(ctx, n,
                         [=] KEEL_HD_LAMBDA(int64_t i) { dxd[i] = Narrow<T>(Widen(gd[i]) * s); });
      return;
    }
    const Tensor& mask = ctx.Input("Mask");
    KEEL_ENFORCE(mask.numel() == n, "Mask ", mask.dims(), " and Out@GRAD ", dout.dims(),
                 " differ in size");
    const uint8_t* md = mask.data<uint8_t>();
    const Acc<T> s = static_cast<Acc<T>>(a_.TrainScale());
    Device<D>::ForEach(ctx, n, [=] KEEL_HD_LAMBDA(int64_t i) {
      dxd[i] = Narrow<T>(fn::DropoutApply(md[i] != 0, Widen(gd[i]), s));
    });
  }

 private:
  DropoutAttrs a_;
};

}  // namespace keel
