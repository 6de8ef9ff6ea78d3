// Collective ops. The executor runs each collective on its ring's stream (a thread per ring on
// CPU); the work goes to the ring's Communicator (shared memory or Gloo for CPU tensors, NCCL or
// host staging for CUDA ones). The stream-sync ops read the collectives' outputs, so the
// dependency graph already starts them after those collectives finish; on CPU their kernels have
// nothing left to wait for, and they keep Paddle's program shape.
#include "framework/comm/collective_watch.h"
#include "framework/comm/comm_context.h"
#include "framework/comm/communicator.h"
#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/runtime/device.h"
#include "ops/collective_op_call.h"

namespace keel {

namespace {

void SameAsX(InferShapeContext& ctx) {
  if (ctx.HasInput("X") && ctx.HasOutput("Out")) ctx.ShareDimAndDType("X", "Out");
}

Communicator& Ring(const ExecutionContext& ctx) {
  return RingRegistry::Get().At(ctx.Attr<int>("ring_id"), ctx.op().type());
}

// Out aliases X in programs the transpiler writes; otherwise copy X into Out first. On a CUDA
// place the collective runs on the ring's stream, so the copy does too, after the compute
// stream's work (Out's block was allocated in that stream's order).
Tensor* InPlaceOut(ExecutionContext& ctx) {
  const Tensor& x = ctx.Input("X");
  Tensor* out = ctx.Output("Out");
  if (out->holder() != x.holder() || out->offset() != x.offset()) {
    out->Resize(x.dims());
    out->mutable_data(x.dtype(), ctx.place());
    void* ring_stream = x.place().is_cuda() ? Ring(ctx).device_stream() : nullptr;
    if (ring_stream != nullptr) {
      DeviceCopyOnStreamAfterCompute(ctx.place(), out->raw_data(), x.raw_data(), x.nbytes(),
                                     ring_stream);
    } else {
      out->CopyFrom(x);
    }
  }
  return out;
}

template <ReduceOp kOp>
struct AllReduceOp {
  template <typename T>
  class Kernel : public OpKernel {
   public:
    void Compute(ExecutionContext& ctx) override {
      AsOp(ctx, [&] { Ring(ctx).AllReduce(InPlaceOut(ctx), kOp); });
    }
  };
};

template <typename T>
class BroadcastKernel : public OpKernel {
 public:
  explicit BroadcastKernel(const OpDesc& op) : root_(op.Attr<int>("root")) {}
  void Compute(ExecutionContext& ctx) override {
    AsOp(ctx, [&] { Ring(ctx).Broadcast(InPlaceOut(ctx), root_); });
  }

 private:
  int root_;
};

template <typename T>
class AllGatherKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    AsOp(ctx, [&] { Ring(ctx).AllGather(ctx.Input("X"), ctx.Output("Out")); });
  }
};

template <typename T>
class ReduceScatterKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    AsOp(ctx, [&] { Ring(ctx).ReduceScatter(ctx.Input("X"), ctx.Output("Out"), ReduceOp::kSum); });
  }
};

template <typename T>
class BarrierKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    AsOp(ctx, [&] { Ring(ctx).Barrier(); });
  }
};

// CPU collectives are finished when the graph starts this op: nothing to order.
template <typename T>
class StreamSyncKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    if (ctx.HasInput("X") && ctx.OutputOrNull("Out")) InPlaceOut(ctx);
  }
};

template <typename T>
class CommInitKernel : public OpKernel {
 public:
  explicit CommInitKernel(const OpDesc& op)
      : ring_(op.Attr<int>("ring_id")),
        nranks_(op.Attr<int>("nranks")),
        rank_(op.Attr<int>("rank")),
        device_(op.Attr<int>("device_id")),
        group_(op.Attr<std::string>("group")),
        host_staged_(op.Attr<bool>("host_staged")) {}
  void Compute(ExecutionContext& ctx) override {
    KEEL_ENFORCE(!host_staged_ || device_ >= 0, "c_comm_init of ring ", ring_,
                 ": host_staged stages CUDA tensors through host memory, but device_id is ",
                 device_, " (a ring for CPU tensors)");
    AsOp(ctx, [&] {
      CommContext::Get().CreateRing(ring_, nranks_, rank_, device_ >= 0, device_, group_, "",
                                    host_staged_);
    });
  }

 private:
  int ring_, nranks_, rank_, device_;
  std::string group_;
  bool host_staged_;
};

std::string RankCheck(const Attribute& a) { return std::get<int>(a) >= 0 ? "" : "must be >= 0"; }
std::string PositiveCheck(const Attribute& a) {
  return std::get<int>(a) >= 1 ? "" : "must be >= 1";
}

OpSchema& Collective(const std::string& type, const std::string& doc) {
  return OpRegistry::Register(type)
      .Doc(doc)
      .Input("X", "the tensor")
      .Output("Out", "the result; usually the X variable itself")
      .Attr<int>("ring_id", 0, "which ring (communicator) runs it", RankCheck)
      .Attr<bool>("use_calc_stream", false,
                  "run in order with compute (after every earlier op, before every later one, "
                  "no overlap); false: on the ring's own thread and stream")
      .Shape(SameAsX);
}

}  // namespace

// The kernels are place-agnostic (the ring's Communicator takes CPU or CUDA memory), so the same
// classes serve CUDA places; an NCCL or host-staged ring from libkeel_cuda then moves the data.
// (On a machine without CUDA no CUDA place exists, and the registrations are never looked up.)
#define KEEL_REGISTER_COLLECTIVE_KERNEL(name, Kernel, ...) \
  KEEL_REGISTER_CPU_KERNEL(name, Kernel, __VA_ARGS__);     \
  KEEL_REGISTER_CUDA_KERNEL(name, Kernel, __VA_ARGS__)

