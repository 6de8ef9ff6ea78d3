// HostFallbackKernel: runs an op's CPU kernel for a CUDA place, on host copies of its tensors.
//
// Caffe's Forward_gpu falls back to Forward_cpu so a layer runs everywhere before its GPU kernel
// exists; this is keel's version. Inputs (and outputs that already hold data, such as a slice of
// a fused buffer) are copied to the host, the CPU kernel runs, and every output is copied back
// into its device tensor's own allocation. It synchronises the device, so it is only for ops that
// run rarely or need the host anyway (lr schedules, counters, metrics). FLAGS_cuda_host_fallback
// (on by default) allows it; off, such an op is an error naming it. The executor asks the
// registry, which wraps the CPU kernel when no CUDA kernel is registered.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "framework/op/op_registry.h"

namespace keel {

// Whether FLAGS_cuda_host_fallback allows running `op_type`'s CPU kernel for a CUDA place.
bool CudaHostFallbackAllowed();

std::unique_ptr<OpKernel> MakeHostFallbackKernel(std::unique_ptr<OpKernel> cpu_kernel,
                                                 const std::string& op_type);

}  // namespace keel
