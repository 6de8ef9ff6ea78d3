// sync_batch_norm (Paddle's name, batch_norm's slots and attrs plus ring_id) and its grad:
// batch_norm whose training statistics are those of the batch of every rank of ring ring_id
// together (docs/sync-batch-norm.md). The math is batch_norm's CPU math (batch_norm_cpu.h) with
// its cross-rank hook (BatchNormSync) set to a sum over the ring; here are the registrations and
// how the kernels reach the ring.
//
// Legend: N = this rank's batch, C = channels, S = the spatial size per channel, m = N * S,
// M = the sum of m over the ranks (the global batch's values per channel).
//
// Forward (training): one all-reduce of [sum(x) (C), sum(x^2) (C), m] over the ring; mean =
//   sum(x) / M and the biased var = sum(x^2) / M - mean^2 normalize, as batch_norm's do for a
//   batch of M values; MeanOut = momentum * Mean + (1 - momentum) * mean, VarianceOut = momentum
//   * Variance + (1 - momentum) * var * M / (M - 1) (unbiased, as PyTorch's SyncBatchNorm; M = 1
//   keeps var). Every rank weighs its values by its count, so unequal per-rank batches give the
//   global batch's statistics exactly (Paddle's kernel averages the per-rank means instead).
// Grad (training): dScale = sum(dy * xhat) and dBias = sum(dy) over this rank's values (the
//   data-parallel all-reduce of parameter gradients adds the ranks' up); then one all-reduce of
//   [sum(dy) (C), sum(dy * (x - mean)) (C), m], and dX is batch_norm's formula with those global
//   sums and M.
// is_test or use_global_stats: batch_norm exactly; no collective and no ring needed.
// No ring ring_id in a process that is alone in its job (no fleet::init, or one rank), or a ring
//   of one rank: the sums are this rank's; the result is batch_norm's but for the unbiased moving
//   variance, so one process and N ranks follow one formula.
#include <cstring>
#include <string>

#include "framework/comm/comm_context.h"
#include "framework/comm/communicator.h"
#include "framework/op/op_registry.h"
#include "ops/batch_norm_cpu.h"
#include "ops/collective_op_call.h"
#include "ops/sync_batch_norm_ops.h"

namespace keel {

Communicator* SyncBatchNormRing(const ExecutionContext& ctx, int ring_id, bool cuda) {
  const std::string& type = ctx.op().type();
  if (!RingRegistry::Get().Has(ring_id)) {
    const CommContext& comm = CommContext::Get();
    const int nranks = comm.initialized() ? comm.config().nranks : 1;
    KEEL_ENFORCE(nranks == 1, "op ", type, ": ring_id ", ring_id, " has no ring in this job of ",
                 nranks,
                 " ranks; create it first (DistributedStrategy::sync_batch_norm under fleet's "
                 "minimize uses ring 0, which the data-parallel pass creates)");
    return nullptr;
  }
  Communicator& ring = RingRegistry::Get().At(ring_id, type);
  KEEL_ENFORCE((ring.device_stream() != nullptr) == cuda, "op ", type, ": ring ", ring_id, " (",
               ring.backend(), ") serves ", cuda ? "CPU" : "CUDA", " tensors, but the op runs on ",
               ctx.place().str());
  return &ring;
}

BatchNormSync SumOverRing(const ExecutionContext& ctx, Communicator* ring, Tensor* buffer) {
  if (ring == nullptr || ring->nranks() == 1) return BatchNormSync{[](double*, int64_t) {}};
  return {[&ctx, ring, buffer](double* values, int64_t n) {
    buffer->Resize(DDim{n});
    double* d = buffer->mutable_data<double>(CPUPlace());
    std::memcpy(d, values, static_cast<size_t>(n) * sizeof(double));
    AsOp(ctx, [&] { ring->AllReduce(buffer, ReduceOp::kSum); });
    std::memcpy(values, buffer->data<double>(), static_cast<size_t>(n) * sizeof(double));
  }};
}

void* SyncBatchNormStream(Communicator* ring) {
  return ring == nullptr ? nullptr : ring->device_stream();
}

void SumOnDevice(const ExecutionContext& ctx, Communicator* ring, Tensor* sums) {
  if (ring != nullptr && ring->nranks() > 1)
    AsOp(ctx, [&] { ring->AllReduce(sums, ReduceOp::kSum); });
}

// RunsOnRing: the op's all-reduce is ordered with the ring's other collectives (the gradient
// all-reduces of data parallelism) in program order on every rank, on the ring's thread.
[[maybe_unused]] static OpSchema& keel_schema_sync_batch_norm =
    BatchNormSchema(OpRegistry::Register("sync_batch_norm")
                        .Doc("batch_norm whose training mean and variance are those of every "
                             "rank's batch of ring ring_id together (one all-reduce forward, one "
                             "backward), weighted by each rank's count; the moving variance "
                             "takes the unbiased variance. is_test and use_global_stats: "
                             "batch_norm.")
                        .RunsOnRing(),
                    "sync_batch_norm_grad")
        .Attr<int>("ring_id", 0, "the ring whose ranks' batches are normalized together",
                   [](const Attribute& a) {
                     return std::get<int>(a) >= 0 ? std::string() : std::string("must be >= 0");
                   });
KEEL_REGISTER_GRAD_OP(sync_batch_norm_grad, sync_batch_norm).RunsOnRing();
KEEL_REGISTER_KERNEL(CPU, sync_batch_norm, Synced<BatchNormKernel>::Kernel, float, double, bfloat16,
                     float16);
KEEL_REGISTER_KERNEL(CPU, sync_batch_norm_grad, Synced<BatchNormGradKernel>::Kernel, float, double,
                     bfloat16, float16);

}  // namespace keel
