#include "framework/runtime/cuda_context.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <array>
#include <atomic>
#include <cstring>
#include <vector>

#include "framework/runtime/device.h"
#include "framework/runtime/place.h"

DECLARE_double(fraction_of_gpu_memory_to_use);
DECLARE_bool(allow_tf32);

namespace keel {

namespace {

std::atomic<int64_t> g_device_mallocs{0};

// DeviceMemory on a real CUDA device.
class CudaDeviceMemory : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(int device) : device_(device) {}
  void* Malloc(size_t bytes) override {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it so the retry and later calls start clean
      return nullptr;
    }
    KEEL_CUDA_CHECK(e);
    ++g_device_mallocs;
    return p;
  }
  void Free(void* p) override { KEEL_CUDA_CHECK(cudaFree(p)); }
  size_t TotalBytes() const override {
    size_t free_b = 0, total = 0;
    KEEL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    return total;
  }
  Event RecordEvent(Stream stream) override {
    cudaEvent_t e;
    KEEL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    KEEL_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(stream)));
    return e;
  }
  bool EventDone(Event e) override {
    cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (r == cudaErrorNotReady) return false;
    KEEL_CUDA_CHECK(r);
    return true;
  }
  void DestroyEvent(Event e) override { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
  std::string Name() const override { return CUDAPlace(device_).str(); }

 private:
  int device_;
};

constexpr int kMaxDevices = 64;
std::array<std::atomic<CudaContext*>, kMaxDevices> g_contexts{};
std::mutex g_contexts_mu;
thread_local int t_current_device = -1;

}  // namespace

void ThrowCudaError(const char* what, const char* detail, const char* file, int line) {
  KEEL_THROW(what, " failed: ", detail, " (", file, ":", line, ")");
}

struct CudaContext::Staging {
  struct Buffer {
    void* ptr = nullptr;
    size_t size = 0;
    cudaEvent_t done = nullptr;  // recorded after the copy that used it
    bool busy = false;
  };
  std::vector<Buffer> buffers;
};

CudaContext& CudaContext::Get(int device) {
  KEEL_ENFORCE(device >= 0 && device < kMaxDevices, "CUDAPlace(", device, ") is not a device id");
  CudaContext* c = g_contexts[device].load(std::memory_order_acquire);
  if (c == nullptr) {
    std::lock_guard<std::mutex> lock(g_contexts_mu);
    c = g_contexts[device].load(std::memory_order_relaxed);
    if (c == nullptr) {
      const int n = CudaDeviceCount();
      KEEL_ENFORCE(device < n, "CUDAPlace(", device, "): this process sees ", n,
                   " CUDA device(s) (CUDA_VISIBLE_DEVICES, FLAGS_selected_gpus)");
      c = new CudaContext(device);  // lives until the process ends
      g_contexts[device].store(c, std::memory_order_release);
    }
  }
  // The calling thread's current device is the context's (executor worker threads too).
  if (t_current_device != device) {
    KEEL_CUDA_CHECK(cudaSetDevice(device));
    t_current_device = device;
  }
  return *c;
}

CudaContext::CudaContext(int device) : device_(device), staging_(std::make_unique<Staging>()) {
  KEEL_CUDA_CHECK(cudaSetDevice(device));
  t_current_device = device;
  KEEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KEEL_CUBLAS_CHECK(cublasCreate(&cublas_));
  KEEL_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  allow_tf32_ = FLAGS_allow_tf32;
  KEEL_CUBLAS_CHECK(
      cublasSetMathMode(cublas_, allow_tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  const double fraction = FLAGS_fraction_of_gpu_memory_to_use;
  KEEL_ENFORCE(fraction >= 0 && fraction <= 1, "FLAGS_fraction_of_gpu_memory_to_use=", fraction,
               " must be in [0, 1] (0: allocate on demand)");
  auto mem = std::make_unique<CudaDeviceMemory>(device);
  const size_t reserve = static_cast<size_t>(fraction * static_cast<double>(mem->TotalBytes()));
  allocator_ = std::make_unique<CachingAllocator>(std::move(mem), reserve, stream_);
  // cuBLAS's scratch from our allocator, fixed for the context's life: without one, cuBLAS
  // allocates its own, and inside a CUDA graph capture that becomes memory nodes of the graph.
  constexpr size_t kCublasWorkspace = size_t{32} << 20;  // what cuBLAS asks for on Hopper
  cublas_workspace_ = allocator_->Allocate(kCublasWorkspace, stream_);
  KEEL_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspace));
  VLOG(1) << CUDAPlace(device).str() << ": stream ready, reserve " << reserve << " bytes, tf32 "
          << (allow_tf32_ ? "on" : "off");
}

