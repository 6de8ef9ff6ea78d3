// GPU flags (defined in every build, so a CPU build accepts the seed's FLAGS_ environment), and
// device.h for builds without CUDA.
#include "framework/runtime/device.h"

#include <gflags/gflags.h>

#include "framework/error.h"

DEFINE_double(fraction_of_gpu_memory_to_use, 0.0,
              "Fraction of each GPU's memory the caching allocator reserves up front, as Paddle "
              "does (0 allocates on demand; later needs grow the cache in either case).");
DEFINE_bool(allow_tf32, false,
            "Let cuBLAS and cuDNN use TF32 tensor cores for float32 matmul and conv (faster, about "
            "10 bits of mantissa); off: full float32.");

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
#endif

}  // namespace keel
