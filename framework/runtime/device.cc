// GPU flags (defined in every build, so a CPU build accepts the seed's FLAGS_ environment), and
// device.h for builds without CUDA.
#include "framework/runtime/device.h"

#include <gflags/gflags.h>

#include "framework/error.h"
#include "framework/runtime/cuda_graph.h"

DEFINE_double(fraction_of_gpu_memory_to_use, 0.0,
              "Fraction of each GPU's memory the caching allocator reserves up front, as Paddle "
              "does (0 allocates on demand; later needs grow the cache in either case).");
DEFINE_bool(allow_tf32, false,
            "Let cuBLAS and cuDNN use TF32 tensor cores for float32 matmul and conv (faster, about "
            "10 bits of mantissa); off: full float32.");
DEFINE_bool(cudnn_deterministic, false,
            "Only cuDNN convolution algorithms that give the same bits every run (Paddle's flag; "
            "some of the fastest accumulate with atomics).");
DEFINE_bool(cudnn_exhaustive_search, false,
            "Choose each convolution's cuDNN algorithm by timing them all once per shape "
            "(cudnnFind); false: cuDNN's heuristic ranking (Paddle's flag).");
DEFINE_int64(conv_workspace_size_limit, 512,
             "The most scratch memory, in MB, a cuDNN convolution algorithm may use (Paddle's "
             "flag); faster algorithms that need more are skipped.");

namespace keel {

#ifndef KEEL_WITH_CUDA
namespace {
[[noreturn]] void NoCuda(const Place& place) {
  KEEL_THROW(place.str(), ": this keel was built without CUDA");
}
}  // namespace

void DeviceSynchronize(const Place& place) {
  if (place.is_cuda()) NoCuda(place);
}
AllocatorStats DeviceAllocatorStats(const Place& place) {
  if (place.is_cuda()) NoCuda(place);
  return {};
}
void DeviceResetPeakStats(const Place& place) {
  if (place.is_cuda()) NoCuda(place);
}
void DeviceEmptyCache(const Place& place) {
  if (place.is_cuda()) NoCuda(place);
}
int64_t DeviceMallocCount() { return 0; }
void CopyHostToDeviceAsync(const Place& dst_place, void*, const void*, size_t) {
  NoCuda(dst_place);
}
std::string DeviceUuid(const Place& place) { NoCuda(place); }
void* DeviceEventCreate(const Place& place) { NoCuda(place); }
void DeviceEventDestroy(const Place&, void*) {}
void DeviceEventRecord(const Place& place, void*, void*) { NoCuda(place); }
void DeviceStreamWaitEvent(const Place& place, void*, void*) { NoCuda(place); }
bool DeviceEventDone(const Place& place, void*) { NoCuda(place); }
void DeviceCopyOnStreamAfterCompute(const Place& place, void*, const void*, size_t, void*) {
  NoCuda(place);
}

struct CudaGraph::Impl {};
CudaGraph::CudaGraph(const Place& place) : place_(place) {
  NoCuda(place.is_cuda() ? place : CUDAPlace(0));
}
CudaGraph::~CudaGraph() = default;
void CudaGraph::BeginCapture(const std::vector<std::pair<void*, size_t>>&) { NoCuda(place_); }
void CudaGraph::EndCapture() { NoCuda(place_); }
void CudaGraph::AbortCapture() noexcept {}
bool CudaGraph::capturing() const { return false; }
bool CudaGraph::ready() const { return false; }
void* CudaGraph::Input(size_t) { NoCuda(place_); }
void CudaGraph::WaitInputs() { NoCuda(place_); }
void CudaGraph::Launch() { NoCuda(place_); }
#endif

}  // namespace keel