CudaContext::~CudaContext() = default;  // contexts live as long as the process

cudnnHandle_t CudaContext::cudnn() {
  std::call_once(cudnn_once_, [this] {
    KEEL_CUDNN_CHECK(cudnnCreate(&cudnn_));
    KEEL_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
  });
  return cudnn_;
}

void* CudaContext::Workspace(size_t bytes) {
  if (bytes <= workspace_bytes_) return workspace_;
  if (workspace_) {
    std::lock_guard<std::mutex> lock(staging_mu_);
    if (capturing_ || live_graphs_ > 0)
      retired_workspaces_.push_back(workspace_);  // a graph's replays use it: freed with the last
    else
      allocator_->Free(workspace_);  // stream-ordered: safe for the next kernel
  }
  workspace_ = allocator_->Allocate(bytes, stream_);
  workspace_bytes_ = bytes;
  return workspace_;
}

void* CudaContext::StagingBuffer(size_t bytes) {
  std::lock_guard<std::mutex> lock(staging_mu_);
  if (capturing_) {  // the graph copies from it on every replay: its own, never reused
    void* p = nullptr;
    KEEL_CUDA_CHECK(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault));
    capture_staging_.push_back(p);
    return p;
  }
  Staging::Buffer* best = nullptr;
  for (auto& b : staging_->buffers) {
    if (b.busy || b.size < bytes) continue;
    if (b.done) {
      cudaError_t r = cudaEventQuery(b.done);
      if (r == cudaErrorNotReady) continue;
      KEEL_CUDA_CHECK(r);
    }
    if (best == nullptr || b.size < best->size) best = &b;
  }
  if (best == nullptr) {
    Staging::Buffer b;
    b.size = 64 << 10;
    while (b.size < bytes) b.size *= 2;
    KEEL_CUDA_CHECK(cudaHostAlloc(&b.ptr, b.size, cudaHostAllocDefault));
    KEEL_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
    staging_->buffers.push_back(b);
    best = &staging_->buffers.back();
  }
  best->busy = true;
  return best->ptr;
}

void CudaContext::DoneWithStaging(void* buffer) {
  std::lock_guard<std::mutex> lock(staging_mu_);
  for (void* p : capture_staging_)
    if (p == buffer) return;  // the graph's: no event (none may be recorded in a capture)
  for (auto& b : staging_->buffers) {
    if (b.ptr != buffer) continue;
    KEEL_CUDA_CHECK(cudaEventRecord(b.done, stream_));
    b.busy = false;
    return;
  }
  LOG(FATAL) << "DoneWithStaging of a buffer StagingBuffer did not hand out";
}

void CudaContext::BeginCapture() {
  std::lock_guard<std::mutex> lock(staging_mu_);
  KEEL_ENFORCE(!capturing_, CUDAPlace(device_).str(),
               ": a CUDA graph capture is already under way on this device (one at a time)");
  capturing_ = true;
}

void CudaContext::GraphCreated() {
  std::lock_guard<std::mutex> lock(staging_mu_);
  ++live_graphs_;
}

void CudaContext::GraphDestroyed() {
  std::lock_guard<std::mutex> lock(staging_mu_);
  if (--live_graphs_ > 0) return;
  for (void* w : retired_workspaces_) allocator_->Free(w);  // the last replay has finished
  retired_workspaces_.clear();
}

