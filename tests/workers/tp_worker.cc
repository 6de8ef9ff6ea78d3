// Tensor-parallel equivalence (docs/tensor-parallel.md): each rank builds the model inside its
// tensor-parallel group (fleet::tensor_parallel_config), trains --steps steps on a fixed global
// batch (each data-parallel replica keeps its rows; the ranks of a tensor-parallel group see the
// same rows) and prints "rank R step S loss L" per step; with --out every rank writes its
// parameters and batch norms' moving statistics (shards or replicas) to OUT/rankR.safetensors. Run
// without a launcher and --tp=1 it is the one-process reference.
// tests/fleet/tensor_parallel_test.cc compares.
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <cstdio>
#include <memory>
#include <random>
#include <set>

#include "fleet/fleet.h"
#include "framework/io/safetensors.h"
#include "models/resnet/resnet_model.h"
#include "models/transformer/transformer_model.h"
#include "tests/workers/worker_util.h"
#include "transpiler/tensor_parallel_pass.h"

DEFINE_int32(tp, 1, "tensor_parallel_degree (1: tensor parallelism off).");
DEFINE_string(model, "mlp",
              "mlp (every tensor-parallel op) | transformer (the built-in one) | resnet (the "
              "built-in one at depth 8, on 3x8x8 images).");
DEFINE_int32(global_batch, 8, "Rows per step over all data-parallel replicas.");
DEFINE_int32(steps, 6, "Training steps.");
DEFINE_string(opt, "sgd", "sgd | adam.");
DEFINE_string(out, "", "Directory every rank writes its parameters to.");
DEFINE_string(save_dir, "",
              "After the last step every rank calls fleet::save_persistables(SAVE_DIR): rank 0 "
              "writes the complete checkpoint.");
DEFINE_string(load_dir, "",
              "After startup every rank calls fleet::load_persistables(LOAD_DIR) (a checkpoint of "
              "any layout: one process, or the same model-parallel job).");
DEFINE_int32(first_step, 0,
             "Resume: the data stream skips the batches of the steps before this one, and training "
             "runs steps first_step .. steps-1.");
DEFINE_bool(sync_bn, false,
            "DistributedStrategy.sync_batch_norm: the batch norms take their statistics over the "
            "data-parallel replicas' batches.");
DEFINE_bool(sharding, false,
            "DistributedStrategy.sharding (ZeRO-1): the optimizer state is sharded over the "
            "data-parallel replicas of each tensor-parallel coordinate; every rank prints the "
            "bytes of state it holds.");
DEFINE_string(amp, "off", "off | bf16 | fp16: DistributedStrategy.amp in that dtype.");
DEFINE_string(amp_level, "O1", "O1 | O2.");
DEFINE_double(loss_scale, 0,
              "> 0: dynamic loss scaling from this scale; every rank prints its loss scale and "
              "skipped steps after each step.");
DEFINE_bool(local_overflow_flag, false,
            "Negative test: each rank keeps its own overflow flag (the flag's all-reduce over the "
            "tensor-parallel group is removed).");
DEFINE_bool(drop_identity_allreduce, false,
            "Negative test: replace the all-reduce of c_identity's gradient by a copy, as if the "
            "backward collective were forgotten.");

using namespace keel;

namespace {

// x [N, 8] -> column (c_identity) -> row (mp_allreduce_sum) -> column + c_concat -> replicated
// softmax; a second branch c_splits x itself into a row layer.
Var MlpLoss() {
  const bool tp = current_tensor_parallel().degree > 1;
  const auto kCol = layers::Parallel::kColumn, kRow = layers::Parallel::kRow;
  Var x = layers::data("x", {-1, 8});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 16, "tanh", 1, {}, {}, true, kCol);
  h = layers::fc(h, 12, "tanh", 1, {}, {}, true, kRow);
  Var g = layers::fc(h, 8, "", 1, {}, {}, true, kCol);
  if (tp) g = layers::c_concat(g);
  Var xs = tp ? layers::c_split(x) : x;
  Var side = layers::fc(xs, 8, "tanh", 1, {}, {}, true, kRow);
  Var logits = layers::fc(layers::elementwise_add(layers::tanh(g), side), 3, "softmax");
  return layers::mean(layers::cross_entropy(logits, y));
}

