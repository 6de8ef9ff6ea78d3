#include "tests/util/transpiler_fixtures.h"

#include <memory>

#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"

namespace keel::testing {

void BuildTrainedMlp(Program& main, Program& startup) {
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 4});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 3, "tanh");
  Var cost = layers::mean(layers::cross_entropy(layers::fc(h, 2, "softmax"), y));
  optimizer::SGD(0.1f).minimize(cost, &startup);
}

fleet::Role TwoOfFour() {
  fleet::Role r;
  r.rank = 1;
  r.world_size = 4;
  r.local_world_size = 4;
  r.local_rank = 1;
  return r;
}

void InsertFusedGradients(Block& b, const std::vector<std::string>& grads,
                          const std::vector<int64_t>& numels) {
  b.Var("@FUSED_GRAD@0")->set_dtype(DType::kFloat32);
  auto c = std::make_unique<OpDesc>("coalesce_tensor");
  c->SetInput("Input", grads);
  c->SetOutput("Output", grads);
  c->SetOutput("FusedOutput", {"@FUSED_GRAD@0"});
  c->SetAttr("numels", numels);
  c->SetAttr("dtype", static_cast<int>(DType::kFloat32));
  c->SetAttr("copy_data", false);
  c->SetAttr("set_constant", false);
  c->SetAttr("constant", 0.0f);
  c->SetAttr("pad_to_multiple", 1);
  b.InsertOp(0, std::move(c));
}

}  // namespace keel::testing
