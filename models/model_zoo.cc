#include "models/model_zoo.h"

#include <random>

#include "framework/dsl/optimizer.h"
#include "models/mlp/mlp_model.h"

namespace keel {
namespace models {

namespace {

TrainableModel BuildMlp(const ModelConfig& cfg) {
  TrainableModel m;
  m.main = std::make_unique<Program>();
  m.startup = std::make_unique<Program>();
  m.main->set_random_seed(static_cast<int64_t>(cfg.seed));
  m.startup->set_random_seed(static_cast<int64_t>(cfg.seed));
  ProgramGuard guard(*m.main, *m.startup);
  Var x = layers::data("x", {-1, 32}, DType::kFloat32);
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var cost = mlp(x, y, cfg.hidden);
  if (cfg.minimize) cfg.minimize(cost, m.startup.get());
  else optimizer::SGD(cfg.lr).minimize(cost, m.startup.get());
  m.loss = cost.name();
  m.inputs = {x.name()};
  for (auto& op : m.main->global_block().ops())
    if (op->type() == "softmax") m.prediction = op->Output("Out")[0];
  uint64_t data_seed = cfg.data_seed ? cfg.data_seed : cfg.seed;
  if (data_seed == 0) data_seed = std::random_device{}();
  auto data = std::make_shared<SyntheticMlpData>(data_seed);
  m.next_batch = [data](int64_t batch, FeedMap* feed) {
    data->Next(batch, &(*feed)["x"], &(*feed)["y"]);
  };
  return m;
}

}  // namespace

std::vector<std::string> ModelNames() { return {"mlp"}; }

TrainableModel BuildModel(const ModelConfig& cfg) {
  if (cfg.name == "mlp") return BuildMlp(cfg);
  std::string known;
  for (auto& n : ModelNames()) known += (known.empty() ? "" : ", ") + n;
  KEEL_THROW("unknown model '", cfg.name, "' (known: ", known, ")");
}

}  // namespace models
}  // namespace keel
