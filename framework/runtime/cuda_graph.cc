// CudaGraph on a CUDA device: libkeel_cuda's implementation, made through CudaBackend::NewGraph.
#include "framework/runtime/cuda_graph.h"

#include <glog/logging.h>

#include "framework/error.h"
#include "framework/runtime/cuda_context.h"

namespace keel {

namespace cuda {
namespace {

class DeviceCudaGraph final : public CudaGraph {
 public:
  explicit DeviceCudaGraph(const Place& place);
  ~DeviceCudaGraph() override;
  void BeginCapture(const std::vector<std::pair<void*, size_t>>& inputs) override;
  void EndCapture() override;
  void AbortCapture() noexcept override;
  bool capturing() const override;
  bool ready() const override;
  void* Input(size_t i) override;
  void WaitInputs() override;
  void Launch() override;
  int64_t launches() const override { return launches_; }

 private:
  struct Impl;
  Place place_;
  std::unique_ptr<Impl> impl_;
  int64_t launches_ = 0;
};

struct DeviceCudaGraph::Impl {
  CudaContext* ctx = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t inputs_copied = nullptr;  // recorded by the graph after its input copies
  std::vector<void*> inputs;            // pinned, one per input
  std::vector<void*> staging;           // pinned buffers copies captured in the step read
  int64_t alloc_capture = 0;            // the allocator's capture id (0: none)
  bool capturing = false;
};

DeviceCudaGraph::DeviceCudaGraph(const Place& place)
    : place_(place), impl_(std::make_unique<Impl>()) {
  KEEL_ENFORCE(place.is_cuda(), "a CUDA graph needs a CUDA place, not ", place.str());
  impl_->ctx = &CudaContext::Get(place.device);
  KEEL_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->inputs_copied, cudaEventDisableTiming));
  impl_->ctx->GraphCreated();
}

DeviceCudaGraph::~DeviceCudaGraph() {
  AbortCapture();
  Impl& m = *impl_;
  CudaContext::Get(place_.device);
  // The last replay must be done before its pinned buffers go; the held device blocks wait for
  // it through an event instead.
  cudaStreamSynchronize(m.ctx->stream());
  if (m.exec) cudaGraphExecDestroy(m.exec);
  if (m.graph) cudaGraphDestroy(m.graph);
  if (m.alloc_capture) m.ctx->allocator().ReleaseCapture(m.alloc_capture, m.ctx->stream());
  for (void* p : m.inputs) cudaFreeHost(p);
  for (void* p : m.staging) cudaFreeHost(p);
  cudaEventDestroy(m.inputs_copied);
  m.ctx->GraphDestroyed();
}

void DeviceCudaGraph::BeginCapture(const std::vector<std::pair<void*, size_t>>& inputs) {
  Impl& m = *impl_;
  KEEL_ENFORCE(!m.capturing && m.exec == nullptr, "CudaGraph::BeginCapture: already captured");
  CudaContext::Get(place_.device);
  for (auto& in : inputs) {
    void* p = nullptr;
    KEEL_CUDA_CHECK(cudaHostAlloc(&p, in.second ? in.second : 1, cudaHostAllocDefault));
    m.inputs.push_back(p);
  }
  const cudaStream_t s = m.ctx->stream();
  CachingAllocator& alloc = m.ctx->allocator();
  m.alloc_capture = alloc.BeginCapture();  // throws when another capture is under way
  auto undo = [&] {
    alloc.EndCapture();
    alloc.ReleaseCapture(m.alloc_capture, s);
    m.alloc_capture = 0;
  };
  try {
    m.ctx->BeginCapture();
  } catch (...) {
    undo();
    throw;
  }
  // Relaxed: the rings' threads enqueue NCCL calls on their streams (which join this capture
  // through the executor's events), and a first-time cudaMalloc of the allocator stays legal.
  const cudaError_t begun = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  if (begun != cudaSuccess) {
    m.ctx->EndCapture();
    undo();
    KEEL_CUDA_CHECK(begun);
  }
  m.capturing = true;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].second)
      KEEL_CUDA_CHECK(cudaMemcpyAsync(inputs[i].first, m.inputs[i], inputs[i].second,
                                      cudaMemcpyHostToDevice, s));
  KEEL_CUDA_CHECK(cudaEventRecordWithFlags(m.inputs_copied, s, cudaEventRecordExternal));
}

void DeviceCudaGraph::EndCapture() {
  Impl& m = *impl_;
  KEEL_ENFORCE(m.capturing, "CudaGraph::EndCapture without BeginCapture");
  CudaContext::Get(place_.device);
  m.capturing = false;
  m.staging = m.ctx->EndCapture();
  m.ctx->allocator().EndCapture();
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(m.ctx->stream(), &g);
  if (e != cudaSuccess || g == nullptr) {
    cudaGetLastError();
    if (g) cudaGraphDestroy(g);
    KEEL_THROW("CUDA graph capture on ", place_.str(),
               " failed: ", e != cudaSuccess ? cudaGetErrorString(e) : "no graph",
               " (an op waited for the device or used a stream outside the capture)");
  }
  m.graph = g;
  e = cudaGraphInstantiate(&m.exec, g, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    m.exec = nullptr;
    KEEL_THROW("CUDA graph on ", place_.str(),
               ": cudaGraphInstantiate failed: ", cudaGetErrorString(e));
  }
  KEEL_CUDA_CHECK(cudaGraphUpload(m.exec, m.ctx->stream()));
}

void DeviceCudaGraph::AbortCapture() noexcept {
  Impl& m = *impl_;
  if (!m.capturing) return;
  m.capturing = false;
  m.staging = m.ctx->EndCapture();
  m.ctx->allocator().EndCapture();
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(m.ctx->stream(), &g);  // ends it even when it was invalidated
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();  // the capture's error is not the next call's
}

bool DeviceCudaGraph::capturing() const { return impl_->capturing; }
bool DeviceCudaGraph::ready() const { return impl_->exec != nullptr; }

void* DeviceCudaGraph::Input(size_t i) {
  CHECK_LT(i, impl_->inputs.size());
  return impl_->inputs[i];
}

void DeviceCudaGraph::WaitInputs() {
  if (launches_ == 0) return;
  KEEL_CUDA_CHECK(cudaEventSynchronize(impl_->inputs_copied));
}

void DeviceCudaGraph::Launch() {
  KEEL_ENFORCE(ready(), "CudaGraph::Launch before a capture");
  CudaContext::Get(place_.device);
  KEEL_CUDA_CHECK(cudaGraphLaunch(impl_->exec, impl_->ctx->stream()));
  ++launches_;
}

}  // namespace

std::unique_ptr<CudaGraph> NewCudaGraph(const Place& place) {
  return std::make_unique<DeviceCudaGraph>(place);
}

}  // namespace cuda
}  // namespace keel
