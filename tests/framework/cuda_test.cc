// CUDA places: memory round trips when a device is present; everything else skips cleanly.
#include <gtest/gtest.h>

#include "executor/executor.h"
#include "framework/runtime/tensor.h"

namespace keel {
namespace {

TEST(Cuda, TensorRoundTripsThroughDeviceMemory) {
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device visible (or keel built without CUDA)";
  Tensor host = Tensor::FromVector<float>({1, 2, 3, 4}, {2, 2});
  Tensor dev = host.Clone(CUDAPlace(0));
  EXPECT_TRUE(dev.place().is_cuda());
  Tensor back = dev.Clone(CPUPlace());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back.data<float>()[i], host.data<float>()[i]);
}

TEST(Cuda, WithoutADeviceCudaPlacesAreAClearError) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(Tensor(DType::kFloat32, {4}, CUDAPlace(0)), Error);
  EXPECT_THROW(Executor(CUDAPlace(0)), Error);
}

}  // namespace
}  // namespace keel
