#include "models/model_zoo.h"

#include <cmath>
#include <random>

#include "framework/base/strings.h"
#include "framework/data/data_loader.h"
#include "framework/data/mnist_dataset.h"
#include "framework/dsl/amp.h"
#include "models/lenet/lenet_model.h"
#include "models/mlp/mlp_model.h"
#include "models/resnet/resnet_model.h"
#include "models/transformer/transformer_model.h"

namespace keel {
namespace models {

namespace {

uint64_t DataSeed(const ModelConfig& cfg) {
  uint64_t s = cfg.data_seed ? cfg.data_seed : cfg.seed;
  return s ? s : std::random_device{}();
}

// Appends the optimizer (the config's choice or the model's default) and the test program.
void Finish(TrainableModel& m, const ModelConfig& cfg, Var loss, const std::string& default_opt,
            float default_lr) {
  std::string name = cfg.optimizer.empty() ? default_opt : cfg.optimizer;
  float lr = cfg.lr > 0 ? cfg.lr : default_lr;
  auto opt =
      cfg.make_optimizer ? cfg.make_optimizer(default_opt, default_lr) : MakeOptimizer(name, lr);
  m.test = m.main->clone_for_test();  // before backward: the forward program
  if (cfg.minimize)
    cfg.minimize(loss, m.startup.get(), *opt);
  else
    opt->minimize(loss, m.startup.get());
  // AMP O2 made parameters low precision after the test program was cloned.
  amp::UseLowPrecisionParamsIn(*m.main, *m.test);
  m.loss = loss.name();
  m.optimizer = cfg.make_optimizer ? opt->type() : name + " lr=" + std::to_string(lr);
  // The rate every update op reads (the optimizer's var; fleet may have used a clone), in a
  // sub-block under gradient merge.
  for (int b = 0; b < m.main->num_blocks() && m.learning_rate.empty(); ++b)
    for (auto& op : m.main->block(b).ops())
      if (op->HasInput("LearningRate") && !op->Input("LearningRate").empty()) {
        m.learning_rate = op->Input("LearningRate")[0];
        break;
      }
}

TrainableModel NewModel(const ModelConfig& cfg) {
  TrainableModel m;
  m.main = std::make_unique<Program>();
  m.startup = std::make_unique<Program>();
  m.main->set_random_seed(static_cast<int64_t>(cfg.seed));
  m.startup->set_random_seed(static_cast<int64_t>(cfg.seed));
  return m;
}

uint64_t ShuffleSeed(const ModelConfig& cfg) {
  uint64_t s = cfg.shuffle_seed ? cfg.shuffle_seed : cfg.seed;
  return s ? s : std::random_device{}();
}

// Accuracy over the batches drawn by `next`, weighting each batch by its size; with
// cfg.all_reduce_sum the counts are summed over the ranks, each having drawn its own shard.
Evaluation EvaluateBatches(const ModelConfig& cfg, Executor& exe, const Program& test,
                           const std::string& acc, const std::function<bool(FeedMap*)>& next) {
  std::vector<double> counts = {0, 0};  // correct, total
  FeedMap feed;
  while (next(&feed)) {
    auto out = cfg.run_test ? cfg.run_test(exe, test, feed, {acc}) : exe.Run(test, feed, {acc});
    if (out.empty()) continue;  // a pipeline stage before the last
    double n = static_cast<double>(feed.begin()->second.dims()[0]);
    counts[0] += std::round(out[0].item<double>() * n);  // the batch's correct rows
    counts[1] += n;
  }
  if (cfg.all_reduce_sum) cfg.all_reduce_sum(&counts);
  Evaluation e;
  e.accuracy = counts[1] > 0 ? counts[0] / counts[1] : 0;
  e.samples = static_cast<int64_t>(counts[1]);
  return e;
}

// The synthetic models' evaluation: `batches` batches, drawn alike on every rank (one seed), of
// which rank r runs those with index = r mod nranks.
Evaluation EvaluateSharded(const ModelConfig& cfg, Executor& exe, const Program& test,
                           const std::string& acc, int batches,
                           const std::function<void(FeedMap*)>& draw) {
  const int nranks = cfg.all_reduce_sum ? cfg.nranks : 1, rank = cfg.all_reduce_sum ? cfg.rank : 0;
  int b = 0;
  return EvaluateBatches(cfg, exe, test, acc, [&](FeedMap* f) {
    for (; b < batches; ++b) {
      draw(f);
      if (b % nranks == rank) {
        ++b;
        return true;
      }
    }
    return false;
  });
}

TrainableModel BuildMlp(const ModelConfig& cfg) {
  TrainableModel m = NewModel(cfg);
  ProgramGuard guard(*m.main, *m.startup);
  Var x = layers::data("x", {-1, 32}, DType::kFloat32);
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var cost = mlp(x, y, cfg.hidden, 2, cfg.pp_degree);
  m.inputs = {x.name()};
  for (auto& op : m.main->global_block().ops())
    if (op->type() == "softmax") m.prediction = op->Output("Out")[0];
  Finish(m, cfg, cost, "sgd", 0.01f);
  auto data = std::make_shared<SyntheticMlpData>(DataSeed(cfg));
  m.next_batch = [data](int64_t batch, FeedMap* feed) {
    data->Next(batch, &(*feed)["x"], &(*feed)["y"]);
  };
  return m;
}

TrainableModel BuildLenet(const ModelConfig& cfg) {
  TrainableModel m = NewModel(cfg);
  {
    ProgramGuard guard(*m.main, *m.startup);
    Var image = layers::data("image", {-1, 1, 28, 28});
    Var label = layers::data("label", {-1, 1}, DType::kInt64);
    ClassifierOutputs out = lenet(image, label, 10, cfg.pp_degree);
    m.inputs = {image.name()};
    m.prediction = out.logits.name();
    m.accuracy = out.accuracy.name();
    Finish(m, cfg, out.loss, "adam", 0.001f);
  }
  if (cfg.programs_only) return m;
  const std::string prefix = "mnist:";
  KEEL_ENFORCE(cfg.data.compare(0, prefix.size(), prefix) == 0,
               "model lenet trains on MNIST: pass --data=mnist:DIR (DIR holds "
               "t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz]), got --data='",
               cfg.data, "'");
  std::string dir = cfg.data.substr(prefix.size());
  auto find = [&](const std::string& base) {
    for (const std::string& f : {dir + "/" + base + ".gz", dir + "/" + base})
      if (FILE* fp = std::fopen(f.c_str(), "rb")) {
        std::fclose(fp);
        return f;
      }
    KEEL_THROW("MNIST: neither ", dir, "/", base, ".gz nor ", dir, "/", base, " exists");
  };
  std::string images = find("t10k-images-idx3-ubyte"), labels = find("t10k-labels-idx1-ubyte");
  // The 10,000-image test set: the first 8,000 train, the last 2,000 test.
  auto train_set = std::make_shared<MnistDataset>(images, labels, 0, 8000, /*normalize=*/true);
  auto test_set = std::make_shared<MnistDataset>(images, labels, 8000, 10000, /*normalize=*/true);

  LoaderOptions train_opts;
  train_opts.batch_size = cfg.batch_size;
  train_opts.shuffle = true;
  train_opts.seed = ShuffleSeed(cfg);  // one permutation, disjoint shards of it
  train_opts.num_workers = 1;
  train_opts.rank = cfg.rank;
  train_opts.nranks = cfg.nranks;
  // A pipeline splits each mini-batch into equal micro-batches: it trains on whole batches only
  // (a short last batch of an epoch may not split; Megatron and Paddle drop it too).
  train_opts.drop_last = cfg.pp_degree > 1;
  auto loader = std::make_shared<DataLoader>(train_set, train_opts);
  m.batches_per_epoch = loader->batches_per_epoch();
  auto epoch = std::make_shared<int64_t>(0);
  loader->StartEpoch(0);
  const int64_t want = cfg.batch_size;
  auto observe = cfg.on_train_batch;
  m.next_batch = [loader, epoch, want, observe](int64_t batch, FeedMap* feed) {
    KEEL_ENFORCE(batch == want, "lenet's loader batches ", want, " samples, asked for ", batch);
    std::vector<int64_t> indices;
    while (!loader->Next(feed, &indices)) loader->StartEpoch(++*epoch);
    if (observe) observe(*epoch, indices);
  };
  LoaderOptions test_opts;
  test_opts.batch_size = 500;
  if (cfg.all_reduce_sum) {  // each rank its shard, every test image exactly once
    test_opts.rank = cfg.rank;
    test_opts.nranks = cfg.nranks;
    test_opts.even_shards = false;
  }
  auto test_loader = std::make_shared<DataLoader>(test_set, test_opts);
  const Program* test = m.test.get();
  const std::string acc = m.accuracy;
  m.evaluate = [cfg, test_loader, test, acc](Executor& exe) {
    test_loader->StartEpoch(0);
    return EvaluateBatches(cfg, exe, *test, acc, [&](FeedMap* f) { return test_loader->Next(f); });
  };
  return m;
}

TrainableModel BuildResnet(const ModelConfig& cfg) {
  TrainableModel m = NewModel(cfg);
  {
    ProgramGuard guard(*m.main, *m.startup);
    Var image = layers::data("image", {-1, 3, 32, 32});
    Var label = layers::data("label", {-1, 1}, DType::kInt64);
    ClassifierOutputs out = resnet_cifar(image, label, 20, 10, cfg.pp_degree, cfg.data_format);
    m.inputs = {image.name()};
    m.prediction = out.logits.name();
    m.accuracy = out.accuracy.name();
    Finish(m, cfg, out.loss, "momentum", 0.05f);
  }
  // Synthetic images whose class is their brightest colour channel plus a coarse pattern, so the
  // network has something to learn and its loss falls.
  auto draw = [](std::mt19937_64* rng, int64_t batch, FeedMap* feed) {
    float* x = static_cast<float*>((*feed)["image"].Alloc(DType::kFloat32, {batch, 3, 32, 32}));
    int64_t* y = static_cast<int64_t*>((*feed)["label"].Alloc(DType::kInt64, {batch, 1}));
    std::normal_distribution<float> noise(0.0f, 0.5f);
    for (int64_t n = 0; n < batch; ++n) {
      int cls = static_cast<int>((*rng)() % 10);
      y[n] = cls;
      for (int c = 0; c < 3; ++c)
        for (int i = 0; i < 32 * 32; ++i) {
          int row = i / 32, col = i % 32;
          bool on = ((row / (4 + cls % 5)) + (col / 8)) % 2 == 0;
          float signal = (c == cls % 3 ? 1.0f : 0.0f) + (on == (cls >= 5) ? 0.5f : 0.0f);
          x[((n * 3) + c) * 1024 + i] = signal + noise(*rng);
        }
    }
  };
  auto rng = std::make_shared<std::mt19937_64>(DataSeed(cfg));
  m.next_batch = [draw, rng](int64_t batch, FeedMap* feed) { draw(rng.get(), batch, feed); };
  // The test stream is the same on every rank (each evaluates its share of it).
  auto test_rng = std::make_shared<std::mt19937_64>(ShuffleSeed(cfg) ^ 0x7e57);
  const Program* test = m.test.get();
  const std::string acc = m.accuracy;
  m.evaluate = [cfg, draw, test_rng, test, acc](Executor& exe) {
    return EvaluateSharded(cfg, exe, *test, acc, 8,
                           [&](FeedMap* f) { draw(test_rng.get(), 64, f); });
  };
  return m;
}

TrainableModel BuildTransformer(const ModelConfig& cfg) {
  TrainableModel m = NewModel(cfg);
  const TransformerConfig tc = cfg.transformer;
  {
    ProgramGuard guard(*m.main, *m.startup);
    Var ids = layers::data("ids", {-1, tc.seq_len, 1}, DType::kInt64);
    Var labels = layers::data("labels", {-1, tc.seq_len, 1}, DType::kInt64);
    ClassifierOutputs out = transformer_encoder(ids, labels, tc, cfg.pp_degree);
    m.inputs = {ids.name()};
    m.prediction = out.logits.name();
    m.accuracy = out.accuracy.name();
    Finish(m, cfg, out.loss, "adam", 0.003f);
  }
  auto data = std::make_shared<ReversalTaskData>(tc, DataSeed(cfg));
  m.next_batch = [data](int64_t batch, FeedMap* feed) {
    data->Next(batch, &(*feed)["ids"], &(*feed)["labels"]);
  };
  auto test_data = std::make_shared<ReversalTaskData>(tc, ShuffleSeed(cfg) ^ 0x5eed);
  const Program* test = m.test.get();
  const std::string acc = m.accuracy;
  m.evaluate = [cfg, test_data, test, acc](Executor& exe) {
    return EvaluateSharded(cfg, exe, *test, acc, 4, [&](FeedMap* f) {
      test_data->Next(256, &(*f)["ids"], &(*f)["labels"]);
    });
  };
  return m;
}

// The synthetic rule's seed: the same task in every process and run (the streams differ).
constexpr uint64_t kCtrRuleSeed = 2024;

TrainableModel BuildCtr(const ModelConfig& cfg) {
  TrainableModel m = NewModel(cfg);
  CtrOutputs out;
  {
    ProgramGuard guard(*m.main, *m.startup);
    Var ids = layers::data("ids", {-1, cfg.ctr.slots, 1}, DType::kInt64);
    Var dense = layers::data("dense", {-1, cfg.ctr.dense}, DType::kFloat32);
    Var label = layers::data("label", {-1, 1}, DType::kInt64);
    out = ctr_dnn(ids, dense, label, cfg.ctr);
    m.inputs = {ids.name(), dense.name()};
    m.prediction = out.prob.name();
    m.accuracy = out.accuracy.name();
    // Adam updates only the batch's rows of the table (lazy_mode), as the servers of Paddle's
    // parameter-server mode do; other optimizers as they are.
    ModelConfig lazy = cfg;
    auto used = std::make_shared<std::string>();
    lazy.make_optimizer = [cfg, used](const std::string& default_name, float default_lr) {
      std::unique_ptr<optimizer::Optimizer> o =
          cfg.make_optimizer ? cfg.make_optimizer(default_name, default_lr)
                             : MakeOptimizer(cfg.optimizer.empty() ? default_name : cfg.optimizer,
                                             cfg.lr > 0 ? cfg.lr : default_lr);
      *used = o->type();
      if (auto* adam = dynamic_cast<optimizer::Adam*>(o.get())) {
        adam->set_lazy_mode(true);
        *used += " (lazy_mode)";
      }
      return o;
    };
    Finish(m, lazy, out.loss, "adam", 0.001f);
    m.optimizer = *used;
    if (!cfg.make_optimizer) m.optimizer += " lr=" + std::to_string(cfg.lr > 0 ? cfg.lr : 0.001f);
  }
  if (cfg.programs_only) return m;
  const std::string prefix = "criteo:";
  if (!cfg.data.empty()) {
    KEEL_ENFORCE(cfg.data.compare(0, prefix.size(), prefix) == 0,
                 "model ctr reads Criteo's TSV (--data=criteo:FILE) or, without --data, its "
                 "synthetic click data; got --data='",
                 cfg.data, "'");
    auto data =
        std::make_shared<CriteoData>(cfg.data.substr(prefix.size()), cfg.ctr, cfg.rank, cfg.nranks);
    m.next_batch = [data](int64_t batch, FeedMap* feed) { data->Next(batch, feed); };
    m.batches_per_epoch = std::max<int64_t>(1, data->size() / cfg.batch_size);
  } else {
    auto data = std::make_shared<SyntheticCtrData>(cfg.ctr, kCtrRuleSeed, DataSeed(cfg));
    m.next_batch = [data](int64_t batch, FeedMap* feed) { data->Next(batch, feed); };
  }
  // Held-out samples of the same rule (synthetic; for Criteo too: the rule is the only held-out
  // data it has), the same on every rank, each rank its share; counts summed over the ranks.
  auto test_data =
      std::make_shared<SyntheticCtrData>(cfg.ctr, kCtrRuleSeed, ShuffleSeed(cfg) ^ 0xc7c7);
  const Program* test = m.test.get();
  const std::string acc = m.accuracy, prob = m.prediction;
  m.evaluate = [cfg, test_data, test, acc, prob](Executor& exe) {
    const int nranks = cfg.all_reduce_sum ? cfg.nranks : 1;
    const int rank = cfg.all_reduce_sum ? cfg.rank : 0;
    AucCounter auc;
    std::vector<double>& counts = *auc.counts();
    counts.push_back(0);  // correct
    counts.push_back(0);  // samples
    FeedMap feed;
    for (int b = 0; b < 8; ++b) {
      test_data->Next(512, &feed);
      if (b % nranks != rank) continue;
      auto r = exe.Run(*test, feed, {prob, acc});
      const float* p = r[0].data<float>();
      const int64_t* y = feed["label"].data<int64_t>();
      for (int64_t n = 0; n < r[0].dims()[0]; ++n) auc.Add(p[2 * n + 1], y[n] == 1);
      counts[counts.size() - 2] += std::round(r[1].item<double>() * r[0].dims()[0]);
      counts.back() += static_cast<double>(r[0].dims()[0]);
    }
    if (cfg.all_reduce_sum) cfg.all_reduce_sum(&counts);
    Evaluation e;
    e.samples = static_cast<int64_t>(counts.back());
    e.accuracy = e.samples > 0 ? counts[counts.size() - 2] / e.samples : 0;
    counts.resize(2 * AucCounter::kBuckets);
    e.auc = auc.Auc();
    return e;
  };
  return m;
}

}  // namespace

std::unique_ptr<optimizer::Optimizer> MakeOptimizer(const std::string& name, float lr) {
  if (name == "sgd") return std::make_unique<optimizer::SGD>(lr);
  if (name == "momentum") return std::make_unique<optimizer::Momentum>(lr, 0.9f);
  if (name == "adam") return std::make_unique<optimizer::Adam>(lr);
  if (name == "adamw") return std::make_unique<optimizer::AdamW>(lr);
  KEEL_THROW("unknown optimizer '", name, "' (known: sgd, momentum, adam, adamw)");
}

std::vector<std::string> ModelNames() { return {"mlp", "lenet", "resnet", "transformer", "ctr"}; }

TrainableModel BuildModel(const ModelConfig& cfg) {
  // Only lenet reads a dataset; the others draw synthetic data and would ignore one.
  const bool synthetic = cfg.name == "mlp" || cfg.name == "resnet" || cfg.name == "transformer";
  KEEL_ENFORCE(cfg.data.empty() || !synthetic, "model ", cfg.name,
               " trains on synthetic data and takes no dataset, got --data='", cfg.data,
               "' (lenet and ctr read one: --data=mnist:DIR, --data=criteo:FILE)");
  if (cfg.name == "mlp") return BuildMlp(cfg);
  if (cfg.name == "lenet") return BuildLenet(cfg);
  if (cfg.name == "resnet") return BuildResnet(cfg);
  if (cfg.name == "transformer") return BuildTransformer(cfg);
  if (cfg.name == "ctr") return BuildCtr(cfg);
  KEEL_THROW("unknown model '", cfg.name, "' (known: ", StrJoin(ModelNames(), ", "), ")");
}

}  // namespace models
}  // namespace keel
