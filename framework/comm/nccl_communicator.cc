// NCCL backend: CUDA tensors. The unique id travels through our store; every collective is
// enqueued on the ring's own stream and then waited for with the job's timeout, so a dead peer is
// a keel::Error (after ncclCommAbort), never a hang. Compiled when keel finds NCCL.
#include <cuda_runtime.h>
#include <glog/logging.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "framework/comm/communicator.h"
#include "framework/comm/store.h"
#include "framework/error.h"
#include "framework/runtime/cuda_context.h"

namespace keel {

namespace {

ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kUInt8:
      return ncclUint8;
    case DType::kInt8:
      return ncclInt8;
    case DType::kBool:
      return ncclUint8;
  }
  KEEL_THROW("no NCCL type for ", DTypeName(t));
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kProd:
      return ncclProd;
    case ReduceOp::kAvg:
      return ncclAvg;
  }
  return ncclSum;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(int ring_id, int rank, int nranks, int device, StoreClient& store,
                   const CommOptions& o)
      : Communicator(ring_id, rank, nranks), device_(device), timeout_(o.timeout) {
    CudaContext::Get(device);  // the calling thread's device, through the context's cache
    ncclUniqueId id;
    const std::string key = o.prefix + "nccl/ring" + std::to_string(ring_id) + "/id";
    if (rank == 0) {
      Nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
      store.Set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      std::string s = store.Get(key, o.timeout);
      KEEL_ENFORCE(s.size() == sizeof(id), "NCCL ring ", ring_id, ": malformed unique id in store");
      std::memcpy(&id, s.data(), sizeof(id));
    }
    // Non-blocking init so that a rank that never arrives times out instead of hanging.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    Nccl(ncclCommInitRankConfig(&comm_, nranks, id, rank, &config), "ncclCommInitRankConfig");
    WaitComm("ncclCommInitRank");
    Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
    if (computed_) cudaEventDestroy(computed_);
  }
  const char* backend() const override { return "nccl"; }
  void* device_stream() const override { return stream_; }
  double timeout_s() const override { return timeout_.count() / 1000.0; }
  void WatchDevice(const std::string& what, bool past_deadline) override {
    KEEL_ENFORCE(comm_ != nullptr, Where(what), ": the ring is dead after an earlier failure");
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      KEEL_THROW(Where(what), ": ", ncclGetErrorString(state));
    }
    if (past_deadline) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      KEEL_THROW(Where(what), ": timed out after ", timeout_.count() / 1000.0,
                 " s (a peer crashed or stopped?)");
    }
  }

  void AllReduce(Tensor* t, ReduceOp op) override {
    CountAllReduce(*t);
    Run(std::string("allreduce_") + ReduceOpName(op), [&] {
      return ncclAllReduce(t->raw_data(), t->raw_data(), static_cast<size_t>(t->numel()),
                           NcclType(t->dtype()), NcclOp(op), comm_, stream_);
    });
  }
  void Broadcast(Tensor* t, int root) override {
    Run("broadcast", [&] {
      return ncclBroadcast(t->raw_data(), t->raw_data(), static_cast<size_t>(t->numel()),
                           NcclType(t->dtype()), root, comm_, stream_);
    });
  }
  void AllGather(const Tensor& in, Tensor* out) override {
    AllocateGathered(in, out);
    AfterCompute();
    Run("allgather", [&] {
      return ncclAllGather(in.raw_data(), out->raw_data(), static_cast<size_t>(in.numel()),
                           NcclType(in.dtype()), comm_, stream_);
    });
  }
  void ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) override {
    KEEL_ENFORCE(in.dims().size() >= 1 && in.dims()[0] % nranks_ == 0, "reduce_scatter: dim 0 of ",
                 in.dims().str(), " must divide by ", nranks_, " ranks");
    DDim d = in.dims();
    d[0] /= nranks_;
    out->Resize(d);
    out->mutable_data(in.dtype(), in.place());
    AfterCompute();
    Run("reduce_scatter", [&] {
      return ncclReduceScatter(in.raw_data(), out->raw_data(), static_cast<size_t>(out->numel()),
                               NcclType(in.dtype()), NcclOp(op), comm_, stream_);
    });
  }
  // No Send / Recv: NCCL's send and receive meet inside the ring's stream, so two stages whose
  // sends cross (1F1B's steady state) would each wait there for the other's receive, queued
  // behind its own send. A pipeline's ring is host-staged on GPUs (c_comm_init's host_staged).
  void Barrier() override {
    if (!barrier_.initialized()) {
      barrier_.Alloc(DType::kInt32, {1}, CUDAPlace(device_));
      AfterCompute();
    }
    Cuda(cudaMemsetAsync(barrier_.raw_data(), 0, sizeof(int32_t), stream_), "cudaMemsetAsync");
    AllReduce(&barrier_, ReduceOp::kSum);
  }

 private:
  // The ring's stream waits for the work queued on the compute stream so far. An output this
  // ring writes was allocated in the compute stream's order (its block may have been another
  // tensor's there a moment ago).
  void AfterCompute() {
    CudaContext& c = CudaContext::Get(device_);
    if (computed_ == nullptr)
      Cuda(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming), "cudaEventCreate");
    Cuda(cudaEventRecord(computed_, c.stream()), "cudaEventRecord");
    Cuda(cudaStreamWaitEvent(stream_, computed_, 0), "cudaStreamWaitEvent");
  }
  void Cuda(cudaError_t e, const char* what) {
    KEEL_ENFORCE(e == cudaSuccess, "NCCL ring ", ring_id_, ": ", what, ": ", cudaGetErrorString(e));
  }
  void Nccl(ncclResult_t r, const char* what) {
    KEEL_ENFORCE(r == ncclSuccess || r == ncclInProgress, "NCCL ring ", ring_id_, ": ", what, ": ",
                 ncclGetErrorString(r));
  }
  // Polls the communicator's async state until it settles, aborting at the timeout.
  void WaitComm(const std::string& what) {
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
      Nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state != ncclInProgress) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        KEEL_THROW(Where(what), ": timed out after ", timeout_.count() / 1000.0,
                   " s (a rank that never arrived?)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    KEEL_ENFORCE(state == ncclSuccess, Where(what), ": ", ncclGetErrorString(state));
  }

  template <typename F>
  void Run(const std::string& what, F&& enqueue) {
    CommTimer timer(&comm_ns_);
    ++seq_;
    KEEL_ENFORCE(comm_ != nullptr, Where(what), ": the ring is dead after an earlier failure");
    CudaContext::Get(device_);
    ncclResult_t r = enqueue();
    KEEL_ENFORCE(r == ncclSuccess || r == ncclInProgress, Where(what), ": ", ncclGetErrorString(r));
    // A non-blocking communicator may still be enqueuing the call: until it has, neither the
    // stream nor an event recorded after it covers the collective.
    if (r == ncclInProgress) WaitComm(what);
    // In a CUDA graph capture the call was recorded, not run: nothing to wait for (and querying
    // a capturing stream is an error). A replay's collectives complete with the graph.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    Cuda(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
    if (capture != cudaStreamCaptureStatusNone) return;
    // Wait for the stream, watching for peer failures and the timeout.
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      KEEL_ENFORCE(q == cudaErrorNotReady, Where(what), ": ", cudaGetErrorString(q));
      ncclResult_t state;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        KEEL_THROW(Where(what), ": ", ncclGetErrorString(state));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        KEEL_THROW(Where(what), ": timed out after ", timeout_.count() / 1000.0,
                   " s (a peer crashed or stopped?)");
      }
      std::this_thread::yield();
    }
  }

  int device_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t computed_ = nullptr;
  Tensor barrier_;  // one int32 on the device, zeroed on the ring's stream before each barrier
};

}  // namespace

std::unique_ptr<Communicator> CreateNcclCommunicator(int ring_id, int rank, int nranks, int device,
                                                     StoreClient& store, const CommOptions& opts) {
  return std::make_unique<NcclCommunicator>(ring_id, rank, nranks, device, store, opts);
}

// Registered as libkeel_cuda opens (framework/comm/communicator.h).
namespace {
const bool g_registered = [] {
  RegisterNcclRingFactory(&CreateNcclCommunicator);
  return true;
}();
}  // namespace

}  // namespace keel
