// Host-staged collectives for CUDA tensors (--gpu_comm_backend=host): the tensor goes from the
// device to a pinned host buffer on the ring's own CUDA stream, through the ring of CPU tensors
// (shared memory or Gloo) in place, and back to the device on that stream. NCCL cannot put two
// ranks on one GPU; this can, so N ranks on a one-GPU machine train like N GPUs (and the
// N-ranks-equal-one-rank invariant is tested that way). The executor orders the stream against
// compute with events; the copy to the host is waited for on the ring's thread, never on the
// compute thread.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

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
    Unpin();
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

 private:
  // t's bytes in the pinned staging buffer, as a CPU tensor of t's dtype and dims. The stream
  // (ordered after t's writer by the executor) is synchronised: the host reads the copy next.
  Tensor ToHost(const Tensor& t) {
    CudaContext::Get(device_);
    const size_t bytes = t.nbytes();
    if (staging_.dtype() != t.dtype() || !staging_.initialized() || capacity_ < t.numel()) {
      Unpin();
      // cudaHostRegister pins whole pages: the staging view starts on a page boundary (the
      // allocation is 64-byte aligned, so the gap is a whole number of elements).
      const int64_t elem = static_cast<int64_t>(SizeOf(t.dtype()));
      const int64_t slack = kPage / elem;
      staging_ = Tensor(t.dtype(), {std::max<int64_t>(t.numel(), 1) + 2 * slack});
      const auto addr = reinterpret_cast<uintptr_t>(staging_.raw_data());
      offset_ = static_cast<int64_t>((kPage - addr % kPage) % kPage) / elem;
      capacity_ = staging_.numel() - offset_ - slack;
      const size_t pinned_bytes =
          (static_cast<size_t>(capacity_ * elem) + kPage - 1) / kPage * kPage;
      pinned_ = static_cast<char*>(staging_.raw_data()) + offset_ * elem;
      KEEL_CUDA_CHECK(cudaHostRegister(pinned_, pinned_bytes, cudaHostRegisterDefault));
    }
    Tensor h = staging_.View(t.dims(), offset_);
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
  void Unpin() {
    if (pinned_) {
      cudaStreamSynchronize(stream_);
      cudaHostUnregister(pinned_);
    }
    pinned_ = nullptr;
  }

  std::unique_ptr<Communicator> host_;
  int device_;
  std::string backend_ = std::string("host-staged ") + host_->backend();
  cudaStream_t stream_ = nullptr;
  static constexpr int64_t kPage = 4096;
  Tensor staging_;  // host memory, pinned with cudaHostRegister while it is the staging buffer
  int64_t offset_ = 0, capacity_ = 0;  // the page-aligned view: first element, elements
  void* pinned_ = nullptr;
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
