// Every op the built-in models' programs contain has a CUDA kernel for the dtype it runs in, so
// none of them goes through the host fallback on CUDAPlace: each model with each optimizer, a
// learning-rate schedule with warm-up, gradient clipping and weight decay, its fc layers fused (as
// keel train runs them) and transpiled for two ranks with fused gradients. A registry check: it
// runs without a GPU, in any CUDA build.
#include <gtest/gtest.h>

#include <set>

#include "fleet/distributed_strategy.h"
#include "fleet/transpile.h"
#include "framework/dsl/lr_schedule.h"
#include "framework/op/op_registry.h"
#include "models/model_zoo.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/fuse_gemm_epilogue_pass.h"
#include "transpiler/grad_allreduce_pass.h"

namespace keel {
namespace {

// Collective ops belong to the communication layer (their CUDA kernels need NCCL).
bool IsCollective(const std::string& type) { return type.rfind("c_", 0) == 0; }

// Ops another part of issue 7 covers (cuDNN), listed until their kernels land.
bool ElsewhereInIssue7(const std::string& type) {
  static const std::set<std::string> ops = {"conv2d",      "conv2d_grad", "pool2d",
                                            "pool2d_grad", "batch_norm",  "batch_norm_grad"};
  return ops.count(type) > 0;
}

// CPU-only ops that refuse CUDA with a keel::Error naming them: sync_batch_norm (the strategy
// refuses it on GPUs, the op refuses a CUDA ring; docs/sync-batch-norm.md).
[[maybe_unused]] bool CpuOnly(const std::string& type) {
  // Parameter-server ops (ops/ps_*.cc, sparse tables included): servers and trainers run on CPU;
  // a CUDA place finds no kernel and is refused naming the op (the strategy refuses GPUs first).
  static const std::set<std::string> ops = {"sync_batch_norm",
                                            "sync_batch_norm_grad",
                                            "send",
                                            "recv",
                                            "send_barrier",
                                            "fetch_barrier",
                                            "listen_and_serv",
                                            "geo_communicate",
                                            "distributed_lookup_table",
                                            "merge_sparse_grad",
                                            "distributed_lookup_table_grad",
                                            "row_seeded_random"};
  return ops.count(type) > 0;
}

[[maybe_unused]] void CollectMissing(const Program& p, const std::string& what,
                                     std::set<std::string>* missing) {
  for (int b = 0; b < p.num_blocks(); ++b)
    for (auto& op : p.block(b).ops()) {
      if (IsCollective(op->type()) || ElsewhereInIssue7(op->type())) continue;
      const DType dt = OpRegistry::KernelDType(*op, p.block(b));
      if (!OpRegistry::HasKernel(op->type(), Place::Kind::kCUDA, dt))
        missing->insert(op->type() + "/" + DTypeName(dt) + " (" + what + ")");
    }
}

TEST(CudaKernelCoverage, EveryOpOfTheBuiltInModelsHasACudaKernel) {
#ifndef KEEL_WITH_CUDA
  GTEST_SKIP() << "keel built without CUDA: no CUDA kernels to check";
#else
  std::set<std::string> missing;
  for (const std::string& model : models::ModelNames())
    for (const char* opt : {"sgd", "momentum", "adam", "adamw"}) {
      SCOPED_TRACE(model + " " + opt);
      models::ModelConfig cfg;
      cfg.name = model;
      cfg.seed = 1;
      cfg.programs_only = true;
      const std::string name = opt;
      cfg.make_optimizer = [name](const std::string&, float) {
        LearningRate lr = lr_schedule::LinearWarmup(lr_schedule::Cosine(0.01f, 1000), 10);
        std::unique_ptr<optimizer::Optimizer> o;
        if (name == "sgd") o = std::make_unique<optimizer::SGD>(lr);
        if (name == "momentum") o = std::make_unique<optimizer::Momentum>(lr, 0.9f);
        if (name == "adam") o = std::make_unique<optimizer::Adam>(lr);
        if (name == "adamw") o = std::make_unique<optimizer::AdamW>(lr);
        o->set_grad_clip(optimizer::GradientClipByGlobalNorm{1.0f});
        if (name != "adamw") o->set_weight_decay(1e-4f);
        return o;
      };
      models::TrainableModel m = models::BuildModel(cfg);
      fleet::DistributedStrategy s;
      s.fuse_all_reduce_ops = true;
      transpiler::FuseGemmEpiloguePass().Apply(*m.main, *m.startup);  // keel train's default
      transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, testing::TwoOfFour()))
          .Apply(*m.main, *m.startup);
      CollectMissing(*m.main, model + " main", &missing);
      CollectMissing(*m.startup, model + " startup", &missing);
      if (m.test) CollectMissing(*m.test, model + " test", &missing);
    }
  std::string list;
  for (const std::string& s : missing) list += "\n  " + s;
  EXPECT_TRUE(missing.empty()) << "ops that would run through the host fallback:" << list;
#endif
}

// Also the piecewise schedule and the ops the DSL offers beyond the models.
TEST(CudaKernelCoverage, EveryOpTypeWithACpuKernelHasACudaKernelExceptListedOnes) {
#ifndef KEEL_WITH_CUDA
  GTEST_SKIP() << "keel built without CUDA: no CUDA kernels to check";
#else
  std::string list;
  for (const std::string& type : OpRegistry::OpTypes()) {
    if (IsCollective(type) || ElsewhereInIssue7(type) || CpuOnly(type)) continue;
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kBool,
                     DType::kUInt8, DType::kInt8, DType::kFloat16, DType::kBFloat16})
      if (OpRegistry::HasKernel(type, Place::Kind::kCPU, dt) &&
          !OpRegistry::HasKernel(type, Place::Kind::kCUDA, dt))
        list += "\n  " + type + "/" + DTypeName(dt);
  }
  EXPECT_TRUE(list.empty()) << "CPU kernels without a CUDA twin:" << list;
#endif
}

}  // namespace
}  // namespace keel
