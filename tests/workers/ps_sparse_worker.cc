// Sparse embedding tables in parameter-server training (docs/sparse-embeddings.md) against one
// process: ids [B, 4, 1] in [0, --vocab) -> embedding [--vocab, --dim] (--table=sparse: is_sparse;
// --table=distributed: is_distributed, which is also row-sparse) -> [B, 4 * dim] -> fc 16 tanh ->
// fc 2 -> softmax cross-entropy, trained with --optimizer (sgd, or adam with lazy_mode) on --rows
// rows per step in all. The ids are skewed (a few hot rows that every trainer's share touches, a
// long tail), so the servers merge rows that several trainers sent. Under `keel launch
// --server_num=S --worker_num=W` each trainer trains on its 1/W share of every step's rows; alone
// it is one process on all the rows. Trainer 0 (or the single process) writes its parameters to
// --out; with --table=distributed (where no trainer holds the table) every server writes the rows
// it holds to --out/server<i> (rows.bin: count, then per row its id and values), and the single
// process writes its whole table there as server0 of 1.
#include <gflags/gflags.h>
#include <keel/keel.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "fleet/fleet.h"
#include "framework/io/checkpoint.h"

DEFINE_string(table, "sparse", "sparse (is_sparse) or distributed (is_distributed).");
DEFINE_string(optimizer, "sgd", "sgd or adam (lazy_mode).");
DEFINE_string(mode, "sync", "sync, async or geo.");
DEFINE_int32(geo_k, 2, "--mode=geo: push every k steps.");
DEFINE_int32(send_queue_size, 16,
             "--mode=async: a_sync_configs.send_queue_size (0: no communicator, exact).");
DEFINE_int32(max_merge_var_num, 1, "--mode=async: a_sync_configs.max_merge_var_num.");
DEFINE_int32(lookups, 1, "Lookups of the table: 1 (all 4 slots at once) or 2 (2 slots each).");
DEFINE_int32(rows, 16, "Rows per step over all trainers.");
DEFINE_int32(steps, 4, "Steps to train.");
DEFINE_int64(vocab, 2048, "Table rows.");
DEFINE_int32(dim, 8, "Table width.");
DEFINE_int64(id_range, 0, "Ids are drawn from [0, id_range) (0: the whole table).");
DEFINE_bool(uniform_ids, false, "Ids uniform in the range instead of skewed.");
DEFINE_bool(checkpoint, false,
            "Write a whole checkpoint instead (parameters, optimizer state, learning rate): "
            "fleet::save_persistables in parameter-server mode, which pulls the servers' state.");
DEFINE_string(out, "", "Directory for the parameters.");
DEFINE_int64(worker_memory_mb, 0,
             "DistributedStrategy::ps_worker_memory_mb (0: no limit): a trainer whose own "
             "parameters exceed it is refused.");

using namespace keel;

namespace {

// A skewed id in [0, range): u^3 puts about half the draws on the first 1/8 of the range.
int64_t Id(std::mt19937_64& rng, int64_t range) {
  const double u = std::uniform_real_distribution<double>(0, 1)(rng);
  return std::min<int64_t>(range - 1, static_cast<int64_t>(u * u * u * range));
}

// A line of /proc/self/status in kB ("VmRSS:", "VmHWM:"); 0 when absent.
double Status(const std::string& key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kb = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr)
    if (std::string(line).rfind(key, 0) == 0) kb = std::atof(line + key.size());
  std::fclose(f);
  return kb;
}

