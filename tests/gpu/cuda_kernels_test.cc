// GPU tests (ctest label `gpu`): every CUDA kernel against its CPU twin on the same random inputs,
// forward and gradient; the built-in models on CUDAPlace(0) against CPUPlace; steady-state steps
// without cudaMalloc; the out-of-memory message; copies between places. Each test skips with a
// message when this machine has no CUDA device (or keel was built without CUDA).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "executor/executor.h"
#include "framework/runtime/device.h"
#include "models/model_zoo.h"
#include "tests/util/gpu_test_util.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel::testing {
namespace {

Tensor Labels(const DDim& d, int64_t classes, uint64_t seed = 3) {
  Tensor t(DType::kInt64, d);
  uint64_t s = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t.data<int64_t>()[i] = static_cast<int64_t>((s >> 33) % classes);
  }
  return t;
}

struct GpuCase {
  OpCase op;
  double tol;  // 1e-5 element-wise, 1e-4 GEMM/conv/reductions
};

std::vector<GpuCase> Cases() {
  std::vector<GpuCase> v;
  auto add = [&](OpCase c, double tol = 1e-5) { v.push_back({std::move(c), tol}); };
  for (const char* act : {"relu", "tanh", "sigmoid"}) add(Op(act, act, {{"X", {R({17, 33})}}}));
  {  // NaN passes through relu (forward and gradient) on both places.
    Tensor x = R({9, 8});
    for (int i : {0, 13, 50}) x.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    add(Op("relu_nan", "relu", {{"X", {x}}}));
  }
  add(Op("gelu", "gelu", {{"X", {R({17, 33}, -3, 3)}}}, {{"Out", 1}}, {{"approximate", false}}));
  add(Op("gelu_tanh", "gelu", {{"X", {R({17, 33}, -3, 3)}}}, {{"Out", 1}},
         {{"approximate", true}}));
  add(Op("leaky_relu", "leaky_relu", {{"X", {R({9, 8})}}}, {{"Out", 1}}, {{"alpha", 0.1f}}));
  add(Op("clip", "clip", {{"X", {R({9, 8})}}}, {{"Out", 1}}, {{"min", -0.5f}, {"max", 0.5f}}));
  add(Op("softmax_last", "softmax", {{"X", {R({8, 37}, -4, 4)}}}, {{"Out", 1}}, {{"axis", -1}}));
  add(Op("softmax_mid", "softmax", {{"X", {R({3, 5, 7}, -4, 4)}}}, {{"Out", 1}}, {{"axis", 1}}));
  add(Op("softmax_long", "softmax", {{"X", {R({4, 1000}, -4, 4)}}}, {{"Out", 1}}, {{"axis", -1}}));
  add(Op("log_softmax", "log_softmax", {{"X", {R({6, 300}, -4, 4)}}}, {{"Out", 1}},
         {{"axis", -1}}));
  add(Op("mul", "mul", {{"X", {R({16, 24})}}, {"Y", {R({24, 40}, -1, 1, 2)}}}), 1e-4);
  add(Op("mul_flatten", "mul", {{"X", {R({2, 3, 4, 5})}}, {"Y", {R({20, 6}, -1, 1, 2)}}},
         {{"Out", 1}}, {{"x_num_col_dims", 2}}),
      1e-4);
  for (bool tx : {false, true})
    for (bool ty : {false, true}) {
      DDim xd = tx ? DDim{3, 8, 5} : DDim{3, 5, 8}, yd = ty ? DDim{3, 6, 8} : DDim{3, 8, 6};
      add(Op(std::string("matmul_batched_") + (tx ? "T" : "N") + (ty ? "T" : "N"), "matmul",
             {{"X", {R(xd)}}, {"Y", {R(yd, -1, 1, 2)}}}, {{"Out", 1}},
             {{"transpose_X", tx}, {"transpose_Y", ty}, {"alpha", 0.5f}}),
          1e-4);
      DDim y2 = ty ? DDim{6, 8} : DDim{8, 6};
      add(Op(std::string("matmul_shared_y_") + (tx ? "T" : "N") + (ty ? "T" : "N"), "matmul",
             {{"X", {R(xd)}}, {"Y", {R(y2, -1, 1, 2)}}}, {{"Out", 1}},
             {{"transpose_X", tx}, {"transpose_Y", ty}}),
          1e-4);
    }
  for (const char* ew : {"elementwise_add", "elementwise_sub", "elementwise_mul"}) {
    add(Op(std::string(ew) + "_same", ew, {{"X", {R({7, 9})}}, {"Y", {R({7, 9}, -1, 1, 2)}}}));
    add(Op(std::string(ew) + "_bias", ew, {{"X", {R({7, 9})}}, {"Y", {R({9}, -1, 1, 2)}}}), 1e-4);
    add(Op(std::string(ew) + "_axis1", ew, {{"X", {R({2, 3, 4, 5})}}, {"Y", {R({3}, -1, 1, 2)}}},
           {{"Out", 1}}, {{"axis", 1}}),
        1e-4);
  }
  // The bias gradient's three shapes of sum: few terms per element of Y (above), many terms
  // with Y in the middle (a block per element), and a Y large enough for a thread each.
  add(Op("elementwise_add_channel_bias", "elementwise_add",
         {{"X", {R({4, 3, 50})}}, {"Y", {R({3}, -1, 1, 2)}}}, {{"Out", 1}}, {{"axis", 1}}),
      1e-4);
  add(Op("elementwise_add_wide_bias", "elementwise_add",
         {{"X", {R({70, 16400})}}, {"Y", {R({16400}, -1, 1, 2)}}}),
      1e-4);
  add(Op("elementwise_div", "elementwise_div", {{"X", {R({7, 9})}}, {"Y", {R({9}, 0.5, 2, 2)}}}),
      1e-4);
  add(Op("sum", "sum", {{"X", {R({5, 6}), R({5, 6}, -1, 1, 2), R({5, 6}, -1, 1, 3)}}}));
  add(Op("scale", "scale", {{"X", {R({5, 6})}}}, {{"Out", 1}},
         {{"scale", 2.5f}, {"bias", 0.5f}, {"bias_after_scale", false}}));
  // Ops that may run through the host fallback still must agree with the CPU.
  add(Op("mean", "mean", {{"X", {R({13, 7})}}}), 1e-4);
  add(Op("reduce_sum", "reduce_sum", {{"X", {R({4, 5, 6})}}}, {{"Out", 1}},
         {{"dim", std::vector<int>{1}}}),
      1e-4);
  add(Op("cross_entropy", "cross_entropy",
         {{"X", {R({8, 5}, 0.1, 1)}}, {"Label", {Labels({8, 1}, 5)}}}, {{"Y", 1}}));
  add(Op("softmax_with_cross_entropy", "softmax_with_cross_entropy",
         {{"Logits", {R({8, 5}, -3, 3)}}, {"Label", {Labels({8, 1}, 5)}}},
         {{"Softmax", 1}, {"Loss", 1}}),
      1e-4);
  add(Op("layer_norm", "layer_norm",
         {{"X", {R({6, 16})}}, {"Scale", {R({16}, 0.5, 1.5, 2)}}, {"Bias", {R({16}, -1, 1, 3)}}},
         {{"Y", 1}, {"Mean", 1}, {"Variance", 1}}, {{"begin_norm_axis", 1}}),
      1e-4);
  add(Op("transpose", "transpose", {{"X", {R({2, 3, 4})}}}, {{"Out", 1}},
         {{"axis", std::vector<int>{2, 0, 1}}}));
  add(Op("conv2d", "conv2d",
         {{"Input", {R({2, 3, 8, 8})}}, {"Filter", {R({4, 3, 3, 3}, -1, 1, 2)}}}, {{"Output", 1}},
         {{"paddings", std::vector<int>{1, 1}}}),
      1e-4);
  add(Op("pool2d_max", "pool2d", {{"X", {R({2, 3, 8, 8})}}}, {{"Out", 1}},
         {{"pooling_type", std::string("max")},
          {"ksize", std::vector<int>{2, 2}},
          {"strides", std::vector<int>{2, 2}}}),
      1e-4);
  return v;
}

