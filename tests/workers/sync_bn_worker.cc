// Synchronized batch norm in real processes (tests/fleet/sync_batch_norm_dp_test.cc compares).
//
// --mode=op: the sync_batch_norm op and its grad alone on ring 0 (made by c_comm_init when there
//   are several ranks). The global batch of sum(--batches) rows X [G, 3, 2, 2] and dY are drawn
//   alike on every rank (row r offset by r / 2, so that the ranks' means differ); rank k takes
//   the --batches[k] rows after those of ranks 0..k-1 (alone: all G). Two runs (X and dY drawn
//   again for the second); the moving stats update in place. Writes --out/rank<k>.safetensors:
//   x, y, dx, dscale, dbias of the second run and the moving mean and variance after both.
// --mode=model: x[-1, 2, 4, 4] -> conv2d(3, 3x3) -> batch_norm(relu) -> fc(3) -> softmax
//   cross-entropy -> mean, trained --steps steps of --rows global rows by SGD(0.1) through fleet's
//   distributed optimizer, each rank its equal share of every step's rows;
//   --strategy_sync: DistributedStrategy::sync_batch_norm, --dsl_sync: the DSL's sync flag.
//   Rank 0 saves the persistables to --out.
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "fleet/fleet.h"
#include "framework/base/strings.h"
#include "framework/io/safetensors.h"

DEFINE_string(mode, "op", "op | model.");
DEFINE_string(batches, "8", "--mode=op: rows per rank, comma-separated (alone: their sum).");
DEFINE_int32(rows, 8, "--mode=model: rows per step over all ranks.");
DEFINE_int32(steps, 4, "--mode=model: SGD steps.");
DEFINE_bool(strategy_sync, false, "--mode=model: DistributedStrategy::sync_batch_norm.");
DEFINE_bool(dsl_sync, false, "--mode=model: layers::batch_norm(..., sync=true).");
DEFINE_bool(no_ring, false, "--mode=op: skip c_comm_init (the op must refuse to run alone).");
DEFINE_string(out, "", "Output directory.");

using namespace keel;

namespace {

constexpr int64_t kC = 3, kH = 2, kW = 2;

// [rows, C, H, W] with row r's values offset by r / 2.
std::vector<float> Draw(std::mt19937_64& rng, int64_t rows, bool offset) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(static_cast<size_t>(rows * kC * kH * kW));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = u(rng) + (offset ? 0.5f * static_cast<float>(i / (kC * kH * kW)) : 0.f);
  return v;
}

Tensor Rows(const std::vector<float>& global, int64_t first, int64_t n) {
  const int64_t per = kC * kH * kW;
  std::vector<float> local(global.begin() + first * per, global.begin() + (first + n) * per);
  return Tensor::FromVector(local, {n, kC, kH, kW});
}

