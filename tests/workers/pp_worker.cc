// Pipeline-parallel equivalence (docs/pipeline.md): every rank builds a 4-layer MLP whose layers
// sit on stages (layer k on stage k * pp / 4; a side branch from the first layer's output joins
// at the last stage, so activations and gradients are relayed through the stages between),
// trains --steps steps on a fixed global batch (each data-parallel replica keeps its rows) and,
// on the last stage, prints "rank R step S loss L" per step; with --out every rank writes the
// parameters it holds to OUT/rankR.safetensors. Without a launcher and with --pp=1 it is the
// one-process reference. tests/fleet/pipeline_parallel_test.cc compares.
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "fleet/fleet.h"
#include "fleet/pipeline_runner.h"
#include "framework/dsl/pipeline.h"
#include "framework/io/safetensors.h"
#include "framework/runtime/allocator.h"
#include "models/resnet/resnet_model.h"
#include "models/transformer/transformer_model.h"
#include "tests/workers/worker_util.h"
#include "transpiler/pipeline_pass.h"

DEFINE_int32(pp, 1, "pipeline stages (1: no pipeline, the reference).");
DEFINE_string(model, "mlp",
              "mlp (a side branch relayed through the stages) | transformer | resnet (depth 8, "
              "8x8 images).");
DEFINE_bool(sync_bn, false,
            "DistributedStrategy.sync_batch_norm: each stage's data-parallel replicas normalize "
            "each micro-batch together (with --merge: the one-process reference's sync batch "
            "norm).");
DEFINE_int32(replicas, 1,
             "With --merge: the data-parallel replicas of the job this run is the reference of; "
             "micro-batch k is every replica's k-th micro-batch, in replica order.");
DEFINE_int32(micro, 4, "micro-batches per mini-batch.");
DEFINE_string(schedule, "1F1B", "1F1B | F-then-B.");
DEFINE_int32(global_batch, 16, "Rows per step over all data-parallel replicas.");
DEFINE_int32(steps, 4, "Training steps.");
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
DEFINE_int32(hidden, 16, "Width of the first layer (its activations dominate the memory).");
DEFINE_int32(stall_stage, -1,
             "Fault test: the process of this stage sleeps --stall_s seconds before step 1, as a "
             "hung peer would.");
DEFINE_int32(stall_s, 30, "With --stall_stage: seconds to sleep.");
DEFINE_int32(vanish_stage, -1,
             "Fault test: the process of this stage disappears before step 1 (_Exit(0): no "
             "destructors, its connections closed by the kernel, as a crashed peer's are; exit "
             "status 0 so that keel launch leaves its neighbours running).");
DEFINE_bool(recompute, false,
            "DistributedStrategy.recompute: backward recomputes the transformer's sublayers from "
            "their checkpoints, inside each stage.");
DEFINE_double(loss_scale, 0,
              "> 0: mixed precision in float16 with dynamic loss scaling from this scale; every "
              "rank prints its loss scale and skipped steps after each step.");
DEFINE_int32(merge, 1,
             "With --pp=1: DistributedStrategy.gradient_merge with k_steps=MERGE (averaged), each "
             "step run as MERGE runs of global_batch/MERGE rows in order, as a pipeline's "
             "micro-batches (the reference of a pipeline with --loss_scale).");
DEFINE_bool(sharding, false,
            "DistributedStrategy.sharding (ZeRO-1): each stage's optimizer state is sharded over "
            "its data-parallel replicas; every rank prints the bytes of state it holds.");
DEFINE_bool(local_overflow_flag, false,
            "Negative test: each stage keeps its own overflow flag (the flag's all-reduce over "
            "the pipeline group is removed), as if the stages did not agree on skipped steps.");
DEFINE_bool(unordered_recv, false,
            "Negative test: every recv_v2 of stage 1 waits for the tag of another transfer, as if "
            "receives were matched by arrival instead of by tag (must fail by the comm timeout).");

using namespace keel;

