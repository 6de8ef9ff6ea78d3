// keel's CUDA half — the CUDA runtime, cuBLAS, cuDNN and NCCL, and every CUDA kernel — is its own
// library, libkeel_cuda, which libkeel opens the first time something asks for a CUDA place
// (CudaAvailable, an executor, a tensor, a kernel or a ring on one), as TensorFlow's stream
// executor opens the CUDA libraries at run time. libkeel itself needs none of them: a machine
// without CUDA installs and runs keel on its CPUs, and one with GPUs uses them. Where the
// library, or a CUDA library it needs, cannot be opened, a CUDA place is refused with a
// keel::Error that names the place and gives the loader's reason.
//
// The library is looked for beside libkeel (libkeel_cuda.so.<major.minor>), then through the
// loader's search path; KEEL_CUDA_LIBRARY names another file, and KEEL_CUDA_LIBRARY=none turns
// CUDA off.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "framework/runtime/caching_allocator.h"
#include "framework/runtime/cuda_graph.h"
#include "framework/runtime/place.h"

namespace keel {

// What libkeel asks of a CUDA device; libkeel_cuda implements it (framework/runtime/
// cuda_runtime.cc). The device.h and allocator.h functions forward here for CUDA places.
class CudaBackend {
 public:
  virtual ~CudaBackend() = default;
  virtual int DeviceCount() = 0;
  virtual void* Malloc(int device, size_t size) = 0;
  virtual void Free(int device, void* p) = 0;
  // Between host and device or two devices (device.h's MemCopy contract).
  virtual void MemCopy(const Place& dst_place, void* dst, const Place& src_place, const void* src,
                       size_t size) = 0;
  virtual void Synchronize(const Place& place) = 0;
  virtual AllocatorStats Stats(const Place& place) = 0;
  virtual void ResetPeakStats(const Place& place) = 0;
  virtual void EmptyCache(const Place& place) = 0;
  virtual int64_t MallocCount() = 0;
  virtual void CopyHostToDeviceAsync(const Place& dst_place, void* dst, const void* src,
                                     size_t size) = 0;
  virtual std::string Uuid(const Place& place) = 0;
  virtual void* EventCreate(const Place& place) = 0;
  virtual void EventDestroy(const Place& place, void* event) = 0;
  virtual void EventRecord(const Place& place, void* event, void* stream) = 0;
  virtual void StreamWaitEvent(const Place& place, void* stream, void* event) = 0;
  virtual bool EventDone(const Place& place, void* event) = 0;
  virtual void CopyOnStreamAfterCompute(const Place& place, void* dst, const void* src, size_t size,
                                        void* stream) = 0;
  virtual std::unique_ptr<CudaGraph> NewGraph(const Place& place) = 0;
};

// The backend, opening libkeel_cuda on the first call (thread-safe); nullptr when there is none.
CudaBackend* GetCudaBackend();
// The backend for CUDA place `place`; a keel::Error naming the place and why there is none.
CudaBackend& CudaBackendFor(const Place& place);
// Why GetCudaBackend() gives nullptr; "" when it does not.
std::string CudaBackendError();
// libkeel_cuda calls this from a static initializer as it is opened.
void RegisterCudaBackend(CudaBackend* backend);

}  // namespace keel
