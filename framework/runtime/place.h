// Place: where a tensor lives. CPUPlace or CUDAPlace(device id).
#pragma once

#include <ostream>
#include <string>

namespace keel {

struct Place {
  enum class Kind : int { kCPU = 0, kCUDA = 1 };
  Kind kind = Kind::kCPU;
  int device = 0;

  bool is_cpu() const { return kind == Kind::kCPU; }
  bool is_cuda() const { return kind == Kind::kCUDA; }
  bool operator==(const Place& o) const { return kind == o.kind && device == o.device; }
  bool operator!=(const Place& o) const { return !(*this == o); }
  std::string str() const {
    return is_cpu() ? "CPUPlace" : "CUDAPlace(" + std::to_string(device) + ")";
  }
};

inline Place CPUPlace() { return Place{Place::Kind::kCPU, 0}; }
inline Place CUDAPlace(int device) { return Place{Place::Kind::kCUDA, device}; }
inline std::ostream& operator<<(std::ostream& os, const Place& p) { return os << p.str(); }

// True when keel's CUDA backend opens (framework/runtime/cuda_backend.h) and at least one device
// is visible; CudaDeviceCount is 0 without the backend.
bool CudaAvailable();
int CudaDeviceCount();

}  // namespace keel
