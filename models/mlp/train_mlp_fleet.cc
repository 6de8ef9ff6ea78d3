// The seed's train_with_fleet program in C++ (docs/architecture.md, section 1): the single-card
// program plus the four fleet steps. Run it with
// `keel launch --nproc_per_node=2 build/bin/train_mlp_fleet`.
#include <keel/keel.h>

#include "fleet/fleet.h"
#include "models/mlp/mlp_model.h"

using namespace keel;

Var mlp(Var x, Var y, int hid = 1280, int classes = 2) {
  Var h1 = layers::fc(x, hid, "tanh");
  Var h2 = layers::fc(h1, hid, "tanh");
  Var pred = layers::fc(h2, classes, "softmax");
  return layers::mean(layers::cross_entropy(pred, y));
}

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);  // gflags + glog
  try {
    Program main_program, startup_program;
    ProgramGuard guard(main_program, startup_program);  // DSL calls append here
    Var x = layers::data("x", {-1, 32}, DType::kFloat32);
    Var y = layers::data("y", {-1, 1}, DType::kInt64);
    Var cost = mlp(x, y);

    fleet::init(fleet::CloudRoleMaker(/*is_collective=*/true));  // step 2: role from env
    fleet::DistributedStrategy strategy;                         // nccl_comm_num, ...
    auto opt = fleet::distributed_optimizer(optimizer::SGD(0.01), strategy);  // step 3
    opt.minimize(cost, &startup_program);  // backward + update ops + transpile

    Executor exe(fleet::worker_place());  // CUDAPlace(FLAGS_selected_gpus) or CPUPlace
    exe.Run(startup_program);
    models::SyntheticMlpData data(/*seed=*/1 + fleet::worker_index());  // each rank its own data
    Tensor batch_x, batch_y;
    for (int step = 0; step < 100; ++step) {
      data.Next(128, &batch_x, &batch_y);
      auto out = exe.Run(fleet::main_program(), {{"x", batch_x}, {"y", batch_y}}, {cost});
      if (fleet::is_first_worker())
        LOG(INFO) << "step " << step << " cost=" << out[0].item<float>();
    }
    fleet::save_persistables(exe, "./model");  // step 4: rank 0 writes, nobody waits
  } catch (const keel::Error& e) {
    LOG(ERROR) << e.what();
    return 1;
  }
  return 0;
}
