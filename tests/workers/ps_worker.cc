// Parameter-server training (--mode=sync|async|geo) against one process: an MLP (64 -> 256 tanh ->
// 10, so that fc_0.w_0's 16384 elements split into two blocks over two servers) with --optimizer on
// --rows rows per step in all. Under `keel launch --server_num=S --worker_num=W` each trainer
// trains on its 1/W share of every step's rows through fleet's parameter-server mode (servers
// run fleet::run_server); alone (no TRAINING_ROLE) it is one process on all the rows. Trainer 0
// (or the single process) writes its parameters to --out; tests/fleet/parameter_server_test.cc
// compares them (tests/fleet/parameter_server_async_test.cc also reads the servers' blocks, which
// they write to --out/server<i> when every trainer stopped). --short_trainer=T: trainer T runs one
// step fewer (sync mode must refuse that; async and GEO accept it).
#include <gflags/gflags.h>
#include <keel/keel.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "fleet/fleet.h"
#include "framework/io/checkpoint.h"

DEFINE_string(optimizer, "sgd", "sgd, momentum or adam.");
DEFINE_bool(piecewise, false,
            "The learning rate drops tenfold after step 2 (a schedule the servers run).");
DEFINE_int32(rows, 16, "Rows per step over all trainers.");
DEFINE_int32(steps, 4, "Steps to train.");
DEFINE_string(out, "", "Directory trainer 0 writes its parameters to.");
DEFINE_int32(short_trainer, -1, "This trainer runs one step fewer.");
DEFINE_bool(checkpoint, false,
            "Write a whole checkpoint instead (parameters, optimizer state, learning rate): "
            "fleet::save_persistables in parameter-server mode, which pulls the servers' state.");
DEFINE_int32(die_trainer, -1, "This trainer exits (code 3) after 2 steps, without stop_worker.");
DEFINE_string(mode, "sync",
              "sync (a_sync=false), async (a_sync=true) or geo (a_sync=true, k_steps=--geo_k).");
DEFINE_int32(geo_k, 2, "--mode=geo: push every k steps.");
DEFINE_int32(send_queue_size, 16,
             "--mode=async: a_sync_configs.send_queue_size (0: no communicator, exact).");
DEFINE_int32(max_merge_var_num, 1, "--mode=async: a_sync_configs.max_merge_var_num.");
DEFINE_int32(max_staleness, 0, "--mode=async: a_sync_configs.max_staleness (-1: never wait).");
DEFINE_bool(linear, false,
            "The model is mean(fc(x, 256)) instead of the MLP: its gradients do not depend on the "
            "parameters, so SGD's result does not depend on the order the updates come in.");
DEFINE_bool(same_batch, false, "Every step trains on the same rows (a loss that must fall).");
DEFINE_bool(every_loss, false, "Print every step's loss (else the first and the last).");
DEFINE_double(lr, 0, "SGD's learning rate (0: 0.5).");
DEFINE_string(fault_point, "", "The servers set KEEL_FAULT_POINT to this (fault injection).");

