#include "tests/util/transpiler_fixtures.h"

#include <memory>

#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"

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

Var AmpMlpLoss() {
  Var x = layers::data("x", {-1, 6});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::layer_norm(layers::fc(x, 8, "relu"));
  return layers::mean(layers::softmax_with_cross_entropy(layers::fc(h, 3), y));
}

FeedMap AmpMlpBatch(int step) {
  Tensor x(DType::kFloat32, DDim({8, 6})), y(DType::kInt64, DDim({8, 1}));
  for (int i = 0; i < 48; ++i)
    x.data<float>()[i] = 0.1f * static_cast<float>((i * 7 + step * 3) % 13) - 0.6f;
  for (int i = 0; i < 8; ++i) y.data<int64_t>()[i] = (i * 5 + step) % 3;
  return {{"x", x}, {"y", y}};
}

Var MinimizedAmpMlp(Program& main, Program& startup, optimizer::Optimizer& opt) {
  ProgramGuard guard(main, startup);
  main.set_random_seed(5);
  startup.set_random_seed(5);
  Var loss = AmpMlpLoss();
  opt.minimize(loss);
  return loss;
}

std::vector<std::pair<std::string, std::function<std::unique_ptr<optimizer::Optimizer>()>>>
TrainingOptimizers() {
  return {
      {"sgd", [] { return std::make_unique<optimizer::SGD>(0.1f); }},
      {"momentum", [] { return std::make_unique<optimizer::Momentum>(0.05f, 0.9f); }},
      {"nesterov", [] { return std::make_unique<optimizer::Momentum>(0.05f, 0.9f, true); }},
      {"adam", [] { return std::make_unique<optimizer::Adam>(1e-2f); }},
      {"adamw", [] { return std::make_unique<optimizer::AdamW>(1e-2f); }},
  };
}

std::map<std::string, std::vector<char>> PersistableBytes(const Program& program, Executor& exe) {
  std::map<std::string, std::vector<char>> out;
  for (const VarDesc* v : program.global_block().AllVars()) {
    if (!v->persistable()) continue;
    const Tensor& t = exe.scope().FindVar(v->name())->tensor();
    const char* d = static_cast<const char*>(t.raw_data());
    out[v->name()] = std::vector<char>(d, d + t.nbytes());
  }
  return out;
}

}  // namespace keel::testing
