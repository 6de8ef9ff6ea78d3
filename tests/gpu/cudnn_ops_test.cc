// GPU tests (ctest label `gpu`) of the cuDNN ops (ops/conv_ops.cu, pool_ops.cu, batch_norm_ops.cu):
// conv2d, pool2d, batch_norm and sync_batch_norm (alone) against their CPU twins on the same random
// inputs, every output forward and every input's gradient, with the device cache poisoned with NaN
// first so an output a kernel leaves unwritten shows; pool2d's refusals; one algorithm search per
// shape; LeNet and ResNet-20 training 30 steps on CUDAPlace(0) like on the CPU, and bit for bit
// like themselves with FLAGS_cudnn_deterministic. Each test skips with a message when no CUDA
// device is visible.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "executor/executor.h"
#include "framework/runtime/device.h"
#include "models/model_zoo.h"
#include "ops/cudnn_plan.h"
#include "tests/util/gpu_test_util.h"
#include "tests/util/grad_checker.h"
#include "tests/util/image_op_cases.h"
#include "tests/util/op_test_util.h"
#include "tests/util/test_data.h"

DECLARE_bool(cudnn_deterministic);
DECLARE_bool(cudnn_exhaustive_search);

namespace keel::testing {
namespace {

// Fills 64 MB of the device's caching allocator with NaN and frees it, so the outputs of the next
// kernels land in NaN memory: an element a kernel does not write fails the comparison.
void PoisonDeviceCache() {
  const int64_t n = int64_t(16) << 20;
  Tensor host(DType::kFloat32, {n});
  std::fill(host.data<float>(), host.data<float>() + n, std::numeric_limits<float>::quiet_NaN());
  Tensor dev = host.Clone(CUDAPlace(0));
  DeviceSynchronize(CUDAPlace(0));
}

struct TwinCase {
  OpCase op;
  double tol;
};

OpCase Conv(std::string name, const DDim& x, const DDim& w, std::vector<int> strides,
            std::vector<int> pads, std::vector<int> dils, int groups, DType dt = DType::kFloat32) {
  OpCase c;
  c.name = std::move(name);
  c.type = "conv2d";
  c.inputs = {{"Input", {R(x, -1, 1, 11, dt)}}, {"Filter", {R(w, -1, 1, 12, dt)}}};
  c.outputs = {{"Output", 1}};
  c.attrs = {{"strides", strides}, {"paddings", pads}, {"dilations", dils}, {"groups", groups}};
  return c;
}

OpCase BatchNorm(std::string name, const DDim& x, bool is_test, bool global_stats,
                 float momentum = 0.9f, float eps = 1e-5f, bool nhwc = false,
                 DType dt = DType::kFloat32) {
  const DDim c{x[nhwc ? x.size() - 1 : 1]};
  OpCase o;
  o.name = std::move(name);
  o.type = "batch_norm";
  o.inputs = {{"X", {R(x, -2, 3, 31, dt)}},
              {"Scale", {R(c, 0.5, 1.5, 32, dt)}},
              {"Bias", {R(c, -1, 1, 33, dt)}},
              {"Mean", {R(c, -0.5, 0.5, 34, dt)}},
              {"Variance", {R(c, 0.5, 2, 35, dt)}}};
  o.outputs = {
      {"Y", 1}, {"MeanOut", 1}, {"VarianceOut", 1}, {"SavedMean", 1}, {"SavedVariance", 1}};
  o.attrs = {{"is_test", is_test},
             {"use_global_stats", global_stats},
             {"momentum", momentum},
             {"epsilon", eps}};
  if (nhwc) o.attrs["data_layout"] = std::string("NHWC");
  o.no_grad_inputs = {"Mean", "Variance"};
  return o;
}

// The case channels last: X / Input given in [N, H, W, C].
OpCase Nhwc(OpCase c) {
  c.name += "_nhwc";
  c.attrs[c.type == "conv2d" || c.type == "pool2d" ? "data_format" : "data_layout"] =
      std::string("NHWC");
  return c;
}

std::vector<TwinCase> Cases() {
  std::vector<TwinCase> v;
  auto add = [&](OpCase c, double tol) { v.push_back({std::move(c), tol}); };
  const DType f64 = DType::kFloat64;
  add(Conv("conv_3x3_pad1", {2, 3, 8, 8}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1), 1e-4);
  add(Conv("conv_stride2_asym_pad", {2, 4, 9, 7}, {6, 4, 3, 2}, {2, 2}, {0, 1}, {1, 1}, 1), 1e-4);
  add(Conv("conv_dilation2", {1, 2, 10, 10}, {3, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 1), 1e-4);
  add(Conv("conv_groups2", {2, 4, 6, 6}, {6, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2), 1e-4);
  add(Conv("conv_depthwise", {2, 4, 6, 6}, {4, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 4), 1e-4);
  add(Conv("conv_1x1", {3, 8, 5, 5}, {16, 8, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1), 1e-4);
  add(Conv("conv_resnet_stride2", {4, 16, 16, 16}, {32, 16, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1),
      1e-4);
  add(Conv("conv_float64", {2, 3, 7, 7}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, f64), 1e-10);
  add(PoolCase("max_2x2", {2, 3, 8, 8}, "max", {2, 2}, {2, 2}, {0, 0}), 1e-6);
  add(PoolCase("max_3x3_s2_pad1", {2, 3, 9, 9}, "max", {3, 3}, {2, 2}, {1, 1}), 1e-6);
  for (bool tiled : {true, false}) {  // a NaN is the max of its windows, and takes the gradient
    OpCase c = tiled ? PoolCase("max_2x2_nan", {2, 3, 8, 8}, "max", {2, 2}, {2, 2}, {0, 0})
                     : PoolCase("max_3x3_nan", {2, 3, 9, 9}, "max", {3, 3}, {2, 2}, {1, 1});
    Tensor& x = c.inputs[0].second[0];
    for (int64_t i : {int64_t{5}, int64_t{70}, x.numel() - 3})
      x.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    add(c, 1e-6);
  }
  add(PoolCase("avg_3x3_pad1_exclusive", {2, 3, 7, 6}, "avg", {3, 3}, {1, 1}, {1, 1}), 1e-5);
  add(PoolCase("avg_3x3_pad1_inclusive", {2, 3, 7, 6}, "avg", {3, 3}, {1, 1}, {1, 1}, false, false),
      1e-5);
  add(PoolCase("avg_global", {2, 5, 8, 8}, "avg", {1, 1}, {1, 1}, {0, 0}, true), 1e-5);
  add(PoolCase("max_global", {2, 5, 7, 3}, "max", {1, 1}, {1, 1}, {0, 0}, true), 1e-6);
  add(PoolCase("max_ceil_mode_same_size", {2, 3, 8, 8}, "max", {2, 2}, {2, 2}, {0, 0}, false, true,
               true),
      1e-6);
  // Channels last (cuDNN's NHWC descriptors; the conv's filter permuted to [M, kh, kw, C / g] and
  // its gradient back), the inputs given as [N, H, W, C].
  add(Nhwc(Conv("conv_3x3_pad1", {2, 8, 8, 3}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1)), 1e-4);
  add(Nhwc(Conv("conv_stride2_asym_pad", {2, 9, 7, 4}, {6, 4, 3, 2}, {2, 2}, {0, 1}, {1, 1}, 1)),
      1e-4);
  add(Nhwc(Conv("conv_groups2", {2, 6, 6, 4}, {6, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2)), 1e-4);
  add(Nhwc(Conv("conv_resnet_stride2", {4, 16, 16, 16}, {32, 16, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1)),
      1e-4);
  add(Nhwc(Conv("conv_1x1", {3, 5, 5, 8}, {16, 8, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1)), 1e-4);
  add(Nhwc(PoolCase("max_3x3_s2_pad1", {2, 9, 9, 3}, "max", {3, 3}, {2, 2}, {1, 1})), 1e-6);
  add(Nhwc(PoolCase("avg_3x3_pad1_exclusive", {2, 7, 6, 3}, "avg", {3, 3}, {1, 1}, {1, 1})), 1e-5);
  add(Nhwc(PoolCase("avg_global", {2, 8, 8, 64}, "avg", {1, 1}, {1, 1}, {0, 0}, true)), 1e-5);
  add(BatchNorm("bn_train_nhwc", {8, 16, 16, 32}, false, false, 0.9f, 1e-5f, true), 1e-4);
  add(BatchNorm("bn_is_test_nhwc", {4, 5, 5, 3}, true, false, 0.9f, 1e-5f, true), 1e-5);
  add(BatchNorm("bn_use_global_stats_nhwc", {4, 5, 5, 3}, false, true, 0.9f, 1e-5f, true), 1e-4);
  add(BatchNorm("bn_train_nhwc_float64", {4, 5, 5, 3}, false, false, 0.9f, 1e-5f, true, f64),
      1e-10);
  // Batches whose N * H * W passes cuDNN's limits on its batch norms' N (some 880 K rows in
  // training, 64 K in inference): cuDNN must see the real batch, not the [N * H * W, C] view.
  add(BatchNorm("bn_train_nhwc_1024x32x32", {1024, 32, 32, 16}, false, false, 0.9f, 1e-5f, true),
      1e-4);
  add(BatchNorm("bn_is_test_nhwc_64x32x32", {64, 32, 32, 16}, true, false, 0.9f, 1e-5f, true),
      1e-5);
  add(BatchNorm("bn_train_nchw", {4, 3, 5, 5}, false, false), 1e-4);
  add(BatchNorm("bn_train_nc", {16, 6}, false, false, 0.5f, 1e-3f), 1e-4);
  add(BatchNorm("bn_train_wide", {8, 32, 16, 16}, false, false), 1e-4);
  add(BatchNorm("bn_is_test", {4, 3, 5, 5}, true, false), 1e-5);
  add(BatchNorm("bn_use_global_stats", {4, 3, 5, 5}, false, true), 1e-4);
  // sync_batch_norm alone in its process (no ring): keel's own kernels on CUDA (the statistics'
  // sums, then the normalization; the grad's sums, then dX) against the CPU math's synced path.
  for (auto [name, x, is_test] : std::vector<std::tuple<std::string, DDim, bool>>{
           {"sync_bn_train_nchw", {4, 3, 5, 5}, false},
           {"sync_bn_train_wide", {8, 32, 16, 16}, false},
           {"sync_bn_train_nc", {16, 6}, false},
           {"sync_bn_is_test", {4, 3, 5, 5}, true},
           {"sync_bn_train_nhwc", {4, 5, 5, 3}, false}}) {
    const bool nhwc = name.find("nhwc") != std::string::npos;
    OpCase c = BatchNorm(name, x, is_test, false, 0.9f, 1e-5f, nhwc);
    c.type = "sync_batch_norm";
    c.attrs["ring_id"] = 0;
    add(c, 1e-4);
  }
  return v;
}

// libkeel_cuda's count of cuDNN algorithm searches (0 in a build without it, where the GPU tests
// skip anyway).
int64_t ConvAlgoSearches() {
#ifdef KEEL_WITH_CUDA
  return CudnnConvAlgoSearches();
#else
  return 0;
#endif
}

TEST(CudnnOps, EveryCaseMatchesItsCpuTwinForwardAndGrad) {
  SKIP_WITHOUT_GPU();
  for (TwinCase& tc : Cases()) {
    const OpCase& c = tc.op;
    SCOPED_TRACE(Describe(c));
    auto cpu = RunForward(c, CPUPlace());
    PoisonDeviceCache();
    auto gpu = RunForward(c, CUDAPlace(0));
    for (auto& [slot, ts] : cpu)
      for (size_t i = 0; i < ts.size(); ++i) {
        ASSERT_EQ(gpu[slot][i].dims(), ts[i].dims()) << slot;
        EXPECT_LT(MaxRelErr(gpu[slot][i], ts[i]), tc.tol) << "forward " << slot;
      }
    auto gcpu = RunGrads(c, CPUPlace());
    PoisonDeviceCache();
    auto ggpu = RunGrads(c, CUDAPlace(0));
    EXPECT_FALSE(gcpu.empty());
    for (auto& [name, g] : gcpu) {
      ASSERT_TRUE(ggpu.count(name)) << name;
      EXPECT_LT(MaxRelErr(ggpu[name], g), tc.tol) << "gradient of " << name;
    }
  }
}

TEST(CudnnOps, PoolingCudnnCannotDoIsRefusedNamingTheAttribute) {
  SKIP_WITHOUT_GPU();
  std::string msg = ErrorOf([] {
    RunForward(PoolCase("ceil", {1, 2, 7, 7}, "max", {2, 2}, {2, 2}, {0, 0}, false, true, true),
               CUDAPlace(0));
  });
  ExpectErrorContainsAll(msg,
                         {"pool2d", "CUDAPlace(0)", "ceil_mode=true", "4 windows instead of 3"});
  msg = ErrorOf([] {
    RunForward(PoolCase("pad", {1, 2, 7, 7}, "avg", {2, 2}, {1, 1}, {2, 2}), CUDAPlace(0));
  });
  ExpectErrorContainsAll(msg, {"pool2d", "paddings {2, 2}", "ksize {2, 2}"});
}

// cuDNN has no channels-last float64 convolutions: refused, naming the type and the layout.
TEST(CudnnOps, Float64ChannelsLastConvolutionIsRefusedNamingTheLayout) {
  SKIP_WITHOUT_GPU();
  OpCase c = Nhwc(
      Conv("conv_float64", {2, 7, 7, 3}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, DType::kFloat64));
  ExpectErrorContainsAll(ErrorOf([&] { RunForward(c, CUDAPlace(0)); }),
                         {"conv2d", "float64", "NHWC"});
}

TEST(CudnnModels, LenetAndResnetTrainThirtyStepsLikeOnTheCpu) {
  SKIP_WITHOUT_GPU();
  if (HaveMnist())
    ExpectGpuTrainsLikeCpu("lenet", 16, 0, 1e-4);
  else
    ADD_FAILURE() << "no MNIST at " << MnistDir() << " (set KEEL_MNIST_DIR)";
  ExpectGpuTrainsLikeCpu("resnet", 16, 0.005f, 0.1, 5e-2);
}

// One ResNet step from the same state on both places: every variable the step computes, in the
// order the ops write it, against the CPU (NormRelErr). The forward agrees to 1e-4; the backward
// to 5e-2, since a ReLU input within rounding of zero can fall on the other side of the kink (on
// an H200: one element of 65,536 in the last block, 0.8% of that gradient, spread by batch norm's
// backward to at most 1.9%). Prints the first variables above 1e-4 and, for the first, its op's
// inputs and the elements that differ most, so that a GPU-only error can be traced to its op.
TEST(CudnnModels, ResnetStepIntermediatesFollowTheCpu) {
  SKIP_WITHOUT_GPU();
  gflags::FlagSaver saver;
  FLAGS_cudnn_deterministic = true;
  models::ModelConfig cfg;
  cfg.name = "resnet";
  cfg.seed = 5;
  cfg.batch_size = 16;
  models::TrainableModel m = models::BuildModel(cfg);
  Executor cpu(CPUPlace()), gpu(CUDAPlace(0));
  cpu.Run(*m.startup);
  gpu.Run(*m.startup);
  const Block& b = m.main->global_block();
  std::vector<std::string> fetch, writer;
  std::vector<const OpDesc*> writer_op;
  std::set<std::string> seen;
  for (const auto& op : b.ops())
    for (const std::string& n : op->OutputArgumentNames())
      if (n != kEmptyVarName && b.HasVar(n) && !b.FindVar(n)->persistable() &&
          seen.insert(n).second) {
        fetch.push_back(n);
        writer.push_back(op->type());
        writer_op.push_back(op.get());
      }
  for (VarDesc* v : b.AllVars()) {
    if (!v->persistable()) continue;
    const Variable* c = cpu.scope().FindVar(v->name());
    if (c != nullptr && c->tensor().initialized())
      *gpu.scope().Var(v->name())->mutable_tensor() = c->tensor().Clone(CUDAPlace(0));
  }
  FeedMap feed;
  m.next_batch(16, &feed);
  std::vector<Tensor> tc = cpu.Run(*m.main, feed, fetch);
  std::vector<Tensor> tg = gpu.Run(*m.main, feed, fetch);
  ASSERT_EQ(tc.size(), fetch.size());
  ASSERT_EQ(tg.size(), fetch.size());
  double worst = 0;
  int shown = 0;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < fetch.size(); ++i) index[fetch[i]] = i;
  for (size_t i = 0; i < fetch.size(); ++i) {
    if (tc[i].dtype() != DType::kFloat32) continue;
    const Tensor g = tg[i].Clone(CPUPlace());
    const double err = NormRelErr(g, tc[i]);
    const OpDesc& op = *writer_op[i];
    const int role = op.HasAttr(kOpRoleAttr) ? op.Attr<int>(kOpRoleAttr) : 0;
    const bool forward =
        (role & ~static_cast<int>(OpRole::kLoss)) == static_cast<int>(OpRole::kForward);
    if (forward) {
      EXPECT_LE(err, 1e-4) << fetch[i] << " (" << writer[i] << ")";
    }
    worst = std::max(worst, err);
    if (err > 1e-4 && shown++ < 25)
      std::printf("[ INFO     ] %-40s (%s) %s: %.3g\n", fetch[i].c_str(), writer[i].c_str(),
                  tc[i].dims().str().c_str(), err);
    if (err > 1e-4 && shown == 1) {
      // The first variable off: its op's inputs, and the elements that differ most.
      std::printf("[ INFO     ] first off: %s\n", writer_op[i]->ToText().c_str());
      std::vector<std::pair<std::string, size_t>> ins;
      for (const std::string& n : writer_op[i]->InputArgumentNames()) {
        auto it = index.find(n);
        if (it == index.end()) {
          std::printf("[ INFO     ]   input %s: persistable or not fetched\n", n.c_str());
          continue;
        }
        ins.push_back(*it);
        std::printf("[ INFO     ]   input %s %s: %.3g\n", n.c_str(),
                    tc[it->second].dims().str().c_str(),
                    NormRelErr(tg[it->second].Clone(CPUPlace()), tc[it->second]));
      }
      std::vector<double> c = ToDouble(tc[i]), d = ToDouble(g);
      std::vector<size_t> order(c.size());
      for (size_t k = 0; k < c.size(); ++k) order[k] = k;
      std::partial_sort(
          order.begin(), order.begin() + std::min<size_t>(6, c.size()), order.end(),
          [&](size_t a, size_t z) { return std::abs(c[a] - d[a]) > std::abs(c[z] - d[z]); });
      size_t differ = 0;
      for (size_t k = 0; k < c.size(); ++k)
        differ += std::abs(c[k] - d[k]) > 1e-6 * std::max(1.0, std::abs(c[k]));
      std::printf("[ INFO     ]   %zu of %zu elements differ\n", differ, c.size());
      for (size_t k = 0; k < std::min<size_t>(6, c.size()); ++k) {
        const size_t e = order[k];
        std::printf("[ INFO     ]   [%zu] cpu %.9g gpu %.9g", e, c[e], d[e]);
        for (auto& in : ins) {
          if (tc[in.second].numel() != tc[i].numel()) continue;
          std::printf(" | %s cpu %.9g gpu %.9g", in.first.c_str(), ToDouble(tc[in.second])[e],
                      ToDouble(tg[in.second].Clone(CPUPlace()))[e]);
        }
        std::printf("\n");
      }
    }
  }
  std::printf("[ INFO     ] %zu variables, largest error %.3g\n", fetch.size(), worst);
  EXPECT_LE(worst, 5e-2);
}

// cuDNN's workspace and the algorithm searches grow memory in the first steps only.
TEST(CudnnModels, ResnetSteadyStateStepsCallCudaMallocZeroTimes) {
  SKIP_WITHOUT_GPU();
  models::ModelConfig cfg;
  cfg.name = "resnet";
  cfg.seed = 3;
  cfg.batch_size = 16;
  models::TrainableModel m = models::BuildModel(cfg);
  Executor exe(CUDAPlace(0));
  exe.Run(*m.startup);
  FeedMap feed;
  m.next_batch(16, &feed);
  for (int s = 0; s < 3; ++s) exe.Run(*m.main, feed, {m.loss});
  const int64_t before = DeviceMallocCount();
  const int64_t searches = ConvAlgoSearches();
  for (int s = 0; s < 10; ++s)
    exe.Run(*m.main, feed,
            s % 5 == 4 ? std::vector<std::string>{m.loss} : std::vector<std::string>{});
  EXPECT_EQ(DeviceMallocCount(), before) << "cudaMalloc in steady state";
  EXPECT_EQ(ConvAlgoSearches(), searches);
}

// Deterministic algorithms: two GPU runs give the same bits; the algorithm searches happen in the
// first step of a shape and never again.
TEST(CudnnModels, DeterministicConvRepeatsBitForBitAndSearchesOncePerShape) {
  SKIP_WITHOUT_GPU();
  FLAGS_cudnn_deterministic = true;
  FLAGS_cudnn_exhaustive_search = true;
  auto a = TrainLosses("resnet", CUDAPlace(0), 5, 8);
  const int64_t searches = ConvAlgoSearches();
  auto b = TrainLosses("resnet", CUDAPlace(0), 5, 8);
  EXPECT_EQ(ConvAlgoSearches(), searches) << "the second run searched again";
  FLAGS_cudnn_deterministic = false;
  FLAGS_cudnn_exhaustive_search = false;
  EXPECT_EQ(a, b);
  EXPECT_GT(searches, 0);
}

}  // namespace
}  // namespace keel::testing