using namespace keel;

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    const bool ps = std::getenv("TRAINING_ROLE") != nullptr;
    if (ps) fleet::init(fleet::CloudRoleMaker(/*is_collective=*/false));
    const int n = ps ? fleet::worker_num() : 1;
    const int id = ps && fleet::is_worker() ? fleet::worker_index() : 0;
    KEEL_ENFORCE(FLAGS_rows % n == 0, "--rows must divide by the trainers, ", n);
    const int64_t local = FLAGS_rows / n;
    Program main, startup;
    startup.set_random_seed(7);
    std::string loss_name;
    {
      ProgramGuard g(main, startup);
      Var x = layers::data("x", {-1, 64});
      Var y = layers::data("y", {-1, 1}, DType::kInt64);
      Var h = layers::fc(x, 256, FLAGS_linear ? "" : "tanh");
      Var loss = FLAGS_linear
                     ? layers::mean(h)
                     : layers::mean(layers::softmax_with_cross_entropy(layers::fc(h, 10), y));
      loss_name = loss.name();
      auto lr = [](float base) {
        return FLAGS_piecewise ? LearningRate(lr_schedule::Piecewise({2}, {base, base / 10}))
                               : LearningRate(base);
      };
      std::unique_ptr<optimizer::Optimizer> opt;
      if (FLAGS_optimizer == "sgd") {
        opt = optimizer::SGD(lr(FLAGS_lr > 0 ? static_cast<float>(FLAGS_lr) : 0.5f)).Clone();
      } else if (FLAGS_optimizer == "momentum") {
        opt = optimizer::Momentum(lr(0.2f), 0.9f).Clone();
      } else {
        KEEL_ENFORCE(FLAGS_optimizer == "adam", "--optimizer must be sgd, momentum or adam");
        opt = optimizer::Adam(lr(0.01f)).Clone();
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
          strategy.a_sync_configs.max_staleness = FLAGS_max_staleness;
        }
        fleet::DistributedOptimizer(std::move(opt), strategy).minimize(loss, &startup);
      } else {
        opt->minimize(loss, &startup);
      }
    }
    Executor exe(CPUPlace());
    if (ps && fleet::is_server()) {
      if (!FLAGS_fault_point.empty()) setenv("KEEL_FAULT_POINT", FLAGS_fault_point.c_str(), 1);
      fleet::run_server(exe);
      std::printf("server %d done\n", fleet::server_index());
      // Its parameter blocks once every trainer stopped, for tests that check the servers'
      // final values (async: a trainer's last pull may predate another trainer's updates).
      if (!FLAGS_out.empty()) {
        Program blocks;
        for (VarDesc* v : fleet::main_program().global_block().AllVars())
          if (v->is_parameter()) *blocks.global_block().Var(v->name()) = *v;
        keel::save_persistables(
            exe.scope(), FLAGS_out + "/server" + std::to_string(fleet::server_index()), blocks);
      }
      return 0;
    }
    Program& train = ps ? fleet::main_program() : main;
    exe.Run(ps ? fleet::startup_program() : startup);
    std::mt19937_64 rng(99);
    std::uniform_real_distribution<float> u(-1, 1);
    const int steps = FLAGS_steps - (ps && id == FLAGS_short_trainer ? 1 : 0);
    for (int step = 0; step < steps; ++step) {
      if (FLAGS_same_batch) rng.seed(99);
      std::vector<float> gx(static_cast<size_t>(FLAGS_rows) * 64);
      std::vector<int64_t> gy(FLAGS_rows);
      for (auto& v : gx) v = u(rng);
      for (auto& v : gy) v = static_cast<int64_t>(rng() % 10);
      const int64_t first = id * local;
      std::vector<float> lx(gx.begin() + first * 64, gx.begin() + (first + local) * 64);
      std::vector<int64_t> ly(gy.begin() + first, gy.begin() + first + local);
      const std::vector<Tensor> loss = exe.Run(
          train,
          {{"x", Tensor::FromVector(lx, {local, 64})}, {"y", Tensor::FromVector(ly, {local, 1})}},
          {loss_name});
      if (FLAGS_every_loss || step == 0 || step == steps - 1)
        std::printf("trainer %d step %d loss %.6f\n", id, step, loss[0].data<float>()[0]);
      if (ps && id == FLAGS_die_trainer && step == 1) std::_Exit(3);
    }
    if (FLAGS_checkpoint) {
      if (ps) {
        fleet::save_persistables(exe, FLAGS_out);  // trainer 0 writes, before the servers stop
      } else {
        keel::save_persistables(exe.scope(), FLAGS_out, main);
      }
    }
    if (ps) fleet::stop_worker();
    // The parameters: every trainer holds the servers' values after its last step.
    if (!FLAGS_checkpoint && id == 0 && !FLAGS_out.empty()) {
      Program params;
      for (VarDesc* v : train.global_block().AllVars())
        if (v->is_parameter()) *params.global_block().Var(v->name()) = *v;
      keel::save_persistables(exe.scope(), FLAGS_out, params);
    }
    std::printf("trainer %d trained %d steps\n", id, steps);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
