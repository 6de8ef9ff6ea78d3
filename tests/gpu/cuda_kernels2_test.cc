// GPU twin tests (ctest label `gpu`) of the CUDA kernels beyond GEMM, element-wise and
// activations: losses, layer_norm, dropout, reductions, lookup_table, shape ops, fills, random
// initializers, cast, compare/logical, lr schedules, metrics, coalesce_tensor, the global-norm
// clip, loss scaling and fused_gemm_epilogue; gradients narrowed to 16 bits where they are computed
// and the updates that widen them; gradient merge's buffers added into by the gradients' ops. Every
// case runs on CPUPlace and CUDAPlace(0) from the
// same random inputs, forward and gradient, with every new allocation poisoned
// (FLAGS_init_allocated_mem: an output element a kernel leaves unwritten is NaN and fails the
// comparison) and the host fallback off (a case that would run through it is an error). Float32
// agrees within 1e-5, reductions within 1e-4.
//
// The GPU tests skip with a message without a device; CudaKernels2Cases.AreValidOnTheCpu runs
// every case on the CPU everywhere, so the case table itself stays correct.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/program_guard.h"
#include "framework/runtime/device.h"
#include "models/model_zoo.h"
#include "tests/util/gpu_test_util.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/fuse_gemm_epilogue_pass.h"
#include "transpiler/fuse_grad_accumulation_pass.h"
#include "transpiler/gradient_merge_pass.h"
#include "transpiler/merge_optimizer_pass.h"
#include "transpiler/narrow_grads_pass.h"

DECLARE_bool(init_allocated_mem);
DECLARE_bool(cuda_host_fallback);

