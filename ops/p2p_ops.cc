// Point-to-point ops of pipeline parallelism (transpiler/pipeline_pass.h): send_v2 hands X to rank
// `peer` of ring `ring_id` under `tag`, recv_v2 receives it there into Out. A transfer matches
// only the send of the same peer, tag and ordinal (Communicator::Send / Recv), so ops that the
// executor starts in any order still pair up. Sends are buffered and return at once. Both run on
// the compute side (a receive waits there for its peer's send) and trace a "comm" span each.
//
// A program holding them is one stage of a pipeline: its parameters are that stage's only, so
// they declare ShardsModel (fleet gathers the stages for a checkpoint of a pipeline its minimize
// made, fleet/model_parallel_checkpoint.h, and refuses one of a stage made otherwise).
#include "framework/comm/communicator.h"
#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"
#include "framework/profiler/profiler.h"
#include "framework/runtime/device.h"
#include "ops/collective_op_call.h"

namespace keel {

namespace {

std::string NonNegative(const Attribute& a) { return std::get<int>(a) >= 0 ? "" : "must be >= 0"; }

Communicator& Ring(const ExecutionContext& ctx) {
  return RingRegistry::Get().At(ctx.Attr<int>("ring_id"), ctx.op().type());
}

std::string Detail(const ExecutionContext& ctx, const char* dir) {
  return StrCat(dir, " rank ", ctx.Attr<int>("peer"), " tag ", ctx.Attr<int>("tag"), " ring ",
                ctx.Attr<int>("ring_id"));
}

template <typename T>
class SendKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    profiler::RecordEvent span("comm", "send_v2", Detail(ctx, "to"));
    try {
      AsOp(ctx,
           [&] { Ring(ctx).Send(ctx.Input("X"), ctx.Attr<int>("peer"), ctx.Attr<int>("tag")); });
    } catch (const Error& e) {
      // On a pipeline ring a rank's index is its stage (as recv_v2 says it).
      KEEL_THROW("send_v2 of ", ctx.op().Input("X")[0], " to stage ", ctx.Attr<int>("peer"),
                 " (tag ", ctx.Attr<int>("tag"), "): ", e.what());
    }
  }
};

template <typename T>
class RecvKernel : public OpKernel {
 public:
  void Compute(ExecutionContext& ctx) override {
    profiler::RecordEvent span("comm", "recv_v2", Detail(ctx, "from"));
    Tensor* out = ctx.Output("Out");
    const std::vector<int64_t>& shape = ctx.Attr<std::vector<int64_t>>("out_shape");
    try {
      if (ctx.place().is_cuda()) {
        // The bytes arrive in host memory, sized by the message (a pipeline's ring on a GPU is
        // host-staged, c_comm_init's host_staged), then go to the device on the compute stream,
        // in order with the ops that read them; a short last batch needs no static shape.
        Tensor h;
        AsOp(ctx, [&] { Ring(ctx).Recv(&h, ctx.Attr<int>("peer"), ctx.Attr<int>("tag")); });
        out->Resize(h.dims());
        out->mutable_data(h.dtype(), ctx.place());
        CopyHostToDeviceAsync(ctx.place(), out->raw_data(), h.raw_data(), h.nbytes());
      } else {
        AsOp(ctx, [&] { Ring(ctx).Recv(out, ctx.Attr<int>("peer"), ctx.Attr<int>("tag")); });
      }
    } catch (const Error& e) {
      // On a pipeline ring a rank's index is its stage.
      KEEL_THROW("recv_v2 of ", ctx.op().Output("Out")[0], " from stage ", ctx.Attr<int>("peer"),
                 " (tag ", ctx.Attr<int>("tag"), "): ", e.what());
    }
    KEEL_ENFORCE(out->dtype() == DTypeOf<T>::value, "recv_v2 of ", ctx.op().Output("Out")[0],
                 ": received ", DTypeName(out->dtype()), ", expected ",
                 DTypeName(DTypeOf<T>::value));
    KEEL_ENFORCE(static_cast<size_t>(out->dims().size()) == shape.size(), "recv_v2 of ",
                 ctx.op().Output("Out")[0], ": received a tensor of shape ", out->dims().str(),
                 ", expected ", DDim(shape).str());
    for (size_t i = 0; i < shape.size(); ++i)
      KEEL_ENFORCE(shape[i] < 0 || shape[i] == out->dims()[static_cast<int>(i)], "recv_v2 of ",
                   ctx.op().Output("Out")[0], ": received a tensor of shape ", out->dims().str(),
                   ", expected ", DDim(shape).str());
  }
};

}  // namespace

KEEL_REGISTER_OP(send_v2)
    .Doc("Sends X to rank `peer` of ring ring_id under `tag` (buffered: returns at once)")
    .Input("X", "the tensor to send")
    .Attr<int>("ring_id", 0, "the ring (the pipeline group's)", NonNegative)
    .Attr<int>("peer", 0, "the receiving rank's index in the ring", NonNegative)
    .Attr<int>("tag", 0, "pairs this send with the recv_v2 of the same tag", NonNegative)
    .NotCapturable("moves data between processes through the host")
    .ShardsModel();
KEEL_REGISTER_CPU_KERNEL(send_v2, SendKernel, float, double, int32_t, int64_t, float16, bfloat16);
KEEL_REGISTER_CUDA_KERNEL(send_v2, SendKernel, float, double, int32_t, int64_t, float16, bfloat16);

KEEL_REGISTER_OP(recv_v2)
    .Doc("Out = the X that rank `peer` of ring ring_id sent under `tag`")
    .Output("Out", "the received tensor")
    .Attr<int>("ring_id", 0, "the ring (the pipeline group's)", NonNegative)
    .Attr<int>("peer", 0, "the sending rank's index in the ring", NonNegative)
    .Attr<int>("tag", 0, "pairs this receive with the send_v2 of the same tag", NonNegative)
    .Attr<std::vector<int64_t>>("out_shape", {}, "Out's shape (-1: any size in that dim)")
    .Attr<int>("dtype", static_cast<int>(DType::kFloat32), "Out's dtype")
    .NotCapturable("moves data between processes through the host")
    .ShardsModel()
    .Shape([](InferShapeContext& ctx) {
      if (ctx.IsRuntime()) return;  // the message decides (and the kernel checks it)
      ctx.SetOutputDim("Out", DDim(ctx.Attr<std::vector<int64_t>>("out_shape")));
      ctx.SetOutputDType("Out", static_cast<DType>(ctx.Attr<int>("dtype")));
    });
KEEL_REGISTER_CPU_KERNEL(recv_v2, RecvKernel, float, double, int32_t, int64_t, float16, bfloat16);
KEEL_REGISTER_CUDA_KERNEL(recv_v2, RecvKernel, float, double, int32_t, int64_t, float16, bfloat16);

}  // namespace keel
