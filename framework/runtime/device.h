// What code without CUDA headers (executor, tests, the CLI) may ask of a device. In a build
// without CUDA these throw for a CUDA place (none can exist) and do nothing for CPUPlace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "framework/runtime/caching_allocator.h"
#include "framework/runtime/place.h"

namespace keel {

// Waits until every kernel and copy queued on the place's compute stream has finished.
void DeviceSynchronize(const Place& place);
// The caching allocator's statistics for a CUDA place (zeros for CPUPlace).
AllocatorStats DeviceAllocatorStats(const Place& place);
void DeviceResetPeakStats(const Place& place);
// Gives the place's wholly free cached segments back to the driver.
void DeviceEmptyCache(const Place& place);
// cudaMalloc calls this process made for the caching allocator, over all devices.
int64_t DeviceMallocCount();

// Copies `size` bytes from host memory `src` to CUDA memory `dst` on the device's compute
// stream, staged through pinned memory, without waiting for the copy: `src` may be reused as
// soon as this returns.
void CopyHostToDeviceAsync(const Place& dst_place, void* dst, const void* src, size_t size);

// The GPU's UUID ("GPU-xxxxxxxx-..."), the same in every process that sees it, whatever
// CUDA_VISIBLE_DEVICES numbers it as.
std::string DeviceUuid(const Place& place);

// CUDA events and streams as opaque handles, for code without the CUDA headers (the executor's
// event plan). A null `stream` is the place's compute stream. Recording and waiting enqueue work
// on a stream; neither blocks the host.
void* DeviceEventCreate(const Place& place);
void DeviceEventDestroy(const Place& place, void* event);
void DeviceEventRecord(const Place& place, void* event, void* stream);
// Work enqueued on `stream` after this waits until `event`'s last recording has completed.
void DeviceStreamWaitEvent(const Place& place, void* stream, void* event);
// Whether the work before `event`'s last recording has completed (does not block).
bool DeviceEventDone(const Place& place, void* event);
// Copies `size` bytes between two buffers of the place on `stream` (a ring's), after the work
// queued on the compute stream so far: for a collective whose input must first be copied to its
// output, which the compute stream may still be writing.
void DeviceCopyOnStreamAfterCompute(const Place& place, void* dst, const void* src, size_t size,
                                    void* stream);

}  // namespace keel
