// The cuDNN ops' decisions that need no device (ops/cudnn_plan.h, ops/algo_cache.h, the batch_norm
// statistics functors): which searched convolution algorithm is used, which pool2d configurations
// are refused on CUDA and how, that an algorithm search runs once per shape, and the
// moving-variance update the cuDNN batch_norm makes from cuDNN's saved inverse std.
#include "ops/cudnn_plan.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "framework/error.h"
#include "ops/algo_cache.h"
#include "ops/functors/norm_functors.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;
using testing::ExpectContainsAll;

ConvAlgoPerf Perf(int algo, size_t ws, bool det, bool tf32, bool ok = true) {
  ConvAlgoPerf p;
  p.algo = algo;
  p.ok = ok;
  p.workspace_bytes = ws;
  p.deterministic = det;
  p.math_type = tf32 ? 0 : 3;
  p.uses_tf32 = tf32;
  return p;
}

TEST(PickConvAlgo, TakesTheFastestUsableInCudnnsOrder) {
  // cuDNN's order: fastest first. A failed search, too much workspace, TF32 and (when asked)
  // nondeterminism each rule an entry out.
  const std::vector<ConvAlgoPerf> perfs = {Perf(7, 0, true, false, /*ok=*/false),
                                           Perf(6, 2 << 20, true, false), Perf(5, 0, true, true),
                                           Perf(4, 0, false, false), Perf(1, 1 << 20, true, false)};
  const size_t mb = 1 << 20;
  EXPECT_EQ(PickConvAlgo(perfs, mb, false, false, "conv2d forward", "").algo, 4);
  EXPECT_EQ(PickConvAlgo(perfs, mb, true, false, "conv2d forward", "").algo, 1);
  EXPECT_EQ(PickConvAlgo(perfs, mb, false, true, "conv2d forward", "").algo, 5);
  EXPECT_EQ(PickConvAlgo(perfs, 4 * mb, true, false, "conv2d forward", "").algo, 6);
  const ConvAlgoChoice c = PickConvAlgo(perfs, mb, true, false, "conv2d forward", "");
  EXPECT_EQ(c.workspace_bytes, mb);
  EXPECT_EQ(c.math_type, 3);
}

TEST(PickConvAlgo, NoUsableAlgorithmNamesTheOpShapesAndFlags) {
  const std::vector<ConvAlgoPerf> perfs = {Perf(1, 8 << 20, true, false), Perf(2, 0, false, false),
                                           Perf(3, 0, true, true)};
  std::string msg = ErrorOf([&] {
    PickConvAlgo(perfs, 1 << 20, true, false, "conv2d_grad (Filter@GRAD)",
                 "(Input [2, 3, 8, 8], Filter [4, 3, 3, 3], groups 1)");
  });
  ExpectContainsAll(msg, {"conv2d_grad (Filter@GRAD)", "Input [2, 3, 8, 8]",
                          "FLAGS_conv_workspace_size_limit=1 MB", "FLAGS_cudnn_deterministic",
                          "FLAGS_allow_tf32", "3 returned"});
}

TEST(CudnnPoolUnsupported, CeilModeIsRefusedOnlyWhereItAddsAWindow) {
  const std::vector<int> k2{2, 2}, s2{2, 2}, p0{0, 0};
  // 8 / 2: floor and ceil agree, cuDNN pools it.
  EXPECT_EQ(CudnnPoolUnsupported({2, 3, 8, 8}, k2, s2, p0, false, true), "");
  // 7 / 2: ceil_mode adds a partial fourth window.
  std::string why = CudnnPoolUnsupported({2, 3, 7, 8}, k2, s2, p0, false, true);
  ExpectContainsAll(why, {"ceil_mode=true", "height 7", "4 windows instead of 3"});
  EXPECT_EQ(CudnnPoolUnsupported({2, 3, 7, 8}, k2, s2, p0, false, false), "");
  // Global pooling ignores window and padding.
  EXPECT_EQ(CudnnPoolUnsupported({2, 3, 7, 5}, k2, s2, {3, 3}, true, true), "");
}

TEST(CudnnPoolUnsupported, PaddingAsLargeAsTheWindowIsRefused) {
  ExpectContainsAll(CudnnPoolUnsupported({1, 1, 6, 6}, {2, 2}, {1, 1}, {2, 0}, false, false),
                    {"paddings {2, 0}", "ksize {2, 2}"});
  EXPECT_EQ(CudnnPoolUnsupported({1, 1, 6, 6}, {3, 3}, {1, 1}, {1, 1}, false, false), "");
}

TEST(AlgoCache, SearchesOncePerShapeEvenUnderConcurrentCallers) {
  AlgoCache<int> cache;
  std::atomic<int> calls{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        const int64_t shape = i % 3;
        EXPECT_EQ(cache.GetOrSearch({1, shape},
                                    [&] {
                                      ++calls;
                                      return static_cast<int>(10 + shape);
                                    }),
                  10 + shape);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(cache.searches(), 3);
  EXPECT_EQ(cache.size(), 3u);
}

TEST(AlgoCache, AFailedSearchIsNotRemembered) {
  AlgoCache<int> cache;
  EXPECT_THROW(cache.GetOrSearch({7}, []() -> int { KEEL_THROW("no algorithm"); }), Error);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.GetOrSearch({7}, [] { return 3; }), 3);
}

// The cuDNN batch_norm recovers the biased batch variance from the saved inverse std (in T) and
// updates the moving variance with the CPU formula; the round trip loses no more than T's precision
// times (var + epsilon).
TEST(BatchNormFunctors, VarianceFromTheSavedInverseStdRoundTrips) {
  for (double var : {0.0, 1e-7, 1e-3, 0.5, 1.0, 37.0, 4e4})
    for (double eps : {1e-5, 1e-3}) {
      const float inv = static_cast<float>(fn::InvStd(var, eps));
      const double back = fn::VarianceFromInvStd(inv, eps);
      EXPECT_NEAR(back, var, 3e-7 * (var + eps)) << "var " << var << " eps " << eps;
    }
  EXPECT_EQ(fn::MovingStat(0.9, 2.0f, 1.0), static_cast<float>(0.9 * 2.0 + 0.1 * 1.0));
  EXPECT_EQ(fn::MovingStat(0.0, 2.0, 1.0), 1.0);
  EXPECT_EQ(fn::MovingStat(1.0, 2.0, 1.0), 2.0);
}

}  // namespace
}  // namespace keel
