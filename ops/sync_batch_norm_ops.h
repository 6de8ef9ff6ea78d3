// sync_batch_norm's kernels, once for both devices: batch_norm's kernels (batch_norm_ops.h) whose
// device math is told, before each training run, which ring to sum its statistics over
// (sync_batch_norm_ops.cc has the op, its formulas and the CPU registration; batch_norm_ops.cu the
// CUDA math and registration).
#pragma once

#include <type_traits>

#include "framework/op/execution_context.h"
#include "framework/runtime/tensor.h"
#include "ops/batch_norm_ops.h"

namespace keel {

class Communicator;

// The ring the op of `ctx` sums its training statistics over, or nullptr when there is none (no
// ring ring_id in a job of one rank). With no ring, or a ring of one rank, the op runs alone: the
// sums are this rank's. A keel::Error naming the op when the job has several ranks but no such
// ring, or when the ring serves the other kind of tensors than the op's place (`cuda`).
Communicator* SyncBatchNormRing(const ExecutionContext& ctx, int ring_id, bool cuda);

// The CPU math's cross-rank sum over `ring` (nullptr or one rank: nothing to add), through
// `buffer`, a CPU tensor the ring reduces.
BatchNormSync SumOverRing(const ExecutionContext& ctx, Communicator* ring, Tensor* buffer);

// For the CUDA math (C++ here: the ring's classes stay out of CUDA objects): the CUDA stream (a
// cudaStream_t) of `ring`'s collectives, nullptr for none; and `sums`, a tensor on the op's
// place, summed over `ring` in place as the op's collective (nothing for nullptr or one rank).
void* SyncBatchNormStream(Communicator* ring);
void SumOnDevice(const ExecutionContext& ctx, Communicator* ring, Tensor* sums);

// batch_norm's forward or grad kernel (Base) with training's sums taken over ring ring_id. The CPU
// math takes the sum as a function of host values; the CUDA math takes the ring and sums on the
// device.
template <template <typename, typename> class Base>
struct Synced {
  template <typename D, typename T>
  class Kernel : public Base<D, T> {
   public:
    explicit Kernel(const OpDesc& op)
        : Base<D, T>(op), ring_id_(op.Attr<int>("ring_id")), fixed_(HasFixedStats(op)) {}
    void Compute(ExecutionContext& ctx) override {
      if (!fixed_) {
        constexpr bool kCuda = !std::is_same_v<D, CPUDevice>;
        Communicator* ring = SyncBatchNormRing(ctx, ring_id_, kCuda);
        if constexpr (kCuda)
          this->math_.set_sync(ring);
        else
          this->math_.set_sync(SumOverRing(ctx, ring, &buffer_));
      }
      Base<D, T>::Compute(ctx);
    }

   private:
    int ring_id_;
    bool fixed_;
    Tensor buffer_;  // CPU: the 2C + 1 sums the ring reduces
  };
};

}  // namespace keel
