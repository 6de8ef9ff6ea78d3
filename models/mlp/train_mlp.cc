// The seed's single-card program, in C++ (docs/architecture.md, section 1, without the fleet
// lines): a 3-layer MLP trained with SGD on synthetic data for 100 steps, then saved.
#include <keel/keel.h>

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

    optimizer::SGD(0.01).minimize(cost, &startup_program);

    Executor exe(CPUPlace());
    exe.Run(startup_program);
    models::SyntheticMlpData data(/*seed=*/1);
    Tensor batch_x, batch_y;
    for (int step = 0; step < 100; ++step) {
      data.Next(128, &batch_x, &batch_y);
      auto out = exe.Run(main_program, {{"x", batch_x}, {"y", batch_y}}, {cost});
      LOG(INFO) << "step " << step << " cost=" << out[0].item<float>();
    }
    save_persistables(exe, "./model", main_program);
  } catch (const keel::Error& e) {
    LOG(ERROR) << e.what();
    return 1;
  }
  return 0;
}