namespace keel::testing {
namespace {

// Poisoned allocations and no host fallback for the test's duration.
class CudaKernels2 : public ::testing::Test {
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

Tensor Ints(const DDim& d, int64_t below, uint64_t seed = 3, DType dt = DType::kInt64) {
  Tensor t(dt, d);
  uint64_t s = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t v = static_cast<int64_t>((s >> 33) % below);
    if (dt == DType::kInt64) t.data<int64_t>()[i] = v;
    if (dt == DType::kInt32) t.data<int32_t>()[i] = static_cast<int32_t>(v);
  }
  return t;
}
Tensor Bools(const DDim& d, uint64_t seed) {
  Tensor t(DType::kBool, d);
  Tensor u = Ints(d, 2, seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<bool>()[i] = u.data<int64_t>()[i] != 0;
  return t;
}
// Rows of a soft label: non-negative, each summing to 1.
Tensor SoftLabel(int64_t rows, int64_t d, uint64_t seed) {
  Tensor t = R({rows, d}, 0.1, 1, seed);
  for (int64_t i = 0; i < rows; ++i) {
    double s = 0;
    for (int64_t j = 0; j < d; ++j) s += t.data<float>()[i * d + j];
    for (int64_t j = 0; j < d; ++j) t.data<float>()[i * d + j] /= static_cast<float>(s);
  }
  return t;
}

struct GpuCase {
  OpCase op;
  double tol;
  bool grads = true;  // compare gradients too (ops with a grad op and float inputs)
};

std::vector<GpuCase> Cases() {
  std::vector<GpuCase> v;
  auto add = [&](OpCase c, double tol = 1e-5, bool grads = true) {
    v.push_back({std::move(c), tol, grads});
  };
  const int f32 = static_cast<int>(DType::kFloat32);
  // Losses.
  Tensor labels = Ints({8, 1}, 5);
  labels.data<int64_t>()[3] = -100;  // ignore_index
  add(Op("cross_entropy_hard", "cross_entropy", {{"X", {R({8, 5}, 0.05, 1)}}, {"Label", {labels}}},
         {{"Y", 1}}));
  add(Op("cross_entropy_soft", "cross_entropy",
         {{"X", {R({6, 7}, 0.05, 1)}}, {"Label", {SoftLabel(6, 7, 4)}}}, {{"Y", 1}},
         {{"soft_label", true}}),
      1e-4);
  add(Op("swce_hard", "softmax_with_cross_entropy",
         {{"Logits", {R({8, 5}, -3, 3)}}, {"Label", {labels}}}, {{"Softmax", 1}, {"Loss", 1}}),
      1e-5);
  add(Op("swce_long_rows", "softmax_with_cross_entropy",
         {{"Logits", {R({4, 1000}, -5, 5)}}, {"Label", {Ints({4, 1}, 1000)}}},
         {{"Softmax", 1}, {"Loss", 1}}),
      1e-4);
  add(Op("swce_soft", "softmax_with_cross_entropy",
         {{"Logits", {R({6, 7}, -3, 3)}}, {"Label", {SoftLabel(6, 7, 5)}}},
         {{"Softmax", 1}, {"Loss", 1}}, {{"soft_label", true}}),
      1e-4);
  {  // A soft label of 0 on a -inf logit contributes nothing (no NaN) on both places.
    Tensor logits = R({6, 7}, -3, 3), soft = SoftLabel(6, 7, 5);
    for (int row : {0, 4}) {
      logits.data<float>()[row * 7 + 2] = -std::numeric_limits<float>::infinity();
      soft.data<float>()[row * 7 + 2] = 0.f;
    }
    add(Op("swce_soft_minus_inf", "softmax_with_cross_entropy",
           {{"Logits", {logits}}, {"Label", {soft}}}, {{"Softmax", 1}, {"Loss", 1}},
           {{"soft_label", true}}),
        1e-4);
  }
  add(Op("swce_axis1", "softmax_with_cross_entropy",
         {{"Logits", {R({3, 5, 4}, -3, 3)}}, {"Label", {Ints({3, 1, 4}, 5)}}},
         {{"Softmax", 1}, {"Loss", 1}}, {{"axis", 1}}),
      1e-5);
  // layer_norm.
  add(Op("layer_norm", "layer_norm",
         {{"X", {R({6, 16})}}, {"Scale", {R({16}, 0.5, 1.5, 2)}}, {"Bias", {R({16}, -1, 1, 3)}}},
         {{"Y", 1}, {"Mean", 1}, {"Variance", 1}}, {{"begin_norm_axis", 1}}),
      1e-4);
  add(Op("layer_norm_3d_long", "layer_norm",
         {{"X", {R({2, 3, 300})}},
          {"Scale", {R({300}, 0.5, 1.5, 2)}},
          {"Bias", {R({300}, -1, 1, 3)}}},
         {{"Y", 1}, {"Mean", 1}, {"Variance", 1}}, {{"begin_norm_axis", 2}}),
      1e-4);
  // Many rows (not a multiple of the 16 row groups) over columns not a multiple of 32.
  add(Op("layer_norm_many_rows", "layer_norm",
         {{"X", {R({300, 40})}}, {"Scale", {R({40}, 0.5, 1.5, 2)}}, {"Bias", {R({40}, -1, 1, 3)}}},
         {{"Y", 1}, {"Mean", 1}, {"Variance", 1}}, {{"begin_norm_axis", 1}}),
      1e-4);
  add(Op("layer_norm_no_affine", "layer_norm", {{"X", {R({5, 2, 3})}}},
         {{"Y", 1}, {"Mean", 1}, {"Variance", 1}}, {{"begin_norm_axis", 1}}),
      1e-4);
  // Dropout: training (mask from the same Philox draws), fixed seed, and both test-time modes.
  add(Op("dropout_train", "dropout", {{"X", {R({33, 65})}}}, {{"Out", 1}, {"Mask", 1}},
         {{"dropout_prob", 0.3f}, {"seed", 77}}));
  add(Op("dropout_odd_size", "dropout", {{"X", {R({7, 3})}}}, {{"Out", 1}, {"Mask", 1}},
         {{"dropout_prob", 0.5f}, {"seed", 5}, {"fix_seed", true}}));
  add(Op("dropout_downgrade", "dropout", {{"X", {R({9, 4})}}}, {{"Out", 1}, {"Mask", 1}},
         {{"dropout_prob", 0.25f},
          {"seed", 3},
          {"dropout_implementation", std::string("downgrade_in_infer")}}));
  add(Op("dropout_is_test", "dropout", {{"X", {R({9, 4})}}}, {{"Out", 1}},
         {{"dropout_prob", 0.25f},
          {"is_test", true},
          {"dropout_implementation", std::string("downgrade_in_infer")}}));
  // Reductions.
  add(Op("mean", "mean", {{"X", {R({13, 7})}}}), 1e-4);
  add(Op("mean_large", "mean", {{"X", {R({300, 100})}}}), 1e-4);
  add(Op("reduce_sum_mid", "reduce_sum", {{"X", {R({4, 5, 6})}}}, {{"Out", 1}},
         {{"dim", std::vector<int>{1}}}),
      1e-4);
  add(Op("reduce_sum_outer_inner_keep", "reduce_sum", {{"X", {R({2, 3, 4, 5})}}}, {{"Out", 1}},
         {{"dim", std::vector<int>{0, -1}}, {"keep_dim", true}}),
      1e-4);
  add(Op("reduce_sum_all", "reduce_sum", {{"X", {R({7, 9})}}}, {{"Out", 1}},
         {{"reduce_all", true}}),
      1e-4);
  add(Op("reduce_sum_int64", "reduce_sum", {{"X", {Ints({3, 4}, 100)}}}, {{"Out", 1}},
         {{"dim", std::vector<int>{1}}}),
      0, false);
  add(Op("reduce_mean", "reduce_mean", {{"X", {R({4, 5, 6})}}}, {{"Out", 1}},
         {{"dim", std::vector<int>{0, 2}}}),
      1e-4);
  // lookup_table: repeated ids (the grad sums them), a padding id.
  add(Op("lookup_table", "lookup_table", {{"W", {R({10, 6})}}, {"Ids", {Ints({12, 1}, 10)}}},
         {{"Out", 1}}, {{"padding_idx", int64_t{4}}}),
      1e-5);
  add(Op("lookup_table_3d", "lookup_table", {{"W", {R({7, 3})}}, {"Ids", {Ints({2, 5, 1}, 7)}}}),
      1e-5);
  // Shape ops.
  add(Op("concat_axis0", "concat", {{"X", {R({2, 3}), R({4, 3}, -1, 1, 2)}}}, {{"Out", 1}},
         {{"axis", 0}}));
  add(Op("concat_axis1", "concat",
         {{"X", {R({2, 3, 2}), R({2, 1, 2}, -1, 1, 2), R({2, 4, 2}, -1, 1, 3)}}}, {{"Out", 1}},
         {{"axis", 1}}));
  add(Op("concat_last", "concat", {{"X", {R({3, 2}), R({3, 5}, -1, 1, 2)}}}, {{"Out", 1}},
         {{"axis", -1}}));
  add(Op("split_num", "split", {{"X", {R({4, 6})}}}, {{"Out", 3}}, {{"num", 3}, {"axis", 1}}));
  add(Op("split_sections", "split", {{"X", {R({5, 2, 3})}}}, {{"Out", 3}},
         {{"sections", std::vector<int>{1, -1, 2}}, {"axis", 0}}));
  add(Op("transpose_2d", "transpose", {{"X", {R({5, 7})}}}, {{"Out", 1}},
         {{"axis", std::vector<int>{1, 0}}}));
  add(Op("transpose_4d", "transpose", {{"X", {R({2, 3, 4, 5})}}}, {{"Out", 1}},
         {{"axis", std::vector<int>{0, 2, 1, 3}}}));
  add(Op("flatten", "flatten", {{"X", {R({2, 3, 4})}}}, {{"Out", 1}}, {{"axis", 2}}));
  add(Op("squeeze", "squeeze", {{"X", {R({3, 1, 2})}}}, {{"Out", 1}},
         {{"axes", std::vector<int>{1}}}));
  add(Op("unsqueeze", "unsqueeze", {{"X", {R({3, 2})}}}, {{"Out", 1}},
         {{"axes", std::vector<int>{0, -1}}}));
  add(Op("reshape", "reshape", {{"X", {R({4, 6})}}}, {{"Out", 1}},
         {{"shape", std::vector<int>{0, -1, 2}}}));
  add(Op("assign", "assign", {{"X", {R({4, 6})}}}), 0, false);
  // Fills and cast.
  add(Op("fill_constant", "fill_constant", {}, {{"Out", 1}},
         {{"shape", std::vector<int64_t>{3, 4}}, {"value", 2.5f}, {"dtype", f32}}),
      0, false);
  add(Op("fill_constant_int64", "fill_constant", {}, {{"Out", 1}},
         {{"shape", std::vector<int64_t>{5}},
          {"value", -3.0f},
          {"dtype", static_cast<int>(DType::kInt64)}}),
      0, false);
  add(Op("fill_zeros_like", "fill_zeros_like", {{"X", {R({3, 4})}}}), 0, false);
  add(Op("cast_f32_to_f64", "cast", {{"X", {R({3, 4})}}}, {{"Out", 1}},
         {{"out_dtype", static_cast<int>(DType::kFloat64)}}));
  add(Op("cast_f32_to_i32", "cast", {{"X", {R({3, 4}, -9, 9)}}}, {{"Out", 1}},
         {{"out_dtype", static_cast<int>(DType::kInt32)}}),
      0, false);
  add(Op("cast_i64_to_f32", "cast", {{"X", {Ints({3, 4}, 50)}}}, {{"Out", 1}},
         {{"out_dtype", f32}}),
      0, false);
  add(Op("cast_f32_to_bool", "cast", {{"X", {Ints({3, 4}, 2, 9, DType::kInt32)}}}, {{"Out", 1}},
         {{"out_dtype", static_cast<int>(DType::kBool)}}),
      0, false);
  // Compare and logical (bool outputs compare exactly).
  for (const char* cmp :
       {"less_than", "less_equal", "greater_than", "greater_equal", "equal", "not_equal"}) {
    add(Op(std::string(cmp) + "_same_shape", cmp,
           {{"X", {Ints({4, 5}, 4)}}, {"Y", {Ints({4, 5}, 4, 8)}}}),
        0, false);
    add(Op(std::string(cmp) + "_one_y", cmp, {{"X", {R({4, 5})}}, {"Y", {R({1}, -0.2, 0.2, 2)}}}),
        0, false);
  }
  add(Op("logical_and", "logical_and", {{"X", {Bools({3, 7}, 1)}}, {"Y", {Bools({3, 7}, 2)}}}), 0,
      false);
  add(Op("logical_or", "logical_or", {{"X", {Bools({3, 7}, 1)}}, {"Y", {Bools({3, 7}, 2)}}}), 0,
      false);
  // Step counters and schedules.
  add(Op("increment", "increment", {{"X", {R({1}, 0, 10)}}}, {{"Out", 1}}, {{"step", 2.0f}}), 0,
      false);
  for (float step : {0.0f, 4.0f, 12.0f, 70.0f}) {
    add(Op("lr_cosine_warmup_" + std::to_string(static_cast<int>(step)), "lr_schedule",
           {{"Step", {Tensor::FromVector<float>({step}, {1})}}}, {{"LearningRate", 1}},
           {{"type", std::string("cosine")},
            {"base_lr", 0.1f},
            {"min_lr", 0.01f},
            {"total_steps", 50},
            {"warmup_steps", 5}}),
        1e-6, false);
    add(Op("lr_piecewise_" + std::to_string(static_cast<int>(step)), "lr_schedule",
           {{"Step", {Tensor::FromVector<float>({step}, {1})}}}, {{"LearningRate", 1}},
           {{"type", std::string("piecewise")},
            {"boundaries", std::vector<int>{3, 10}},
            {"values", std::vector<float>{1.0f, 0.5f, 0.25f}}}),
        0, false);
  }
  // Metrics: ties (integers) and a NaN, which ranks first.
  Tensor scores = R({6, 10}, -1, 1, 9);
  scores.data<float>()[13] = std::numeric_limits<float>::quiet_NaN();
  add(Op("top_k", "top_k", {{"X", {scores}}}, {{"Out", 1}, {"Indices", 1}}, {{"k", 3}}), 0, false);
  add(Op("top_k_ties", "top_k", {{"X", {Ints({5, 8}, 3)}}}, {{"Out", 1}, {"Indices", 1}},
         {{"k", 4}}),
      0, false);
  add(Op("arg_max_last", "arg_max", {{"X", {Ints({4, 9}, 4, 5, DType::kInt32)}}}, {{"Out", 1}},
         {{"axis", int64_t{-1}}}),
      0, false);
  add(Op("arg_max_mid", "arg_max", {{"X", {R({3, 5, 4})}}}, {{"Out", 1}}, {{"axis", int64_t{1}}}),
      0, false);
  add(Op("accuracy", "accuracy",
         {{"Out", {R({9, 2})}}, {"Indices", {Ints({9, 2}, 4, 6)}}, {"Label", {Ints({9, 1}, 4, 7)}}},
         {{"Accuracy", 1}, {"Correct", 1}, {"Total", 1}}),
      0, false);
  // The global-norm clip and its pieces.
  add(Op("squared_l2_norm", "squared_l2_norm", {{"X", {R({50, 40})}}}), 1e-4, false);
  add(Op("clip_by_global_norm_clips", "clip_by_global_norm",
         {{"X", {R({20, 30}), R({7}, -1, 1, 2)}}}, {{"Out", 2}, {"GlobalNorm", 1}},
         {{"clip_norm", 1.0f}}),
      1e-4, false);
  add(Op("clip_by_global_norm_within", "clip_by_global_norm", {{"X", {R({3, 2}, -0.1, 0.1)}}},
         {{"Out", 1}, {"GlobalNorm", 1}}, {{"clip_norm", 10.0f}}),
      1e-4, false);
  // Merged optimizer updates (one multi-tensor launch on the GPU) over parameters of different
  // sizes, against the CPU's per-parameter kernels.
  {
    const std::vector<DDim> shapes = {{3, 5}, {7}, {600, 3}};
    auto list = [&](double lo, double hi, uint64_t seed) {
      std::vector<Tensor> v;
      for (size_t i = 0; i < shapes.size(); ++i) v.push_back(R(shapes[i], lo, hi, seed + i));
      return v;
    };
    std::vector<Tensor> pows1, pows2;
    for (size_t i = 0; i < shapes.size(); ++i) {
      pows1.push_back(Tensor::FromVector<float>({0.9f * (i + 1) / 3}, {1}));
      pows2.push_back(Tensor::FromVector<float>({0.999f * (i + 1) / 3}, {1}));
    }
    const Tensor lr = Tensor::FromVector<float>({0.05f}, {1});
    const int n = static_cast<int>(shapes.size());
    add(Op("merged_sgd", "merged_sgd",
           {{"Param", list(-1, 1, 10)}, {"Grad", list(-1, 1, 20)}, {"LearningRate", {lr}}},
           {{"ParamOut", n}}),
        1e-6, false);
    add(Op("merged_momentum", "merged_momentum",
           {{"Param", list(-1, 1, 10)},
            {"Grad", list(-1, 1, 20)},
            {"Velocity", list(-1, 1, 30)},
            {"LearningRate", {lr}}},
           {{"ParamOut", n}, {"VelocityOut", n}}, {{"mu", 0.9f}, {"use_nesterov", true}}),
        1e-6, false);
    for (const char* adam : {"merged_adam", "merged_adamw"}) {
      std::map<std::string, Attribute> attrs = {{"beta1", 0.9f}, {"beta2", 0.999f}};
      if (std::string(adam) == "merged_adamw") attrs["coeff"] = 0.01f;
      add(Op(adam, adam,
             {{"Param", list(-1, 1, 10)},
              {"Grad", list(-1, 1, 20)},
              {"LearningRate", {lr}},
              {"Moment1", list(-1, 1, 30)},
              {"Moment2", list(0, 1, 40)},
              {"Beta1Pow", pows1},
              {"Beta2Pow", pows2}},
             {{"ParamOut", n},
              {"Moment1Out", n},
              {"Moment2Out", n},
              {"Beta1PowOut", n},
              {"Beta2PowOut", n}},
             attrs),
          1e-5, false);
    }
  }
  // Loss scaling (AMP): unscaling a list of gradients of mixed dtypes and sizes with the overflow
  // flag, finite and with an inf and a NaN; the scale's update rule in each of its branches.
  {
    const Tensor scale = Tensor::FromVector<float>({1024.0f}, {1});
    auto grads = [&](bool overflow) {
      std::vector<Tensor> g = {R({3, 5}, -2e3, 2e3, 50), R({600, 3}, -2e3, 2e3, 51),
                               R({7}, -2e3, 2e3, 52, DType::kFloat64)};
      if (overflow) {
        g[1].data<float>()[1234] = std::numeric_limits<float>::infinity();
        g[2].data<double>()[3] = std::numeric_limits<double>::quiet_NaN();
      }
      return g;
    };
    for (bool overflow : {false, true})
      add(Op(overflow ? "check_finite_and_unscale_overflow" : "check_finite_and_unscale",
             "check_finite_and_unscale", {{"X", grads(overflow)}, {"Scale", {scale}}},
             {{"Out", 3}, {"FoundInfinite", 1}}),
          1e-6, false);
    // More gradients than one CUDA launch takes (24): the overflow in the second batch.
    std::vector<Tensor> many;
    for (int i = 0; i < 30; ++i) many.push_back(R({5 + i, 3}, -2e3, 2e3, 60 + i));
    many[27].data<float>()[4] = -std::numeric_limits<float>::infinity();
    add(Op("check_finite_and_unscale_30", "check_finite_and_unscale",
           {{"X", many}, {"Scale", {scale}}}, {{"Out", 30}, {"FoundInfinite", 1}}),
        1e-6, false);
    struct Update {
      const char* name;
      bool found;
      int good, bad;
    };
    for (const Update& u : {Update{"update_loss_scaling_shrink", true, 5, 0},
                            Update{"update_loss_scaling_grow", false, 2, 1},
                            Update{"update_loss_scaling_count", false, 0, 0}}) {
      Tensor found(DType::kBool, {1});
      found.data<bool>()[0] = u.found;
      add(Op(u.name, "update_loss_scaling",
             {{"FoundInfinite", {found}},
              {"PrevLossScaling", {scale}},
              {"InGoodSteps", {Tensor::FromVector<int32_t>({u.good}, {1})}},
              {"InBadSteps", {Tensor::FromVector<int32_t>({u.bad}, {1})}}},
             {{"LossScaling", 1}, {"OutGoodSteps", 1}, {"OutBadSteps", 1}},
             {{"incr_every_n_steps", 3}, {"decr_every_n_nan_or_inf", 1}}),
          0, false);
    }
  }
  // A fully connected layer's GEMM and bias add in one op (the fuse_gemm_epilogue pass's).
  add(Op("fused_gemm_epilogue", "fused_gemm_epilogue",
         {{"X", {R({2, 33, 17}, -1, 1, 1)}},
          {"Y", {R({17, 45}, -1, 1, 2)}},
          {"Bias", {R({45}, -1, 1, 3)}}},
         {{"Out", 1}}, {{"x_num_col_dims", 2}}),
      1e-5);
  // float64 twins of a few.
  const DType f64 = DType::kFloat64;
  add(Op("layer_norm_f64", "layer_norm", {{"X", {R({4, 9}, -1, 1, 1, f64)}}},
         {{"Y", 1}, {"Mean", 1}, {"Variance", 1}}, {{"begin_norm_axis", 1}}),
      1e-10);
  add(Op("swce_f64", "softmax_with_cross_entropy",
         {{"Logits", {R({5, 6}, -3, 3, 1, f64)}}, {"Label", {Ints({5, 1}, 6)}}},
         {{"Softmax", 1}, {"Loss", 1}}),
      1e-10);
  add(Op("reduce_mean_f64", "reduce_mean", {{"X", {R({4, 5}, -1, 1, 1, f64)}}}, {{"Out", 1}},
         {{"dim", std::vector<int>{1}}}),
      1e-10);
  return v;
}

// The whole table on the CPU: valid programs, finite results. Runs on every machine.
TEST(CudaKernels2Cases, AreValidOnTheCpu) {
  for (GpuCase& gc : Cases()) {
    SCOPED_TRACE(Describe(gc.op));
    std::map<std::string, std::vector<Tensor>> out;
    ASSERT_EQ(ErrorOf([&] { out = RunForward(gc.op, CPUPlace()); }), "");
    EXPECT_FALSE(out.empty());
    if (gc.grads) {
      ASSERT_EQ(ErrorOf([&] { RunGrads(gc.op, CPUPlace()); }), "");
    }
  }
}

TEST_F(CudaKernels2, EveryCaseMatchesItsCpuTwinForwardAndGrad) {
  SKIP_WITHOUT_GPU();
  for (GpuCase& gc : Cases()) {
    const OpCase& c = gc.op;
    SCOPED_TRACE(Describe(c));
    auto cpu = RunForward(c, CPUPlace());
    std::map<std::string, std::vector<Tensor>> gpu;
    ASSERT_EQ(ErrorOf([&] { gpu = RunForward(c, CUDAPlace(0)); }), "");
    for (auto& [slot, ts] : cpu)
      for (size_t i = 0; i < ts.size(); ++i) {
        ASSERT_EQ(gpu[slot][i].dims(), ts[i].dims()) << slot;
        ASSERT_EQ(gpu[slot][i].dtype(), ts[i].dtype()) << slot;
        EXPECT_LE(MaxRelErr(gpu[slot][i], ts[i]), gc.tol) << "forward " << slot << "[" << i << "]";
      }
    if (!gc.grads) continue;
    auto gcpu = RunGrads(c, CPUPlace());
    auto ggpu = RunGrads(c, CUDAPlace(0));
    for (auto& [name, g] : gcpu) {
      ASSERT_TRUE(ggpu.count(name)) << name;
      EXPECT_LE(MaxRelErr(ggpu[name], g), std::max(gc.tol, 1e-5)) << "gradient of " << name;
    }
  }
}

// Initializers draw on the host with the CPU kernel's generator: bit-identical values.
TEST_F(CudaKernels2, RandomInitializersGiveTheCpuValuesBitForBit) {
  SKIP_WITHOUT_GPU();
  const int f32 = static_cast<int>(DType::kFloat32);
  for (const OpCase& c : {Op("uniform", "uniform_random", {}, {{"Out", 1}},
                             {{"shape", std::vector<int64_t>{33, 17}},
                              {"min", -0.5f},
                              {"max", 2.0f},
                              {"seed", 9},
                              {"dtype", f32}}),
                          Op("gaussian", "gaussian_random", {}, {{"Out", 1}},
                             {{"shape", std::vector<int64_t>{7, 9}},
                              {"mean", 1.0f},
                              {"std", 0.5f},
                              {"seed", 4},
                              {"dtype", static_cast<int>(DType::kFloat64)}})}) {
    SCOPED_TRACE(Describe(c));
    EXPECT_EQ(ToDouble(RunForward(c, CUDAPlace(0))["Out"][0]),
              ToDouble(RunForward(c, CPUPlace())["Out"][0]));
  }
}

// A dropout mask over several runs of one executor: the run index advances the Philox counter on
// both places alike.
TEST_F(CudaKernels2, DropoutMasksFollowTheCpuRunByRun) {
  SKIP_WITHOUT_GPU();
  Program prog;
  Block& b = prog.global_block();
  VarDesc* x = b.Var("x");
  x->set_dtype(DType::kFloat32);
  x->set_dims({40, 30});
  x->set_is_data(true);
  AppendOp(b, "dropout", {{"X", {"x"}}}, {{"Out", {"out"}}, {"Mask", {"mask"}}},
           {{"dropout_prob", 0.4f}, {"seed", 11}});
  Executor cpu(CPUPlace()), gpu(CUDAPlace(0));
  FeedMap feed{{"x", R({40, 30})}};
  for (int run = 0; run < 3; ++run) {
    auto c = cpu.Run(prog, feed, {"mask", "out"});
    auto g = gpu.Run(prog, feed, {"mask", "out"});
    EXPECT_EQ(ToDouble(g[0]), ToDouble(c[0])) << "run " << run;
    EXPECT_LT(MaxRelErr(g[1], c[1]), 1e-6) << "run " << run;
  }
}

// A label outside [0, D) found on the device is a keel::Error naming the op, value and row at the
// op's next run (the device cannot throw); ignore_index is not an error.
TEST_F(CudaKernels2, BadLabelsAndIdsAreReportedByTheNextRun) {
  SKIP_WITHOUT_GPU();
  {
    Program prog;
    Block& b = prog.global_block();
    for (auto [n, dt, dims] :
         {std::tuple<const char*, DType, DDim>{"logits", DType::kFloat32, {4, 3}},
          {"label", DType::kInt64, {4, 1}}}) {
      VarDesc* v = b.Var(n);
      v->set_dtype(dt);
      v->set_dims(dims);
      v->set_is_data(true);
    }
    AppendOp(b, "softmax_with_cross_entropy", {{"Logits", {"logits"}}, {"Label", {"label"}}},
             {{"Softmax", {"sm"}}, {"Loss", {"loss"}}});
    Executor exe(CUDAPlace(0));
    Tensor label = Tensor::FromVector<int64_t>({0, 2, 7, 1}, {4, 1});
    FeedMap feed{{"logits", R({4, 3})}, {"label", label}};
    auto first = exe.Run(prog, feed, {"loss"});  // the fetch waits for the kernel
    EXPECT_TRUE(std::isnan(first[0].data<float>()[2])) << "the bad row's loss is NaN";
    ExpectErrorContainsAll(ErrorOf([&] { exe.Run(prog, feed, {"loss"}); }),
                           {"softmax_with_cross_entropy", "Label value 7", "row 2", "[0, 3)"});
    feed["label"] = Tensor::FromVector<int64_t>({0, 2, -100, 1}, {4, 1});
    EXPECT_EQ(ErrorOf([&] { exe.Run(prog, feed, {"loss"}); }), "") << "ignore_index is fine";
  }
  {
    Program prog;
    Block& b = prog.global_block();
    for (auto [n, dt, dims] : {std::tuple<const char*, DType, DDim>{"w", DType::kFloat32, {5, 2}},
                               {"ids", DType::kInt64, {3, 1}}}) {
      VarDesc* v = b.Var(n);
      v->set_dtype(dt);
      v->set_dims(dims);
      v->set_is_data(true);
    }
    AppendOp(b, "lookup_table", {{"W", {"w"}}, {"Ids", {"ids"}}}, {{"Out", {"out"}}});
    Executor exe(CUDAPlace(0));
    FeedMap feed{{"w", R({5, 2})}, {"ids", Tensor::FromVector<int64_t>({1, -4, 2}, {3, 1})}};
    exe.Run(prog, feed, {"out"});
    ExpectErrorContainsAll(ErrorOf([&] { exe.Run(prog, feed, {"out"}); }),
                           {"Ids value -4", "flat index 1", "[0, 5)"});
  }
  {
    // The gradient reports a bad id too (the CPU twin throws at once).
    Program prog;
    Block& b = prog.global_block();
    for (auto [n, dt, dims] : {std::tuple<const char*, DType, DDim>{"w", DType::kFloat32, {5, 2}},
                               {"ids", DType::kInt64, {3, 1}},
                               {"dout", DType::kFloat32, {3, 2}}}) {
      VarDesc* v = b.Var(n);
      v->set_dtype(dt);
      v->set_dims(dims);
      v->set_is_data(true);
    }
    AppendOp(b, "lookup_table_grad",
             {{"W", {"w"}}, {"Ids", {"ids"}}, {GradVarName("Out"), {"dout"}}},
             {{GradVarName("W"), {"dw"}}});
    Executor exe(CUDAPlace(0));
    FeedMap feed{{"w", R({5, 2})},
                 {"ids", Tensor::FromVector<int64_t>({1, 9, 2}, {3, 1})},
                 {"dout", R({3, 2})}};
    exe.Run(prog, feed, {"dw"});
    ExpectErrorContainsAll(ErrorOf([&] { exe.Run(prog, feed, {"dw"}); }),
                           {"Ids value 9", "flat index 1", "[0, 5)"});
  }
}

// coalesce_tensor on the device: the vars are views of one allocation, so what a kernel writes
// into a var lands in the fused buffer.
TEST_F(CudaKernels2, CoalescedVarsAreViewsOfOneDeviceAllocation) {
  SKIP_WITHOUT_GPU();
  Program prog;
  Block& b = prog.global_block();
  for (auto [name, shape] :
       {std::pair<const char*, std::vector<int64_t>>{"a", {2, 3}}, {"b", {4}}}) {
    VarDesc* v = b.Var(name);
    v->set_dtype(DType::kFloat32);
    v->set_shape(shape);
  }
  b.Var("fused")->set_dtype(DType::kFloat32);
  AppendOp(b, "coalesce_tensor", {{"Input", {"a", "b"}}},
           {{"Output", {"a", "b"}}, {"FusedOutput", {"fused"}}},
           {{"numels", std::vector<int64_t>{6, 4}},
            {"dtype", static_cast<int>(DType::kFloat32)},
            {"set_constant", true},
            {"constant", 1.0f},
            {"pad_to_multiple", 4}});
  AppendOp(b, "fill_constant", {}, {{"Out", {"b"}}},
           {{"shape", std::vector<int64_t>{4}},
            {"value", 7.0f},
            {"dtype", static_cast<int>(DType::kFloat32)}});
  AppendOp(b, "scale", {{"X", {"fused"}}}, {{"Out", {"fused"}}}, {{"scale", 2.0f}});
  Executor exe(CUDAPlace(0));
  for (int run = 0; run < 2; ++run) {
    auto out = exe.Run(prog, {}, {"fused", "a", "b"});
    ASSERT_EQ(out[0].dims(), DDim({12}));
    const std::vector<double> want = {2, 2, 2, 2, 2, 2, 14, 14, 14, 14, 2, 2};
    EXPECT_EQ(ToDouble(out[0]), want) << "run " << run;
    EXPECT_EQ(ToDouble(out[2]), std::vector<double>(4, 14.0)) << "b reads through the buffer";
    const Tensor& a = exe.local_scope().FindVar("a")->tensor();
    const Tensor& f = exe.local_scope().FindVar("fused")->tensor();
    EXPECT_EQ(a.holder(), f.holder()) << "a is a slice of the fused allocation";
  }
}

// conditional_block on the device: the condition comes to the host, the block's ops run on the
// device.
TEST_F(CudaKernels2, ConditionalBlockRunsItsBlockWhenTheDeviceConditionHolds) {
  SKIP_WITHOUT_GPU();
  Program startup, main;
  for (Block* b : {&startup.global_block(), &main.global_block()})
    for (auto [n, dt] : {std::pair<const char*, DType>{"counter", DType::kInt64},
                         {"three", DType::kInt64},
                         {"acc", DType::kFloat32}}) {
      VarDesc* v = b->Var(n);
      v->set_dtype(dt);
      v->set_shape({1});
      v->set_persistable(true);
    }
  Block& s = startup.global_block();
  for (auto [n, value, dt] : {std::tuple<const char*, float, DType>{"counter", 0, DType::kInt64},
                              {"three", 3, DType::kInt64},
                              {"acc", 0, DType::kFloat32}})
    AppendOp(
        s, "fill_constant", {}, {{"Out", {n}}},
        {{"shape", std::vector<int64_t>{1}}, {"value", value}, {"dtype", static_cast<int>(dt)}});
  Block& m = main.global_block();
  VarDesc* due = m.Var("due");
  due->set_dtype(DType::kBool);
  due->set_shape({1});
  AppendOp(m, "increment", {{"X", {"counter"}}}, {{"Out", {"counter"}}}, {{"step", 1.0f}});
  AppendOp(m, "greater_equal", {{"X", {"counter"}}, {"Y", {"three"}}}, {{"Out", {"due"}}});
  Block& sub = main.AppendBlock(0);
  VarDesc* ten = sub.Var("ten");
  ten->set_dtype(DType::kFloat32);
  ten->set_shape({1});
  AppendOp(sub, "fill_constant", {}, {{"Out", {"ten"}}},
           {{"shape", std::vector<int64_t>{1}},
            {"value", 10.0f},
            {"dtype", static_cast<int>(DType::kFloat32)}});
  AppendOp(sub, "sum", {{"X", {"acc", "ten"}}}, {{"Out", {"acc"}}});
  AppendOp(m, "conditional_block", {{"Cond", {"due"}}}, {}, {{"sub_block", BlockRef{1}}});
  Executor exe(CUDAPlace(0));
  exe.Run(startup);
  std::vector<double> seen;
  for (int i = 0; i < 5; ++i) seen.push_back(ToDouble(exe.Run(main, {}, {"acc"})[0])[0]);
  EXPECT_EQ(seen, (std::vector<double>{0, 0, 10, 20, 30}));
}

// Models without convolutions train on the GPU with no op on the host fallback, an lr schedule
// with warm-up, gradient clipping and weight decay included, and follow the CPU's losses.
TEST_F(CudaKernels2, MlpAndTransformerTrainWithoutHostFallbackAndFollowTheCpu) {
  SKIP_WITHOUT_GPU();
  FLAGS_init_allocated_mem = false;  // a training loop, not a twin test
  for (const char* model : {"mlp", "transformer"}) {
    SCOPED_TRACE(model);
    auto losses = [&](const Place& place) {
      models::ModelConfig cfg;
      cfg.name = model;
      cfg.seed = 5;
      cfg.batch_size = 32;
      if (std::string(model) == "mlp") cfg.hidden = 256;
      cfg.make_optimizer = [](const std::string&, float) {
        auto o = std::make_unique<optimizer::Adam>(
            lr_schedule::LinearWarmup(lr_schedule::Cosine(1e-3f, 100), 5));
        o->set_grad_clip(optimizer::GradientClipByGlobalNorm{1.0f});
        o->set_weight_decay(1e-4f);
        return std::unique_ptr<optimizer::Optimizer>(std::move(o));
      };
      models::TrainableModel m = models::BuildModel(cfg);
      Executor exe(place);
      exe.Run(*m.startup);
      std::vector<double> r;
      for (int s = 0; s < 20; ++s) {
        FeedMap feed;
        m.next_batch(32, &feed);
        r.push_back(ToDouble(exe.Run(*m.main, feed, {m.loss})[0])[0]);
      }
      return r;
    };
    const std::vector<double> cpu = losses(CPUPlace());
    std::vector<double> gpu;
    ASSERT_EQ(ErrorOf([&] { gpu = losses(CUDAPlace(0)); }), "");
    for (size_t s = 0; s < cpu.size(); ++s)
      EXPECT_NEAR(gpu[s], cpu[s], 1e-4 * std::max(1.0, std::abs(cpu[s]))) << "step " << s;
  }
}

// The zoo's MLP (64 wide, batch 16, seed 3) trained by `opt` (sgd, momentum, adam or adamw), for
// the program-level twin tests below.
models::TrainableModel ZooMlp(const std::string& opt) {
  models::ModelConfig cfg;
  cfg.name = "mlp";
  cfg.seed = 3;
  cfg.hidden = 64;
  cfg.batch_size = 16;
  cfg.make_optimizer = [opt](const std::string&, float) {
    std::unique_ptr<optimizer::Optimizer> o;
    if (opt == "sgd") o = std::make_unique<optimizer::SGD>(0.05f);
    if (opt == "momentum") o = std::make_unique<optimizer::Momentum>(0.05f, 0.9f);
    if (opt == "adam") o = std::make_unique<optimizer::Adam>(0.01f);
    if (opt == "adamw") o = std::make_unique<optimizer::AdamW>(0.01f, 0.1f);
    return o;
  };
  return models::BuildModel(cfg);
}

// Losses of `steps` steps of `m` on `place` from its startup, batches of 16.
std::vector<double> Losses(models::TrainableModel& m, const Place& place, int steps) {
  Executor exe(place);
  exe.Run(*m.startup);
  std::vector<double> r;
  for (int s = 0; s < steps; ++s) {
    FeedMap feed;
    m.next_batch(16, &feed);
    r.push_back(ToDouble(exe.Run(*m.main, feed, {m.loss})[0])[0]);
  }
  return r;
}

// Fused gradients (coalesce_tensor views) and one merged update per group, as a data-parallel
// program with fusion has them: the GPU follows the CPU step by step, for every optimizer.
TEST_F(CudaKernels2, FusedGradientsWithMergedUpdatesFollowTheCpu) {
  SKIP_WITHOUT_GPU();
  FLAGS_init_allocated_mem = false;
  for (const char* opt : {"sgd", "momentum", "adam", "adamw"}) {
    SCOPED_TRACE(opt);
    auto losses = [&](const Place& place) {
      const std::string name = opt;
      models::TrainableModel m = ZooMlp(name);
      Block& b = m.main->global_block();
      std::vector<std::string> grads;
      std::vector<int64_t> numels;
      for (auto& op : b.ops())
        if (op->type() == name) {
          const auto& rv = op->Attr<std::vector<std::string>>(kOpRoleVarAttr);
          grads.push_back(rv[1]);
          numels.push_back(b.MustFindVar(rv[0])->dims().numel());
        }
      InsertFusedGradients(b, grads, numels);
      transpiler::MergeOptimizerOpsPass().Apply(*m.main, *m.startup);
      int merged = 0;
      for (auto& op : b.ops()) merged += op->type() == "merged_" + name;
      EXPECT_EQ(merged, 1);
      return Losses(m, place, 10);
    };
    const std::vector<double> cpu = losses(CPUPlace());
    std::vector<double> gpu;
    ASSERT_EQ(ErrorOf([&] { gpu = losses(CUDAPlace(0)); }), "");
    for (size_t s = 0; s < cpu.size(); ++s)
      EXPECT_NEAR(gpu[s], cpu[s], 1e-4 * std::max(1.0, std::abs(cpu[s]))) << "step " << s;
  }
}

// Gradients made 16-bit where they are computed (transpiler/narrow_grads_pass.h: cuBLAS's float32
// GEMM then a narrowing pass, the bias sums stored rounded) and read so by the float32 updates,
// with the fc layers fused (fused_gemm_epilogue_grad) and not (mul_grad, elementwise_add_grad):
// the GPU follows the CPU step by step, for every optimizer. The two places round the gradients'
// float32 sums, which they add in different orders, to bfloat16 or float16 separately, so the
// losses agree to 16-bit rounding of the updates (2e-3).
TEST_F(CudaKernels2, NarrowedGradientsAndWideningUpdatesFollowTheCpu) {
  FLAGS_init_allocated_mem = false;
  auto losses = [](const std::string& opt, bool fuse, const Place& place) {
    models::TrainableModel m = ZooMlp(opt);
    if (fuse) transpiler::FuseGemmEpiloguePass().Apply(*m.main, *m.startup);
    transpiler::NarrowGradsPass pass;
    pass.Apply(*m.main, *m.startup);
    EXPECT_EQ(pass.narrowed().size(), 6u);
    return Losses(m, place, 10);
  };
  // The CPU halves run everywhere (the rewrite applies and trains); the GPU halves need a device.
  std::map<std::pair<std::string, bool>, std::vector<double>> cpu;
  for (const char* opt : {"sgd", "momentum", "adam", "adamw"})
    for (bool fuse : {true, false}) {
      SCOPED_TRACE(std::string(opt) + (fuse ? " fused epilogue" : " mul and add"));
      const std::vector<double> l = losses(opt, fuse, CPUPlace());
      for (double v : l) EXPECT_TRUE(std::isfinite(v));
      cpu[{opt, fuse}] = l;
    }
  SKIP_WITHOUT_GPU();
  for (const auto& [key, want] : cpu) {
    const std::string opt = key.first;
    const bool fuse = key.second;
    SCOPED_TRACE(opt + (fuse ? " fused epilogue" : " mul and add"));
    std::vector<double> gpu;
    ASSERT_EQ(ErrorOf([&] { gpu = losses(opt, fuse, CUDAPlace(0)); }), "");
    for (size_t s = 0; s < want.size(); ++s)
      EXPECT_NEAR(gpu[s], want[s], 2e-3 * std::max(1.0, std::abs(want[s]))) << "step " << s;
  }
}

// Gradient merge with the gradients' ops adding into the merge buffers
// (transpiler/fuse_grad_accumulation_pass.h: Device::GemmAdd on CUDA is a GEMM into a scratch and
// an add; the bias sums added): the GPU follows the CPU over two merge cycles, fc fused and not.
TEST_F(CudaKernels2, FusedGradientAccumulationFollowsTheCpu) {
  FLAGS_init_allocated_mem = false;
  auto losses = [](bool fuse, const Place& place) {
    models::TrainableModel m = ZooMlp("momentum");
    transpiler::GradientMergeOptions o;
    o.k_steps = 2;
    transpiler::GradientMergePass(o).Apply(*m.main, *m.startup);
    if (fuse) transpiler::FuseGemmEpiloguePass().Apply(*m.main, *m.startup);
    transpiler::FuseGradAccumulationPass pass;
    pass.Apply(*m.main, *m.startup);
    EXPECT_EQ(pass.fused().size(), fuse ? 6u : 3u);
    return Losses(m, place, 8);
  };
  // The CPU halves run everywhere; the GPU halves need a device.
  const std::vector<double> cpu_fused = losses(true, CPUPlace());
  const std::vector<double> cpu_plain = losses(false, CPUPlace());
  for (double v : cpu_fused) EXPECT_TRUE(std::isfinite(v));
  SKIP_WITHOUT_GPU();
  for (bool fuse : {true, false}) {
    SCOPED_TRACE(fuse ? "fused epilogue" : "mul and add");
    const std::vector<double>& want = fuse ? cpu_fused : cpu_plain;
    std::vector<double> gpu;
    ASSERT_EQ(ErrorOf([&] { gpu = losses(fuse, CUDAPlace(0)); }), "");
    for (size_t s = 0; s < want.size(); ++s)
      EXPECT_NEAR(gpu[s], want[s], 1e-4 * std::max(1.0, std::abs(want[s]))) << "step " << s;
  }
}

}  // namespace
}  // namespace keel::testing