#define KEEL_REGISTER_ALLREDUCE(name, op)                                                          \
  [[maybe_unused]] static OpSchema& keel_schema_##name =                                           \
      Collective(#name, "Out = " #op " of X over the ranks of ring_id (in place)")                 \
          .AllReducesInPlace();                                                                    \
  KEEL_REGISTER_COLLECTIVE_KERNEL(name, AllReduceOp<ReduceOp::op>::Kernel, float, double, int32_t, \
                                  int64_t, float16, bfloat16)

KEEL_REGISTER_ALLREDUCE(c_allreduce_sum, kSum);
KEEL_REGISTER_ALLREDUCE(c_allreduce_max, kMax);
KEEL_REGISTER_ALLREDUCE(c_allreduce_min, kMin);
KEEL_REGISTER_ALLREDUCE(c_allreduce_prod, kProd);

[[maybe_unused]] static OpSchema& keel_schema_c_broadcast =
    Collective("c_broadcast", "Out = X of rank `root`, on every rank of ring_id")
        .RunsOnRing()
        .Attr<int>("root", 0, "the rank whose X everybody gets", RankCheck);
KEEL_REGISTER_COLLECTIVE_KERNEL(c_broadcast, BroadcastKernel, float, double, int32_t, int64_t, bool,
                                uint8_t, int8_t, float16, bfloat16);

[[maybe_unused]] static OpSchema& keel_schema_c_allgather =
    Collective("c_allgather", "Out = concat over ranks of X along dim 0")
        .RunsOnRing()
        .Attr<int>("nranks", 1, "ranks in the ring", PositiveCheck)
        .Shape([](InferShapeContext& ctx) {
          DDim d = ctx.GetInputDim("X");
          if (d.empty()) d = DDim{1};
          if (d[0] > 0) d[0] *= ctx.Attr<int>("nranks");
          ctx.SetOutputDim("Out", d);
          ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
        });
KEEL_REGISTER_COLLECTIVE_KERNEL(c_allgather, AllGatherKernel, float, double, int32_t, int64_t,
                                float16, bfloat16);

[[maybe_unused]] static OpSchema& keel_schema_c_reducescatter =
    Collective("c_reducescatter", "Out = this rank's dim-0 slice of the sum of X over ranks")
        .RunsOnRing()
        .Attr<int>("nranks", 1, "ranks in the ring", PositiveCheck)
        .Shape([](InferShapeContext& ctx) {
          DDim d = ctx.GetInputDim("X");
          int n = ctx.Attr<int>("nranks");
          KEEL_SHAPE_CHECK(d.size() >= 1, "X must have rank >= 1, got ", d.str());
          if (d[0] > 0) {
            KEEL_SHAPE_CHECK(d[0] % n == 0, "dim 0 of X ", d.str(), " must divide by nranks ", n);
            d[0] /= n;
          }
          ctx.SetOutputDim("Out", d);
          ctx.SetOutputDType("Out", ctx.GetInputDType("X"));
        });
KEEL_REGISTER_COLLECTIVE_KERNEL(c_reducescatter, ReduceScatterKernel, float, double, int32_t,
                                int64_t, float16, bfloat16);

KEEL_REGISTER_OP(c_barrier)
    .Doc("Waits until every rank of ring_id arrives")
    .OptionalInput("X", "ignored; orders the barrier after X's writer")
    .OptionalOutput("Out", "ignored")
    .Attr<int>("ring_id", 0, "which ring", RankCheck)
    .KernelDTypeFrom("X")
    .RunsOnRing();
KEEL_REGISTER_COLLECTIVE_KERNEL(c_barrier, BarrierKernel, float);

// On the compute side (no RunsOnRing): the edge from it to the collective after it is where the
// ring waits for compute.
[[maybe_unused]] static OpSchema& keel_schema_c_sync_calc_stream =
    Collective("c_sync_calc_stream", "Orders the ring's stream after the compute stream (X)")
        .OnlyOrders();
KEEL_REGISTER_COLLECTIVE_KERNEL(c_sync_calc_stream, StreamSyncKernel, float, double, int32_t,
                                int64_t, float16, bfloat16);

[[maybe_unused]] static OpSchema& keel_schema_c_sync_comm_stream =
    Collective("c_sync_comm_stream", "Orders the compute stream after ring_id's stream (X)")
        .RunsOnRing()  // completes when the ring's earlier work has: what later ops wait for
        .OnlyOrders();
KEEL_REGISTER_COLLECTIVE_KERNEL(c_sync_comm_stream, StreamSyncKernel, float, double, int32_t,
                                int64_t, float16, bfloat16);

KEEL_REGISTER_OP(c_comm_init)
    .Doc("Creates ring ring_id of nranks ranks (this process is `rank`) through the store")
    .Barrier("creates the ring that later collectives use")
    .NotCapturable("sets up a communication ring")
    .Attr<int>("ring_id", 0, "the ring to create", RankCheck)
    .Attr<int>("nranks", 1, "ranks in the ring", PositiveCheck)
    .PerRankAttr<int>("rank", 0, "this process's rank in the ring", RankCheck)
    .PerRankAttr<int>("device_id", -1, "CUDA device for an NCCL ring; -1: a ring for CPU tensors")
    .PerRankAttr<std::string>("group", "",
                              "which ranks meet in this ring (\"node0\": one node's ranks); "
                              "empty: all")
    .Attr<bool>("host_staged", false,
                "a ring for CUDA tensors staged through pinned host memory whatever "
                "--gpu_comm_backend says (a pipeline's ring: buffered point-to-point transfers, "
                "which no schedule can deadlock)");
KEEL_REGISTER_COLLECTIVE_KERNEL(c_comm_init, CommInitKernel, float);

}  // namespace keel