// rows.bin: the row count, then per row its id and `width` floats.
void WriteRows(const std::string& file, const int64_t* ids, const float* rows, int64_t n,
               int64_t width) {
  FILE* f = std::fopen(file.c_str(), "wb");
  KEEL_ENFORCE(f != nullptr, "cannot write ", file);
  std::fwrite(&n, sizeof(n), 1, f);
  for (int64_t r = 0; r < n; ++r) {
    std::fwrite(ids + r, sizeof(int64_t), 1, f);
    std::fwrite(rows + r * width, sizeof(float), width, f);
  }
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    const bool ps = std::getenv("TRAINING_ROLE") != nullptr;
    if (ps) fleet::init(fleet::CloudRoleMaker(/*is_collective=*/false));
    const int n = ps ? fleet::worker_num() : 1;
    const int id = ps && fleet::is_worker() ? fleet::worker_index() : 0;
    KEEL_ENFORCE(FLAGS_rows % n == 0, "--rows must divide by the trainers, ", n);
    KEEL_ENFORCE(FLAGS_table == "sparse" || FLAGS_table == "distributed", "--table=", FLAGS_table);
    const bool distributed = FLAGS_table == "distributed";
    const int64_t local = FLAGS_rows / n, slots = 4, D = FLAGS_dim;
    Program main, startup;
    startup.set_random_seed(7);
    std::string loss_name;
    {
      ProgramGuard g(main, startup);
      Var ids = layers::data("ids", {-1, slots, 1}, DType::kInt64);
      Var y = layers::data("y", {-1, 1}, DType::kInt64);
      KEEL_ENFORCE(FLAGS_lookups == 1 || FLAGS_lookups == 2, "--lookups=", FLAGS_lookups);
      auto lookup = [&](Var part) {
        return layers::embedding(part, {FLAGS_vocab, D}, -1,
                                 ParamAttr("table", initializer::Uniform(-0.5f, 0.5f)),
                                 DType::kFloat32, /*is_sparse=*/true, distributed);
      };
      Var emb = ids;
      if (FLAGS_lookups == 1) {
        emb = lookup(ids);
      } else {  // one table, looked up twice (2 slots each)
        std::vector<Var> parts = layers::split(ids, {2, 2}, 1);
        emb = layers::concat({lookup(parts[0]), lookup(parts[1])}, 1);
      }
      Var h = layers::fc(layers::reshape(emb, {-1, static_cast<int>(slots * D)}), 16, "tanh");
      Var loss = layers::mean(layers::softmax_with_cross_entropy(layers::fc(h, 2), y));
      loss_name = loss.name();
      std::unique_ptr<optimizer::Optimizer> opt;
      if (FLAGS_optimizer == "sgd") {
        opt = optimizer::SGD(0.5f).Clone();
      } else {
        KEEL_ENFORCE(FLAGS_optimizer == "adam", "--optimizer must be sgd or adam");
        opt = optimizer::Adam(0.01f, 0.9f, 0.999f, 1e-8f, /*lazy_mode=*/true).Clone();
      }
      if (ps) {
        fleet::DistributedStrategy strategy;
        KEEL_ENFORCE(FLAGS_mode == "sync" || FLAGS_mode == "async" || FLAGS_mode == "geo",
                     "--mode=", FLAGS_mode);
        strategy.a_sync = FLAGS_mode != "sync";
        if (FLAGS_mode == "geo") strategy.a_sync_configs.k_steps = FLAGS_geo_k;
        if (FLAGS_mode == "async") {
          strategy.a_sync_configs.send_queue_size = FLAGS_send_queue_size;
          strategy.a_sync_configs.max_merge_var_num = FLAGS_max_merge_var_num;
        }
        strategy.ps_worker_memory_mb = FLAGS_worker_memory_mb;
        fleet::DistributedOptimizer(std::move(opt), strategy).minimize(loss, &startup);
      } else {
        opt->minimize(loss, &startup);
      }
    }
    Executor exe(CPUPlace());
    if (ps && fleet::is_server()) {
      std::printf("server %d VmRSS before %.1f MB\n", fleet::server_index(),
                  Status("VmRSS:") / 1024.0);
      fleet::run_server(exe);
      std::printf("server %d done, VmHWM %.1f MB\n", fleet::server_index(),
                  Status("VmHWM:") / 1024.0);
      if (distributed) {
        // Its shard: the table's rows (created on first touch) and their ids.
        const Tensor& t = exe.scope().FindVar("table")->tensor();
        const Tensor& ids = exe.scope().FindVar("table@IDS")->tensor();
        std::printf("server %d holds %lld rows of table, VmRSS %.1f MB\n", fleet::server_index(),
                    static_cast<long long>(ids.numel()), Status("VmRSS:") / 1024.0);
        if (!FLAGS_out.empty()) {
          const std::string dir = FLAGS_out + "/server" + std::to_string(fleet::server_index());
          ::mkdir(FLAGS_out.c_str(), 0755);
          ::mkdir(dir.c_str(), 0755);
          WriteRows(dir + "/rows.bin", ids.data<int64_t>(), t.data<float>(), ids.numel(), D);
        }
      }
      return 0;
    }
    Program& train = ps ? fleet::main_program() : main;
    exe.Run(ps ? fleet::startup_program() : startup);
    std::mt19937_64 rng(99);
    const int64_t range = FLAGS_id_range > 0 ? FLAGS_id_range : FLAGS_vocab;
    for (int step = 0; step < FLAGS_steps; ++step) {
      std::vector<int64_t> gi(static_cast<size_t>(FLAGS_rows * slots));
      std::vector<int64_t> gy(FLAGS_rows);
      for (auto& v : gi)
        v = FLAGS_uniform_ids ? static_cast<int64_t>(rng() % static_cast<uint64_t>(range))
                              : Id(rng, range);
      for (auto& v : gy) v = static_cast<int64_t>(rng() % 2);
      const int64_t first = id * local;
      std::vector<int64_t> li(gi.begin() + first * slots, gi.begin() + (first + local) * slots);
      std::vector<int64_t> ly(gy.begin() + first, gy.begin() + first + local);
      const std::vector<Tensor> loss = exe.Run(train,
                                               {{"ids", Tensor::FromVector(li, {local, slots, 1})},
                                                {"y", Tensor::FromVector(ly, {local, 1})}},
                                               {loss_name});
      if (step == 0 || step == FLAGS_steps - 1)
        std::printf("trainer %d step %d loss %.6f\n", id, step, loss[0].data<float>()[0]);
    }
    if (FLAGS_checkpoint) {
      if (ps) {
        fleet::save_persistables(exe, FLAGS_out);  // trainer 0 writes, before the servers stop
      } else {
        keel::save_persistables(exe.scope(), FLAGS_out, main);
      }
    }
    if (ps) fleet::stop_worker();
    if (!FLAGS_checkpoint && id == 0 && !FLAGS_out.empty()) {
      Program params;
      for (VarDesc* v : train.global_block().AllVars())
        if (v->is_parameter()) *params.global_block().Var(v->name()) = *v;
      keel::save_persistables(exe.scope(), FLAGS_out, params);
      if (distributed && !ps) {
        // One process: its whole table, as the rows of one server.
        const std::string dir = FLAGS_out + "/server0";
        ::mkdir(dir.c_str(), 0755);
        const Tensor& t = exe.scope().FindVar("table")->tensor();
        std::vector<int64_t> ids(static_cast<size_t>(t.dims()[0]));
        for (size_t r = 0; r < ids.size(); ++r) ids[r] = static_cast<int64_t>(r);
        WriteRows(dir + "/rows.bin", ids.data(), t.data<float>(), t.dims()[0], D);
      }
    }
    std::printf("trainer %d trained %d steps, VmHWM %.1f MB\n", id, FLAGS_steps,
                Status("VmHWM:") / 1024.0);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