TEST(CudaKernels, EveryCaseMatchesItsCpuTwinForwardAndGrad) {
  SKIP_WITHOUT_GPU();
  for (GpuCase& gc : Cases()) {
    const OpCase& c = gc.op;
    SCOPED_TRACE(Describe(c));
    auto cpu = RunForward(c, CPUPlace());
    auto gpu = RunForward(c, CUDAPlace(0));
    for (auto& [slot, ts] : cpu)
      for (size_t i = 0; i < ts.size(); ++i) {
        ASSERT_EQ(gpu[slot][i].dims(), ts[i].dims()) << slot;
        EXPECT_LT(MaxRelErr(gpu[slot][i], ts[i]), gc.tol) << "forward " << slot << "[" << i << "]";
      }
    auto gcpu = RunGrads(c, CPUPlace());
    auto ggpu = RunGrads(c, CUDAPlace(0));
    for (auto& [name, g] : gcpu) {
      ASSERT_TRUE(ggpu.count(name)) << name;
      EXPECT_LT(MaxRelErr(ggpu[name], g), gc.tol) << "gradient of " << name;
    }
  }
}

TEST(CudaKernels, DropoutMaskOnTheGpuEqualsTheCpuMask) {
  SKIP_WITHOUT_GPU();
  OpCase c = Op("dropout", "dropout", {{"X", {R({33, 65})}}}, {{"Out", 1}, {"Mask", 1}},
                {{"dropout_prob", 0.3f}, {"seed", 77}});
  auto cpu = RunForward(c, CPUPlace());
  auto gpu = RunForward(c, CUDAPlace(0));
  EXPECT_EQ(ToDouble(cpu["Mask"][0]), ToDouble(gpu["Mask"][0]));
  EXPECT_LT(MaxRelErr(gpu["Out"][0], cpu["Out"][0]), 1e-6);
}

