// Kernel choice for CUDA places, checked without a GPU: an op with a CUDA kernel gets it; an op
// without one runs its CPU kernel on host copies while FLAGS_cuda_host_fallback allows, and is an
// error naming the op and the flag when it does not.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include "framework/op/execution_context.h"
#include "framework/op/op_registry.h"

DECLARE_bool(cuda_host_fallback);

namespace keel {
namespace {

// An op with a CPU kernel only (every built-in op has a CUDA kernel or is on its way to one).
template <typename T>
class HostOnlyKernel : public OpKernel {
 public:
  void Compute(ExecutionContext&) override {}
};

}  // namespace

KEEL_REGISTER_OP(host_only_test_op).Doc("a test op with only a CPU kernel").Output("Out", "any");
KEEL_REGISTER_CPU_KERNEL(host_only_test_op, HostOnlyKernel, float);

namespace {

TEST(HostFallback, CudaKernelsAreRegisteredForTheHotOps) {
#ifndef KEEL_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#endif
  for (const char* type :
       {"mul", "mul_grad", "matmul", "elementwise_add", "elementwise_add_grad", "tanh", "tanh_grad",
        "relu", "softmax", "softmax_grad", "sgd", "momentum", "adam", "adamw", "sum", "scale"})
    EXPECT_TRUE(OpRegistry::HasKernel(type, Place::Kind::kCUDA, DType::kFloat32)) << type;
  for (const char* type : {"accuracy", "lookup_table", "layer_norm", "dropout", "cross_entropy"})
    EXPECT_TRUE(OpRegistry::HasKernel(type, Place::Kind::kCUDA, DType::kFloat32)) << type;
}

TEST(HostFallback, OpWithoutCudaKernelFallsBackOnlyWhileTheFlagAllows) {
#ifndef KEEL_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#endif
  const std::string type = "host_only_test_op";
  ASSERT_FALSE(OpRegistry::HasKernel(type, Place::Kind::kCUDA, DType::kFloat32));
  OpDesc op(type);
  EXPECT_NE(OpRegistry::CreateKernel(op, CUDAPlace(0), DType::kFloat32), nullptr);
  FLAGS_cuda_host_fallback = false;
  try {
    OpRegistry::CreateKernel(op, CUDAPlace(0), DType::kFloat32);
    ADD_FAILURE() << "no error with FLAGS_cuda_host_fallback=false";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op host_only_test_op"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("FLAGS_cuda_host_fallback=false"), std::string::npos)
        << e.what();
  }
  FLAGS_cuda_host_fallback = true;
}

}  // namespace
}  // namespace keel