std::vector<void*> CudaContext::EndCapture() {
  std::lock_guard<std::mutex> lock(staging_mu_);
  capturing_ = false;
  std::vector<void*> owned;
  owned.swap(capture_staging_);
  return owned;
}

// ---------------------------------------------------------------- device.h, for CudaBackend
// (cuda_runtime.cc). In namespace cuda: libkeel's device.h functions of the same names forward
// here through the backend.

namespace cuda {

void DeviceSynchronize(const Place& place) {
  if (!place.is_cuda()) return;
  KEEL_CUDA_CHECK(cudaStreamSynchronize(CudaContext::Get(place.device).stream()));
}

AllocatorStats DeviceAllocatorStats(const Place& place) {
  if (!place.is_cuda()) return {};
  return CudaContext::Get(place.device).allocator().stats();
}

void DeviceResetPeakStats(const Place& place) {
  if (place.is_cuda()) CudaContext::Get(place.device).allocator().ResetPeak();
}

void DeviceEmptyCache(const Place& place) {
  if (place.is_cuda()) CudaContext::Get(place.device).allocator().EmptyCache();
}

int64_t DeviceMallocCount() { return g_device_mallocs.load(); }

std::string DeviceUuid(const Place& place) {
  CudaContext::Get(place.device);
  cudaDeviceProp prop;
  KEEL_CUDA_CHECK(cudaGetDeviceProperties(&prop, place.device));
  static const char* kHex = "0123456789abcdef";
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    const auto b = static_cast<unsigned char>(prop.uuid.bytes[i]);
    s += kHex[b >> 4];
    s += kHex[b & 15];
    if (i == 3 || i == 5 || i == 7 || i == 9) s += '-';
  }
  return s;
}

void* DeviceEventCreate(const Place& place) {
  CudaContext::Get(place.device);
  cudaEvent_t e;
  KEEL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void DeviceEventDestroy(const Place& place, void* event) {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void DeviceEventRecord(const Place& place, void* event, void* stream) {
  CudaContext& c = CudaContext::Get(place.device);
  KEEL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event),
                                  stream ? static_cast<cudaStream_t>(stream) : c.stream()));
}

void DeviceStreamWaitEvent(const Place& place, void* stream, void* event) {
  CudaContext& c = CudaContext::Get(place.device);
  KEEL_CUDA_CHECK(cudaStreamWaitEvent(stream ? static_cast<cudaStream_t>(stream) : c.stream(),
                                      static_cast<cudaEvent_t>(event), 0));
}

bool DeviceEventDone(const Place& place, void* event) {
  CudaContext::Get(place.device);
  cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (r == cudaErrorNotReady) return false;
  KEEL_CUDA_CHECK(r);
  return true;
}

void DeviceCopyOnStreamAfterCompute(const Place& place, void* dst, const void* src, size_t size,
                                    void* stream) {
  CudaContext& c = CudaContext::Get(place.device);
  const auto s = static_cast<cudaStream_t>(stream);
  cudaEvent_t computed;
  KEEL_CUDA_CHECK(cudaEventCreateWithFlags(&computed, cudaEventDisableTiming));
  KEEL_CUDA_CHECK(cudaEventRecord(computed, c.stream()));
  KEEL_CUDA_CHECK(cudaStreamWaitEvent(s, computed, 0));
  cudaEventDestroy(computed);  // released once its recording completes
  if (size > 0) KEEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, size, cudaMemcpyDeviceToDevice, s));
}

void CopyHostToDeviceAsync(const Place& dst_place, void* dst, const void* src, size_t size) {
  if (size == 0) return;
  CudaContext& c = CudaContext::Get(dst_place.device);
  void* staging = c.StagingBuffer(size);
  std::memcpy(staging, src, size);
  KEEL_CUDA_CHECK(cudaMemcpyAsync(dst, staging, size, cudaMemcpyHostToDevice, c.stream()));
  c.DoneWithStaging(staging);
}

}  // namespace cuda

}  // namespace keel
