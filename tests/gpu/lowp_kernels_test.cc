// GPU twins (ctest label `gpu`) of tests/ops/lowp_ops_test.cc: every case of LowpCases() in
// bfloat16 and float16 on CUDAPlace(0) against the float32 kernels on the CPU from the same
// (rounded) inputs, forward and gradient (cuBLAS with float32 compute on Tensor Cores, cuDNN's
// 16-bit convolutions, pooling and batch norm, the shared element-wise fronts); the device's cast
// against float16.h on every 16-bit pattern; larger GEMMs and convolutions. New allocations are
// poisoned (an element a kernel leaves unwritten fails) and the host fallback is off (a 16-bit
// kernel missing on CUDA is an error, not a silent CPU run). Skips without a device.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "framework/runtime/device.h"
#include "framework/runtime/float16.h"
#include "tests/util/gpu_test_util.h"
#include "tests/util/lowp_test_util.h"
#include "tests/util/op_test_util.h"

DECLARE_bool(init_allocated_mem);
DECLARE_bool(cuda_host_fallback);

namespace keel::testing {
namespace {

class LowpKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    FLAGS_init_allocated_mem = true;
    FLAGS_cuda_host_fallback = false;
  }
  void TearDown() override {
    FLAGS_init_allocated_mem = false;
    FLAGS_cuda_host_fallback = true;
  }
};

TEST_F(LowpKernels, EveryCaseMatchesTheCpuFloat32Kernels) {
  SKIP_WITHOUT_GPU();
  for (const LowpCase& c : LowpCases())
    for (DType dt : kHalfTypes) ExpectMatchesFloat32(c, dt, CUDAPlace(0));
}

// Shapes where cuBLAS and cuDNN pick their Tensor Core kernels.
TEST_F(LowpKernels, LargerGemmsAndConvolutions) {
  SKIP_WITHOUT_GPU();
  auto rnd = [](const DDim& d, uint64_t seed) {
    return RandomTensor(d, DType::kFloat32, -1, 1, seed);
  };
  std::vector<LowpCase> cases;
  LowpCase mm;
  mm.op =
      Op("matmul_256", "matmul", {{"X", {rnd({4, 128, 256}, 1)}}, {"Y", {rnd({4, 256, 96}, 2)}}});
  cases.push_back(mm);
  LowpCase mul;
  mul.op = Op("mul_512", "mul", {{"X", {rnd({512, 384}, 3)}}, {"Y", {rnd({384, 200}, 4)}}});
  cases.push_back(mul);
  LowpCase conv;
  conv.op = Op("conv_64", "conv2d",
               {{"Input", {rnd({8, 64, 16, 16}, 5)}}, {"Filter", {rnd({64, 64, 3, 3}, 6)}}},
               {{"Output", 1}}, {{"paddings", std::vector<int>{1, 1}}});
  cases.push_back(conv);
  // Channels last: cuDNN's NHWC Tensor Core kernels, the filter permuted for them.
  LowpCase conv_nhwc;
  conv_nhwc.op = Op("conv_64_nhwc", "conv2d",
                    {{"Input", {rnd({8, 16, 16, 64}, 7)}}, {"Filter", {rnd({64, 64, 3, 3}, 8)}}},
                    {{"Output", 1}},
                    {{"paddings", std::vector<int>{1, 1}}, {"data_format", std::string("NHWC")}});
  cases.push_back(conv_nhwc);
  for (const LowpCase& c : cases)
    for (DType dt : kHalfTypes) ExpectMatchesFloat32(c, dt, CUDAPlace(0));
}

// The device converts with its own instructions: the same values as float16.h (a NaN: a NaN).
TEST_F(LowpKernels, CastOfEveryPatternMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType dt : kHalfTypes) {
    SCOPED_TRACE(DTypeName(dt));
    Tensor bits(dt, {65536});
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint16_t v = static_cast<uint16_t>(b);
      std::memcpy(static_cast<char*>(bits.raw_data()) + 2 * b, &v, 2);
    }
    const OpCase widen =
        UnaryCase("widen", "cast", bits, {{"out_dtype", static_cast<int>(DType::kFloat32)}});
    const Tensor cpu = RunForward(widen, CPUPlace())["Out"][0];
    const Tensor gpu = RunForward(widen, CUDAPlace(0))["Out"][0];
    for (int64_t i = 0; i < 65536; ++i) {
      const float a = cpu.data<float>()[i], b = gpu.data<float>()[i];
      if (std::isnan(a)) {
        ASSERT_TRUE(std::isnan(b)) << i;
      } else {
        ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << i;
      }
    }
    // Random float32 bits narrowed.
    std::mt19937 rng(5);
    std::vector<float> v(100003);
    for (float& f : v) {
      uint32_t u = static_cast<uint32_t>(rng());
      u = (u & 0x807fffffu) | ((100u + u % 60u) << 23);
      std::memcpy(&f, &u, 4);
    }
    const OpCase narrow = UnaryCase("narrow", "cast", Tensor::FromVector(v, {100003}),
                                    {{"out_dtype", static_cast<int>(dt)}});
    const std::vector<double> c = ValuesOf(RunForward(narrow, CPUPlace())["Out"][0]);
    const std::vector<double> g = ValuesOf(RunForward(narrow, CUDAPlace(0))["Out"][0]);
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(c[i], g[i]) << v[i];
  }
}

}  // namespace
}  // namespace keel::testing
