// Host-staged collectives for CUDA tensors (--gpu_comm_backend=host): the tensor goes from the
// device to a pinned host buffer on the ring's own CUDA stream, through the ring of CPU tensors
// (shared memory or Gloo) in place, and back to the device on that stream. NCCL cannot put two
// ranks on one GPU; this can, so N ranks on a one-GPU machine train like N GPUs (and the
// N-ranks-equal-one-rank invariant is tested that way). The executor orders the stream against
// compute with events; a collective's copy to the host is waited for on the ring's thread, never
// on the compute thread (a pipeline's sends, which run on the compute thread, are the exception:
// Send below).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <map>

#include "framework/comm/communicator.h"
#include "framework/runtime/cuda_context.h"

namespace keel {

namespace {

class HostStagedCommunicator : public Communicator {
 public:
  HostStagedCommunicator(std::unique_ptr<Communicator> host, int device)
      : Communicator(host->ring_id(), host->rank(), host->nranks()),
        host_(std::move(host)),
        device_(device) {
    CudaContext::Get(device);  // the calling thread's device
    KEEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~HostStagedCommunicator() override {
    for (auto& kv : staging_) Unpin(&kv.second);
    for (auto& kv : send_staging_) Unpin(&kv.second);
    if (computed_) cudaEventDestroy(computed_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  const char* backend() const override { return backend_.c_str(); }
  void* device_stream() const override { return stream_; }

  void AllReduce(Tensor* t, ReduceOp op) override {
    CountAllReduce(*t);
    if (t->place().is_cpu()) return host_->AllReduce(t, op);
    CommTimer timer(&comm_ns_);
    ++seq_;
    Tensor h = ToHost(*t);
    host_->AllReduce(&h, op);
    ToDevice(h, t);
  }
  void Broadcast(Tensor* t, int root) override {
    if (t->place().is_cpu()) return host_->Broadcast(t, root);
    CommTimer timer(&comm_ns_);
    ++seq_;
    Tensor h = ToHost(*t);
    host_->Broadcast(&h, root);
    ToDevice(h, t);
  }
  void AllGather(const Tensor& in, Tensor* out) override {
    if (in.place().is_cpu()) return host_->AllGather(in, out);
    CommTimer timer(&comm_ns_);
    ++seq_;
    Tensor h = ToHost(in);
    Tensor gathered;
    host_->AllGather(h, &gathered);
    AllocateGathered(in, out);
    CopyBack(gathered, out);
  }
  void ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) override {
    if (in.place().is_cpu()) return host_->ReduceScatter(in, out, op);
    CommTimer timer(&comm_ns_);
    ++seq_;
    Tensor h = ToHost(in);
    Tensor part;
    host_->ReduceScatter(h, &part, op);
    out->Resize(part.dims());
    out->mutable_data(in.dtype(), in.place());
    CopyBack(part, out);
  }
  void Barrier() override { host_->Barrier(); }

  // Point-to-point (a pipeline's send_v2 / recv_v2, which run on the compute thread, not as ring
  // ops): the bytes go through the host ring's buffered transfer, so a send returns once its bytes
  // are on the host and no schedule can deadlock on it. A send of a CUDA tensor waits, on the
  // compute thread, for its copy to the host, which follows the compute stream's work so far (the
  // tensor was written there; it may be freed and its block reused once send_v2 returns). A
  // receive lands in host memory sized by the message; recv_v2 copies it to the device on the
  // compute stream.
  void Send(const Tensor& t, int peer, int tag) override {
    if (t.place().is_cpu()) return host_->Send(t, peer, tag);
    CommTimer timer(&comm_ns_);
    AfterCompute();
    host_->Send(ToHost(t, &send_staging_), peer, tag);
  }
  void Recv(Tensor* t, int peer, int tag) override {
    KEEL_ENFORCE(!t->initialized() || t->place().is_cpu(), "receive from rank ", peer, " (tag ",
                 tag, ") on ring ", ring_id_,
                 ": a host-staged ring receives into host memory, not ", t->place().str(),
                 " (recv_v2 copies what arrives to the device)");
    host_->Recv(t, peer, tag);
  }

 private:
  // A staging buffer: host memory, pinned with cudaHostRegister while it is one, and its
  // page-aligned view (first element, elements).
  struct Staging {
    Tensor buffer;
    int64_t offset = 0, capacity = 0;
    void* pinned = nullptr;
  };
  // The ring's stream waits for the work queued on the compute stream so far.
  void AfterCompute() {
    CudaContext& c = CudaContext::Get(device_);
    if (computed_ == nullptr)
      KEEL_CUDA_CHECK(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming));
    KEEL_CUDA_CHECK(cudaEventRecord(computed_, c.stream()));
    KEEL_CUDA_CHECK(cudaStreamWaitEvent(stream_, computed_, 0));
  }

  // t's bytes in the pinned staging buffer of its dtype, as a CPU tensor of t's dtype and dims.
  // The stream (ordered after t's writer by the executor) is synchronised: the host reads the
  // copy next. One buffer per dtype: a ring that alternates dtypes (sync_batch_norm's float64
  // sums between float32 gradients) keeps its buffers pinned instead of re-pinning each time.
  Tensor ToHost(const Tensor& t) { return ToHost(t, &staging_); }
  // The same through `buffers` (sends have their own: they run on the compute thread, the ring's
  // collectives on the ring's).
  Tensor ToHost(const Tensor& t, std::map<DType, Staging>* buffers) {
    CudaContext::Get(device_);
    const size_t bytes = t.nbytes();
    Staging& st = (*buffers)[t.dtype()];
    if (!st.buffer.initialized() || st.capacity < t.numel()) {
      Unpin(&st);
      // cudaHostRegister pins whole pages: the staging view starts on a page boundary (the
      // allocation is 64-byte aligned, so the gap is a whole number of elements).
      const int64_t elem = static_cast<int64_t>(SizeOf(t.dtype()));
      const int64_t slack = kPage / elem;
      st.buffer = Tensor(t.dtype(), {std::max<int64_t>(t.numel(), 1) + 2 * slack});
      const auto addr = reinterpret_cast<uintptr_t>(st.buffer.raw_data());
      st.offset = static_cast<int64_t>((kPage - addr % kPage) % kPage) / elem;
      st.capacity = st.buffer.numel() - st.offset - slack;
      const size_t pinned_bytes =
          (static_cast<size_t>(st.capacity * elem) + kPage - 1) / kPage * kPage;
      st.pinned = static_cast<char*>(st.buffer.raw_data()) + st.offset * elem;
      KEEL_CUDA_CHECK(cudaHostRegister(st.pinned, pinned_bytes, cudaHostRegisterDefault));
    }
    Tensor h = st.buffer.View(t.dims(), st.offset);
    if (bytes > 0) {
      KEEL_CUDA_CHECK(
          cudaMemcpyAsync(h.raw_data(), t.raw_data(), bytes, cudaMemcpyDeviceToHost, stream_));
      KEEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    return h;
  }
  // The staging buffer back into t on the stream, without waiting: the next collective's copy
  // to the host comes after it in stream order, and the executor orders compute after the
  // stream by an event.
  void ToDevice(const Tensor& h, Tensor* t) {
    if (h.nbytes() == 0) return;
    KEEL_CUDA_CHECK(
        cudaMemcpyAsync(t->raw_data(), h.raw_data(), h.nbytes(), cudaMemcpyHostToDevice, stream_));
  }
  // A result in ordinary host memory into device tensor `out`: waited for, since `src` is freed
  // when the caller returns.
  void CopyBack(const Tensor& src, Tensor* out) {
    if (src.nbytes() == 0) return;
    KEEL_CUDA_CHECK(cudaMemcpyAsync(out->raw_data(), src.raw_data(), src.nbytes(),
                                    cudaMemcpyHostToDevice, stream_));
    KEEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // The last copy from the buffer (ToDevice does not wait for it) must be done before the memory
  // is unpinned and freed.
  void Unpin(Staging* st) {
    if (st->pinned) {
      cudaStreamSynchronize(stream_);
      cudaHostUnregister(st->pinned);
    }
    st->pinned = nullptr;
  }

  std::unique_ptr<Communicator> host_;
  int device_;
  std::string backend_ = std::string("host-staged ") + host_->backend();
  cudaStream_t stream_ = nullptr;
  cudaEvent_t computed_ = nullptr;
  static constexpr int64_t kPage = 4096;
  std::map<DType, Staging> staging_, send_staging_;
};

}  // namespace

std::unique_ptr<Communicator> CreateHostStagedCommunicator(std::unique_ptr<Communicator> host_ring,
                                                           int device) {
  return std::make_unique<HostStagedCommunicator>(std::move(host_ring), device);
}

// Registered as libkeel_cuda opens (framework/comm/communicator.h).
namespace {
const bool g_registered = [] {
  RegisterHostStagedRingFactory(&CreateHostStagedCommunicator);
  return true;
}();
}  // namespace

}  // namespace keel