namespace {

Var MlpLoss(int pp) {
  auto stage = [&](int layer) { return PipelineStageGuard(layer * pp / 4); };
  Var x = layers::data("x", {-1, 8});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h1, h2, h3, loss;
  {
    PipelineStageGuard s = stage(0);
    h1 = layers::fc(x, FLAGS_hidden, "tanh");
  }
  {
    PipelineStageGuard s = stage(1);
    h2 = layers::fc(h1, 12, "tanh");
  }
  {
    PipelineStageGuard s = stage(2);
    h3 = layers::fc(h2, 8, "tanh");
  }
  {
    PipelineStageGuard s = stage(3);
    Var side = layers::fc(h1, 8, "tanh");
    Var logits = layers::fc(layers::elementwise_add(h3, side), 3, "softmax");
    loss = layers::mean(layers::cross_entropy(logits, y));
  }
  return loss;
}

models::TransformerConfig SmallTransformer() {
  models::TransformerConfig c;
  c.vocab = 8;
  c.seq_len = 4;
  c.d_model = 8;
  c.heads = 2;
  c.d_ff = 16;
  c.layers = 2;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init();
    const int rank = fleet::worker_index(), world = fleet::worker_num();
    KEEL_ENFORCE(world % FLAGS_pp == 0, "--pp must divide the world");
    fleet::DistributedStrategy strategy;
    if (FLAGS_pp > 1) {
      strategy.pipeline = true;
      strategy.pipeline_configs.pp_degree = FLAGS_pp;
      strategy.pipeline_configs.accumulate_steps = FLAGS_micro;
      strategy.pipeline_configs.schedule_mode = FLAGS_schedule;
    }
    strategy.recompute = FLAGS_recompute;
    strategy.sync_batch_norm = FLAGS_sync_bn;
    strategy.sharding = FLAGS_sharding;
    if (FLAGS_merge > 1) {
      KEEL_ENFORCE(FLAGS_pp == 1 && world == 1, "--merge is the one-process reference");
      KEEL_ENFORCE(FLAGS_global_batch % FLAGS_merge == 0, "--merge must divide --global_batch");
      strategy.gradient_merge = true;
      strategy.gradient_merge_configs.k_steps = FLAGS_merge;
    }
    if (FLAGS_loss_scale > 0) {
      strategy.amp = true;
      strategy.amp_configs.dtype = DType::kFloat16;
      strategy.amp_configs.init_loss_scaling = static_cast<float>(FLAGS_loss_scale);
    }
    const int dp = world / FLAGS_pp, dp_rank = rank / FLAGS_pp;
    KEEL_ENFORCE(FLAGS_global_batch % dp == 0, "--global_batch must divide by ", dp, " replicas");
    const int64_t local = FLAGS_global_batch / dp;
    Program main, startup;
    main.set_random_seed(7);
    startup.set_random_seed(7);
    Var loss;
    std::string loss_scale, skipped;  // with --loss_scale
    {
      ProgramGuard g(main, startup);
      if (FLAGS_model == "mlp") {
        loss = MlpLoss(FLAGS_pp);
      } else if (FLAGS_model == "resnet") {
        Var image = layers::data("image", {-1, 3, 8, 8});
        Var label = layers::data("label", {-1, 1}, DType::kInt64);
        loss = models::resnet_cifar(image, label, 8, 10, FLAGS_pp).loss;
      } else {
        KEEL_ENFORCE(FLAGS_model == "transformer", "--model must be mlp, transformer or resnet");
        const models::TransformerConfig c = SmallTransformer();
        Var ids = layers::data("ids", {-1, c.seq_len, 1}, DType::kInt64);
        Var labels = layers::data("labels", {-1, c.seq_len, 1}, DType::kInt64);
        loss = models::transformer_encoder(ids, labels, c, FLAGS_pp).loss;
      }
      std::unique_ptr<optimizer::Optimizer> opt;
      if (FLAGS_opt == "adam")
        opt = std::make_unique<optimizer::Adam>(0.01f);
      else
        opt = std::make_unique<optimizer::SGD>(0.5f);
      fleet::DistributedOptimizer dist(opt->Clone(), strategy);
      dist.minimize(loss, &startup);
      if (auto amp = dist.amp_optimizer()) {
        loss_scale = amp->loss_scaling_var();
        skipped = amp->skipped_steps_var();
      }
    }
    if (FLAGS_local_overflow_flag)
      std::printf(
          "rank %d removed %d flag collectives\n", rank,
          testing::RemoveOverflowFlagAllReduce(fleet::main_program(), transpiler::kPipelineRingId));
    if (FLAGS_unordered_recv) {
      int changed = 0;
      for (const auto& op : fleet::main_program().global_block().ops())
        if (op->type() == "recv_v2") {
          op->SetAttr("tag", op->Attr<int>("tag") + 1);
          ++changed;
        }
      fleet::main_program().Touch();
      std::printf("rank %d retagged %d receives\n", rank, changed);
    }
    Executor exe(fleet::worker_place());
    exe.Run(startup);
    std::printf(
        "rank %d state_bytes %lld\n", rank,
        static_cast<long long>(testing::OptimizerStateBytes(exe.scope(), fleet::main_program())));
    if (!FLAGS_load_dir.empty()) fleet::load_persistables(exe, FLAGS_load_dir);
    std::unique_ptr<fleet::PipelineRunner> runner;
    const bool last = FLAGS_pp == 1 || rank % FLAGS_pp == FLAGS_pp - 1;
    if (FLAGS_pp > 1)
      runner = std::make_unique<fleet::PipelineRunner>(
          exe, fleet::main_program(), fleet::PipelineRunOptionsFor(strategy, fleet::role()));
    models::ReversalTaskData tokens(SmallTransformer(), 99);
    std::mt19937_64 rng(123);
    std::uniform_real_distribution<float> u(-1, 1);
    for (int step = 0; step < FLAGS_steps; ++step) {
      if (step == 1 && rank % FLAGS_pp == FLAGS_stall_stage)
        std::this_thread::sleep_for(std::chrono::seconds(FLAGS_stall_s));
      if (step == 1 && rank % FLAGS_pp == FLAGS_vanish_stage) {
        std::printf("rank %d vanishes\n", rank);
        std::fflush(stdout);
        std::_Exit(0);
      }
      CpuAllocatorResetPeak();
      std::vector<float> gx(FLAGS_global_batch * 8);
      std::vector<int64_t> gy(FLAGS_global_batch);
      for (auto& v : gx) v = u(rng);
      for (auto& v : gy) v = static_cast<int64_t>(rng() % 3);
      std::vector<float> lx(gx.begin() + dp_rank * local * 8,
                            gx.begin() + (dp_rank + 1) * local * 8);
      std::vector<int64_t> ly(gy.begin() + dp_rank * local, gy.begin() + (dp_rank + 1) * local);
      FeedMap feed = {{"x", Tensor::FromVector(lx, {local, 8})},
                      {"y", Tensor::FromVector(ly, {local, 1})}};
      if (FLAGS_model == "transformer") {
        Tensor ids, labels;
        tokens.Next(FLAGS_global_batch, &ids, &labels);
        feed = {{"ids", ids.Slice(dp_rank * local, (dp_rank + 1) * local)},
                {"labels", labels.Slice(dp_rank * local, (dp_rank + 1) * local)}};
      } else if (FLAGS_model == "resnet") {
        const int64_t pixels = 3 * 8 * 8;
        std::vector<float> gi(FLAGS_global_batch * pixels);
        std::vector<int64_t> gl(FLAGS_global_batch);
        for (auto& v : gi) v = u(rng);
        for (auto& v : gl) v = static_cast<int64_t>(rng() % 10);
        if (FLAGS_replicas > 1) {
          // The reference of R replicas: micro-batch k of this run holds every replica's k-th
          // micro-batch (rows r * local + k * rows ..), replica by replica.
          const int R = FLAGS_replicas, M = FLAGS_merge;
          const int64_t per = FLAGS_global_batch / R, rows = per / M;
          std::vector<float> pi;
          std::vector<int64_t> pl;
          for (int k = 0; k < M; ++k)
            for (int r = 0; r < R; ++r)
              for (int64_t i = r * per + k * rows; i < r * per + (k + 1) * rows; ++i) {
                pi.insert(pi.end(), gi.begin() + i * pixels, gi.begin() + (i + 1) * pixels);
                pl.push_back(gl[i]);
              }
          gi = std::move(pi);
          gl = std::move(pl);
        }
        std::vector<float> li(gi.begin() + dp_rank * local * pixels,
                              gi.begin() + (dp_rank + 1) * local * pixels);
        std::vector<int64_t> ll(gl.begin() + dp_rank * local, gl.begin() + (dp_rank + 1) * local);
        feed = {{"image", Tensor::FromVector(li, {local, 3, 8, 8})},
                {"label", Tensor::FromVector(ll, {local, 1})}};
      }
      if (step < FLAGS_first_step) continue;  // a resumed run: this step's data was trained on
      std::vector<Tensor> out;
      if (runner) {
        out = runner->Step(
            feed, last ? std::vector<std::string>{loss.name()} : std::vector<std::string>{});
      } else if (FLAGS_merge > 1) {
        // The micro-batches in order; the step's loss is their mean.
        const int64_t rows = local / FLAGS_merge;
        double sum = 0;
        for (int k = 0; k < FLAGS_merge; ++k) {
          FeedMap part;
          for (const auto& [name, t] : feed) part[name] = t.Slice(k * rows, (k + 1) * rows);
          sum += exe.Run(fleet::main_program(), part, {loss.name()})[0].item<double>();
        }
        out = {Tensor::FromVector(std::vector<double>{sum / FLAGS_merge}, {1})};
      } else {
        out = exe.Run(fleet::main_program(), feed, {loss.name()});
      }
      // The global batch's loss: the last stage of each replica holds its replica's.
      double l = last ? out[0].item<double>() : 0.0;
      if (world > 1) l = fleet::metrics::sum(l) / dp;
      if (last) std::printf("rank %d step %d loss %.9g\n", rank, step, l);
      if (!loss_scale.empty())
        std::printf("rank %d step %d loss_scale %g skipped %g\n", rank, step,
                    exe.scope().FindVar(loss_scale)->tensor().data<float>()[0],
                    exe.scope().FindVar(skipped)->tensor().data<float>()[0]);
      if (runner)
        std::printf("rank %d step %d peak_in_flight %d\n", rank, step, runner->peak_in_flight());
      std::printf("rank %d step %d peak_bytes %zu\n", rank, step,
                  CpuAllocatorStats().peak_in_use_bytes);
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
    // Rank 0 serves the job's store: with no step to run (a resume past the last step) the first
    // stage is done at once and must not exit while the other stage still sets up its rings
    // through the store (1 run in 80 failed so under load).
    if (world > 1) fleet::barrier_worker();
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