TEST(CudaModels, ThirtyStepsOnTheGpuFollowTheCpuLosses) {
  SKIP_WITHOUT_GPU();
  ExpectGpuTrainsLikeCpu("mlp", 32, 0, 1e-4);
  ExpectGpuTrainsLikeCpu("transformer", 32, 0, 1e-4, 1e-2);
  ExpectGpuTrainsLikeCpu("resnet", 8, 0.005f, 0.1, 5e-2);
}

TEST(CudaRuntime, SteadyStateStepsCallCudaMallocZeroTimes) {
  SKIP_WITHOUT_GPU();
  models::ModelConfig cfg;
  cfg.seed = 1;
  models::TrainableModel m = models::BuildModel(cfg);
  Executor exe(CUDAPlace(0));
  exe.Run(*m.startup);
  FeedMap feed;
  m.next_batch(128, &feed);
  for (int s = 0; s < 3; ++s) exe.Run(*m.main, feed, {m.loss});
  const int64_t before = DeviceMallocCount();
  for (int s = 0; s < 20; ++s) exe.Run(*m.main, feed, {m.loss});
  EXPECT_EQ(DeviceMallocCount(), before) << "cudaMalloc in steady state";
  AllocatorStats st = DeviceAllocatorStats(CUDAPlace(0));
  EXPECT_GT(st.peak_in_use_bytes, 0u);
}

TEST(CudaRuntime, OutOfMemoryNamesBytesCacheAndFlag) {
  SKIP_WITHOUT_GPU();
  Tensor huge;
  std::string msg = ErrorOf([&] { huge.Alloc(DType::kFloat32, {int64_t(1) << 40}, CUDAPlace(0)); });
  ExpectContainsAll(msg, {"out of memory on CUDAPlace(0)", "asked for", "in use", "cached",
                          "FLAGS_fraction_of_gpu_memory_to_use"});
}

// K == 0: out = X * Y is all zeros; cuBLAS refuses the zero leading dimension, so the GEMM must
// write the zeros itself (on the CPU twin too).
TEST(CudaKernels, GemmWithAnEmptyContractionWritesZeros) {
  SKIP_WITHOUT_GPU();
  for (const char* type : {"mul", "matmul"}) {
    SCOPED_TRACE(type);
    OpCase c = Op(type, type, {{"X", {R({4, 0})}}, {"Y", {R({0, 6}, -1, 1, 2)}}});
    const Tensor cpu = RunForward(c)["Out"][0];
    const Tensor gpu = RunForward(c, CUDAPlace(0))["Out"][0];
    ASSERT_EQ(gpu.dims(), (DDim{4, 6}));
    EXPECT_EQ(ToDouble(gpu), ToDouble(cpu));
    for (double v : ToDouble(gpu)) EXPECT_EQ(v, 0.0);
  }
}

// The DSL's learning rate is float32 whatever the parameters' dtype: float64 sgd and momentum
// read it as the CPU's item<T>() does.
TEST(CudaKernels, Float64OptimizersTakeAFloat32LearningRate) {
  SKIP_WITHOUT_GPU();
  const DType f64 = DType::kFloat64;
  const Tensor lr = Tensor::FromVector<float>({0.1f}, {1});
  std::vector<OpCase> cases = {
      Op("sgd", "sgd",
         {{"Param", {R({5, 3}, -1, 1, 1, f64)}},
          {"Grad", {R({5, 3}, -1, 1, 2, f64)}},
          {"LearningRate", {lr}}},
         {{"ParamOut", 1}}),
      Op("momentum", "momentum",
         {{"Param", {R({5, 3}, -1, 1, 1, f64)}},
          {"Grad", {R({5, 3}, -1, 1, 2, f64)}},
          {"Velocity", {R({5, 3}, -1, 1, 3, f64)}},
          {"LearningRate", {lr}}},
         {{"ParamOut", 1}, {"VelocityOut", 1}}, {{"mu", 0.9f}, {"use_nesterov", true}})};
  for (const OpCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto cpu = RunForward(c), gpu = RunForward(c, CUDAPlace(0));
    for (auto& kv : cpu) EXPECT_LE(MaxRelErr(gpu.at(kv.first)[0], kv.second[0]), 1e-12) << kv.first;
  }
}

TEST(CudaRuntime, TensorsCopyBetweenPlacesExactly) {
  SKIP_WITHOUT_GPU();
  Tensor a = R({1000, 3});
  Tensor d = a.Clone(CUDAPlace(0));
  Tensor d2 = d.Clone();  // device to device
  Tensor back = d2.Clone(CPUPlace());
  EXPECT_EQ(ToDouble(back), ToDouble(a));
}

}  // namespace
}  // namespace keel::testing