int RunOp(int rank, int nranks) {
  std::vector<int64_t> batches;
  for (const std::string& b : StrSplit(FLAGS_batches, ',')) batches.push_back(std::stoll(b));
  KEEL_ENFORCE(nranks == 1 || static_cast<int>(batches.size()) == nranks,
               "--batches must list one batch per rank");
  int64_t global = 0, first = 0;
  for (size_t k = 0; k < batches.size(); ++k) {
    if (static_cast<int>(k) < rank) first += batches[k];
    global += batches[k];
  }
  const int64_t local = nranks == 1 ? global : batches[rank];
  if (nranks == 1) first = 0;

  Program startup, main;
  if (nranks > 1 && !FLAGS_no_ring)
    AppendOp(startup.global_block(), "c_comm_init", {}, {},
             {{"ring_id", 0}, {"nranks", nranks}, {"rank", rank}});
  Block& b = main.global_block();
  for (const char* n : {"x", "dy"}) {
    b.Var(n)->set_is_data(true);
    b.Var(n)->set_shape({-1, kC, kH, kW});
  }
  for (const char* n : {"scale", "bias", "mean", "var"}) {
    b.Var(n)->set_shape({kC});
    b.Var(n)->set_persistable(true);
  }
  const std::map<std::string, Attribute> attrs = {{"momentum", 0.8f}, {"epsilon", 1e-5f}};
  AppendOp(b, "sync_batch_norm",
           {{"X", {"x"}},
            {"Scale", {"scale"}},
            {"Bias", {"bias"}},
            {"Mean", {"mean"}},
            {"Variance", {"var"}}},
           {{"Y", {"y"}},
            {"MeanOut", {"mean"}},
            {"VarianceOut", {"var"}},
            {"SavedMean", {"saved_mean"}},
            {"SavedVariance", {"saved_inv_std"}}},
           attrs);
  AppendOp(b, "sync_batch_norm_grad",
           {{"X", {"x"}},
            {"Scale", {"scale"}},
            {"Bias", {"bias"}},
            {"SavedMean", {"saved_mean"}},
            {"SavedVariance", {"saved_inv_std"}},
            {"Y@GRAD", {"dy"}}},
           {{"X@GRAD", {"dx"}}, {"Scale@GRAD", {"dscale"}}, {"Bias@GRAD", {"dbias"}}}, attrs);

  Executor exe(fleet::worker_place());
  exe.Run(startup);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(0.5, 1.5);
  std::vector<float> params(4 * kC);
  for (auto& p : params) p = u(rng);
  FeedMap feed = {
      {"scale", Tensor::FromVector(std::vector<float>(params.begin(), params.begin() + kC), {kC})},
      {"bias",
       Tensor::FromVector(std::vector<float>(params.begin() + kC, params.begin() + 2 * kC), {kC})},
      {"mean", Tensor::FromVector(std::vector<float>(kC, 0.f), {kC})},
      {"var", Tensor::FromVector(std::vector<float>(kC, 1.f), {kC})}};
  std::vector<Tensor> got;
  for (int run = 0; run < 2; ++run) {
    const std::vector<float> gx = Draw(rng, global, true), gdy = Draw(rng, global, false);
    feed["x"] = Rows(gx, first, local);
    feed["dy"] = Rows(gdy, first, local);
    got = exe.Run(main, feed, {"x", "y", "dx", "dscale", "dbias"});
    feed = {{"x", feed["x"]}};  // the parameters and moving stats stay in the scope
  }
  NamedTensors out;
  const char* names[] = {"x", "y", "dx", "dscale", "dbias"};
  for (int i = 0; i < 5; ++i) out.emplace_back(names[i], got[i].Clone(CPUPlace()));
  for (const char* n : {"mean", "var"})
    out.emplace_back(n, exe.scope().FindVar(n)->tensor().Clone(CPUPlace()));
  SaveSafetensors(FLAGS_out + "/rank" + std::to_string(rank) + ".safetensors", out);
  std::printf("rank %d of %d: %lld rows from row %lld of %lld\n", rank, nranks,
              static_cast<long long>(local), static_cast<long long>(first),
              static_cast<long long>(global));
  return 0;
}

int RunModel(int rank, int nranks) {
  KEEL_ENFORCE(FLAGS_rows % nranks == 0, "--rows must divide by the ranks");
  const int64_t local = FLAGS_rows / nranks;
  Program main, startup;
  startup.set_random_seed(5);
  {
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, 2, 4, 4});
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    Var h = layers::conv2d(x, 3, 3, 1, 1, 1, 1, "", {}, {}, false);
    h = layers::batch_norm(h, "relu", false, 0.9f, 1e-5f, {}, {}, false, FLAGS_dsl_sync);
    Var loss = layers::mean(layers::softmax_with_cross_entropy(layers::fc(h, 3), y));
    fleet::DistributedStrategy strategy;
    strategy.sync_batch_norm = FLAGS_strategy_sync;
    fleet::DistributedOptimizer(std::make_unique<optimizer::SGD>(0.1f), strategy)
        .minimize(loss, &startup);
  }
  int synced = 0;
  for (auto& op : fleet::main_program().global_block().ops())
    synced += op->type() == "sync_batch_norm";
  std::printf("rank %d sync_batch_norm ops %d\n", rank, synced);
  Executor exe(fleet::worker_place());
  exe.Run(startup);
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int step = 0; step < FLAGS_steps; ++step) {
    std::vector<float> gx(static_cast<size_t>(FLAGS_rows * 2 * 16));
    std::vector<int64_t> gy(static_cast<size_t>(FLAGS_rows));
    for (size_t i = 0; i < gx.size(); ++i) gx[i] = u(rng) + 0.3f * static_cast<float>(i / 32);
    for (auto& v : gy) v = static_cast<int64_t>(rng() % 3);
    const int64_t first = rank * local;
    std::vector<float> lx(gx.begin() + first * 32, gx.begin() + (first + local) * 32);
    std::vector<int64_t> ly(gy.begin() + first, gy.begin() + first + local);
    exe.Run(fleet::main_program(), {{"x", Tensor::FromVector(lx, {local, 2, 4, 4})},
                                    {"y", Tensor::FromVector(ly, {local, 1})}});
  }
  if (!FLAGS_out.empty()) fleet::save_persistables(exe, FLAGS_out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init();
    const int rank = fleet::worker_index(), n = fleet::worker_num();
    return FLAGS_mode == "model" ? RunModel(rank, n) : RunOp(rank, n);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