models::TransformerConfig SmallTransformer() {
  models::TransformerConfig c;
  c.vocab = 8;
  c.seq_len = 4;
  c.d_model = 8;
  c.heads = 2;
  c.d_ff = 16;
  c.layers = 2;
  c.dropout = 0;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init();
    const int rank = fleet::worker_index(), world = fleet::worker_num();
    fleet::DistributedStrategy strategy;
    strategy.tensor_parallel = FLAGS_tp > 1;
    if (strategy.tensor_parallel)
      strategy.tensor_parallel_configs.tensor_parallel_degree = FLAGS_tp;
    strategy.sync_batch_norm = FLAGS_sync_bn;
    strategy.sharding = FLAGS_sharding;
    if (FLAGS_amp != "off") {
      KEEL_ENFORCE(FLAGS_amp == "bf16" || FLAGS_amp == "fp16", "--amp must be off, bf16 or fp16");
      strategy.amp = true;
      strategy.amp_configs.dtype = FLAGS_amp == "bf16" ? DType::kBFloat16 : DType::kFloat16;
      strategy.amp_configs.level = FLAGS_amp_level;
      if (FLAGS_loss_scale > 0) {
        strategy.amp_configs.use_dynamic_loss_scaling = true;
        strategy.amp_configs.init_loss_scaling = static_cast<float>(FLAGS_loss_scale);
      }
    }
    const TensorParallelConfig tpc = fleet::tensor_parallel_config(strategy);
    const int dp = world / tpc.degree, dp_rank = rank / tpc.degree;
    KEEL_ENFORCE(FLAGS_global_batch % dp == 0, "--global_batch must divide by ", dp, " replicas");
    const int64_t local = FLAGS_global_batch / dp;
    Program main, startup;
    main.set_random_seed(7);
    startup.set_random_seed(7);
    Var loss, accuracy;               // accuracy: the transformer's (vocabulary-parallel top-1)
    std::string loss_scale, skipped;  // with --loss_scale
    {
      ProgramGuard g(main, startup);
      TensorParallelGuard tp(tpc);
      if (FLAGS_model == "mlp") {
        loss = MlpLoss();
      } else if (FLAGS_model == "resnet") {
        Var image = layers::data("image", {-1, 3, 8, 8});
        Var label = layers::data("label", {-1, 1}, DType::kInt64);
        const models::ClassifierOutputs out = models::resnet_cifar(image, label, 8);
        loss = out.loss;
        accuracy = out.accuracy;
      } else {
        KEEL_ENFORCE(FLAGS_model == "transformer", "--model must be mlp, transformer or resnet");
        const models::TransformerConfig c = SmallTransformer();
        Var ids = layers::data("ids", {-1, c.seq_len, 1}, DType::kInt64);
        Var labels = layers::data("labels", {-1, c.seq_len, 1}, DType::kInt64);
        const models::ClassifierOutputs out = models::transformer_encoder(ids, labels, c);
        loss = out.loss;
        accuracy = out.accuracy;
      }
      std::unique_ptr<optimizer::Optimizer> opt;
      if (FLAGS_opt == "adam")
        opt = std::make_unique<optimizer::Adam>(0.01f);
      else
        opt = std::make_unique<optimizer::SGD>(0.5f);
      fleet::DistributedOptimizer dist(opt->Clone(), strategy);
      dist.minimize(loss, &startup);
      if (auto amp = dist.amp_optimizer(); amp && !amp->loss_scaling_var().empty()) {
        loss_scale = amp->loss_scaling_var();
        skipped = amp->skipped_steps_var();
      }
    }
    if (FLAGS_local_overflow_flag)
      std::printf("rank %d removed %d flag collectives\n", rank,
                  testing::RemoveOverflowFlagAllReduce(fleet::main_program(),
                                                       transpiler::kTensorParallelRingId));
    if (FLAGS_drop_identity_allreduce) {
      int dropped = 0;
      for (const auto& op : fleet::main_program().global_block().ops()) {
        if (op->type() != "c_allreduce_sum" ||
            op->Attr<int>("ring_id") != transpiler::kTensorParallelRingId)
          continue;
        op->set_type("assign");
        op->RemoveAttr("ring_id");
        op->RemoveAttr("use_calc_stream");
        ++dropped;
      }
      fleet::main_program().Touch();
      std::printf("rank %d dropped %d all-reduces\n", rank, dropped);
    }
    Executor exe(fleet::worker_place());
    exe.Run(startup);
    std::printf(
        "rank %d state_bytes %lld\n", rank,
        static_cast<long long>(testing::OptimizerStateBytes(exe.scope(), fleet::main_program())));
    if (!FLAGS_load_dir.empty()) fleet::load_persistables(exe, FLAGS_load_dir);
    std::mt19937_64 rng(123);
    std::uniform_real_distribution<float> u(-1, 1);
    const models::TransformerConfig tc = SmallTransformer();
    models::ReversalTaskData data(tc, 99);
    for (int step = 0; step < FLAGS_steps; ++step) {
      FeedMap feed;
      if (FLAGS_model == "mlp") {
        std::vector<float> gx(FLAGS_global_batch * 8);
        std::vector<int64_t> gy(FLAGS_global_batch);
        for (auto& v : gx) v = u(rng);
        for (auto& v : gy) v = static_cast<int64_t>(rng() % 3);
        std::vector<float> lx(gx.begin() + dp_rank * local * 8,
                              gx.begin() + (dp_rank + 1) * local * 8);
        std::vector<int64_t> ly(gy.begin() + dp_rank * local, gy.begin() + (dp_rank + 1) * local);
        feed = {{"x", Tensor::FromVector(lx, {local, 8})},
                {"y", Tensor::FromVector(ly, {local, 1})}};
      } else if (FLAGS_model == "resnet") {
        const int64_t pixels = 3 * 8 * 8;
        std::vector<float> gx(FLAGS_global_batch * pixels);
        std::vector<int64_t> gy(FLAGS_global_batch);
        for (auto& v : gx) v = u(rng);
        for (auto& v : gy) v = static_cast<int64_t>(rng() % 10);
        std::vector<float> lx(gx.begin() + dp_rank * local * pixels,
                              gx.begin() + (dp_rank + 1) * local * pixels);
        std::vector<int64_t> ly(gy.begin() + dp_rank * local, gy.begin() + (dp_rank + 1) * local);
        feed = {{"image", Tensor::FromVector(lx, {local, 3, 8, 8})},
                {"label", Tensor::FromVector(ly, {local, 1})}};
      } else {
        Tensor ids, labels;
        data.Next(FLAGS_global_batch, &ids, &labels);
        const int64_t L = tc.seq_len;
        const int64_t* pi = ids.data<int64_t>();
        const int64_t* pl = labels.data<int64_t>();
        std::vector<int64_t> li(pi + dp_rank * local * L, pi + (dp_rank + 1) * local * L);
        std::vector<int64_t> ll(pl + dp_rank * local * L, pl + (dp_rank + 1) * local * L);
        feed = {{"ids", Tensor::FromVector(li, {local, L, 1})},
                {"labels", Tensor::FromVector(ll, {local, L, 1})}};
      }
      if (step < FLAGS_first_step) continue;  // a resumed run: this step's data was trained on
      std::vector<std::string> fetch = {loss.name()};
      if (accuracy.valid()) fetch.push_back(accuracy.name());
      auto out = exe.Run(fleet::main_program(), feed, fetch);
      std::printf("rank %d step %d loss %.9g", rank, step, out[0].item<double>());
      if (accuracy.valid()) std::printf(" accuracy %.9g", out[1].item<double>());
      std::printf("\n");
      if (!loss_scale.empty())
        std::printf("rank %d step %d loss_scale %g skipped %g\n", rank, step,
                    exe.scope().FindVar(loss_scale)->tensor().data<float>()[0],
                    exe.scope().FindVar(skipped)->tensor().data<float>()[0]);
    }
    if (!FLAGS_save_dir.empty()) fleet::save_persistables(exe, FLAGS_save_dir);
    if (!FLAGS_out.empty()) {
      // The parameters, and the moving statistics the batch norms write.
      std::set<std::string> stats;
      for (const auto& op : fleet::main_program().global_block().ops())
        if (op->type() == "batch_norm" || op->type() == "sync_batch_norm")
          for (const char* slot : {"MeanOut", "VarianceOut"})
            for (const std::string& name : op->Output(slot)) stats.insert(name);
      NamedTensors params;
      for (VarDesc* v : fleet::main_program().global_block().AllVars())
        if (v->is_parameter() || stats.count(v->name()))
          params.emplace_back(v->name(),
                              exe.scope().FindVar(v->name())->tensor().Clone(CPUPlace()));
      SaveSafetensors(FLAGS_out + "/rank" + std::to_string(rank) + ".safetensors", params);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
