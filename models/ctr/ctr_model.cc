#include "models/ctr/ctr_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "framework/dsl/initializer.h"
#include "framework/dsl/tensor_layers.h"
#include "framework/error.h"

namespace keel {
namespace models {

CtrOutputs ctr_dnn(Var ids, Var dense, Var label, const CtrConfig& c) {
  Var emb = layers::embedding(ids, {c.vocab, c.embed_dim}, -1,
                              ParamAttr("SparseFeatFactors", initializer::Uniform(-1.0f, 1.0f)),
                              DType::kFloat32, c.is_sparse, c.is_distributed);  // [B, slots, D]
  Var x = layers::concat({layers::flatten(emb, 1), dense}, 1);  // [B, slots * D + dense]
  int fan_in = c.slots * c.embed_dim + c.dense;
  int k = 0;
  for (int width : c.hidden) {
    const std::string name = "ctr_fc_" + std::to_string(k++);
    x = layers::fc(x, width, "relu", 1,
                   ParamAttr(name + ".w_0", initializer::Normal(0.0f, 1.0f / std::sqrt(fan_in))),
                   ParamAttr(name + ".b_0", initializer::Constant(0.0f)));
    fan_in = width;
  }
  CtrOutputs out;
  out.logits = layers::fc(
      x, 2, "", 1, ParamAttr("ctr_fc_out.w_0", initializer::Normal(0.0f, 1.0f / std::sqrt(fan_in))),
      ParamAttr("ctr_fc_out.b_0", initializer::Constant(0.0f)));
  out.loss = layers::mean(layers::softmax_with_cross_entropy(out.logits, label));
  out.prob = layers::softmax(out.logits);
  out.accuracy = layers::accuracy(out.prob, label, 1);
  return out;
}

int64_t DrawZipf(std::mt19937_64* rng, double a) {
  KEEL_ENFORCE(a > 1, "Zipf: the exponent must be > 1, got ", a);
  const double am1 = a - 1, b = std::pow(2.0, am1);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (;;) {
    const double u = 1.0 - uniform(*rng), v = uniform(*rng);
    const double x = std::floor(std::pow(u, -1.0 / am1));
    if (!(x >= 1 && x < 9.0e18)) continue;  // beyond int64: draw again
    const double t = std::pow(1.0 + 1.0 / x, am1);
    if (v * x * (t - 1) / (b - 1) <= t / b) return static_cast<int64_t>(x);
  }
}

struct SyntheticCtrData::Sample {
  std::vector<int64_t> ids;
  std::vector<float> dense;
  double logit = 0;
};

SyntheticCtrData::SyntheticCtrData(const CtrConfig& c, uint64_t rule_seed, uint64_t stream_seed)
    : c_(c), stream_(stream_seed) {
  KEEL_ENFORCE(c.vocab >= 1 && c.slots >= 1 && c.dense >= 0, "ctr data: vocab ", c.vocab,
               ", slots ", c.slots, " and dense ", c.dense, " must be positive");
  std::mt19937_64 rule(rule_seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  w_dense_.resize(c.dense);
  for (float& w : w_dense_) w = normal(rule);
  w_row_.resize(c.vocab);
  for (float& w : w_row_) w = normal(rule);
  std::vector<double> logits(65536);
  Sample s;
  for (double& l : logits) {
    Draw(&rule, &s);
    l = s.logit;
  }
  std::nth_element(logits.begin(), logits.begin() + logits.size() / 2, logits.end());
  threshold_ = logits[logits.size() / 2];
}

void SyntheticCtrData::Draw(std::mt19937_64* rng, Sample* s) const {
  const int64_t V = c_.vocab;
  s->ids.resize(c_.slots);
  s->dense.resize(c_.dense);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  double logit = 0;
  for (int d = 0; d < c_.dense; ++d) {
    s->dense[d] = uniform(*rng);
    logit += (s->dense[d] - 0.5) * w_dense_[d];
  }
  const double norm = 1.0 / std::sqrt(static_cast<double>(c_.slots));
  for (int slot = 0; slot < c_.slots; ++slot) {
    const int64_t k = DrawZipf(rng, 1.2);
    // ((k - 1) mod V) * slots + slot < V * slots; times 2654435761 stays below 2^63 for
    // V * slots < 3.4e9 (the default's 2.6e7).
    const uint64_t id =
        ((static_cast<uint64_t>((k - 1) % V) * c_.slots + slot) * 2654435761ULL) % V;
    s->ids[slot] = static_cast<int64_t>(id);
    logit += w_row_[id] * norm;
  }
  s->logit = logit;
}

void SyntheticCtrData::Next(int64_t batch, FeedMap* feed) {
  auto* ids = static_cast<int64_t*>((*feed)["ids"].Alloc(DType::kInt64, {batch, c_.slots, 1}));
  auto* dense = static_cast<float*>((*feed)["dense"].Alloc(DType::kFloat32, {batch, c_.dense}));
  auto* label = static_cast<int64_t*>((*feed)["label"].Alloc(DType::kInt64, {batch, 1}));
  Sample s;
  for (int64_t n = 0; n < batch; ++n) {
    Draw(&stream_, &s);
    std::copy(s.ids.begin(), s.ids.end(), ids + n * c_.slots);
    std::copy(s.dense.begin(), s.dense.end(), dense + n * c_.dense);
    label[n] = s.logit > threshold_ ? 1 : 0;
  }
}

namespace {

// PaddleRec's Criteo reader ranges for the 13 integer features.
constexpr float kCriteoMin[13] = {0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
constexpr float kCriteoMax[13] = {20, 600, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50};

// FNV-1a over the slot number and the value: a fixed hash, the same on every machine.
uint64_t SlotHash(int slot, const std::string& value) {
  uint64_t h = 1469598103934665603ULL;
  auto add = [&](unsigned char byte) {
    h ^= byte;
    h *= 1099511628211ULL;
  };
  add(static_cast<unsigned char>(slot));
  add(0xff);
  for (char ch : value) add(static_cast<unsigned char>(ch));
  return h;
}

}  // namespace

CriteoData::CriteoData(const std::string& path, const CtrConfig& c, int rank, int nranks) : c_(c) {
  KEEL_ENFORCE(c.slots == 26 && c.dense == 13,
               "Criteo data has 26 categorical and 13 integer "
               "features; the model has ",
               c.slots, " and ", c.dense);
  std::ifstream in(path);
  KEEL_ENFORCE(in.good(), "--data=criteo:", path, ": cannot open the file");
  std::string line;
  int64_t lineno = 0;
  std::vector<std::string> fields;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    if ((lineno - 1) % nranks != rank) continue;
    fields.clear();
    size_t start = 0;
    for (;;) {
      const size_t tab = line.find('\t', start);
      fields.push_back(
          line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    KEEL_ENFORCE(fields.size() == 40, path, ":", lineno,
                 ": a Criteo line has 40 tab-separated "
                 "fields (label, 13 integers, 26 categories), got ",
                 fields.size());
    KEEL_ENFORCE(fields[0] == "0" || fields[0] == "1", path, ":", lineno,
                 ": the label must be 0 or 1, got '", fields[0], "'");
    labels_.push_back(fields[0] == "1");
    for (int d = 0; d < 13; ++d) {
      const std::string& f = fields[1 + d];
      float v = 0;
      if (!f.empty()) {
        char* end = nullptr;
        const double x = std::strtod(f.c_str(), &end);
        KEEL_ENFORCE(end != f.c_str() && *end == '\0' && std::isfinite(x), path, ":", lineno,
                     ": integer feature I", d + 1, " is '", f, "', not a number");
        const double clipped = std::min<double>(std::max<double>(x, kCriteoMin[d]), kCriteoMax[d]);
        v = static_cast<float>((clipped - kCriteoMin[d]) / (kCriteoMax[d] - kCriteoMin[d]));
      }
      dense_.push_back(v);
    }
    for (int s = 0; s < 26; ++s)
      ids_.push_back(static_cast<int64_t>(SlotHash(s, fields[14 + s]) % c.vocab));
  }
  KEEL_ENFORCE(!labels_.empty(), "--data=criteo:", path, ": no samples",
               nranks > 1 ? " for this rank" : "", " (", lineno, " lines read)");
}

void CriteoData::Next(int64_t batch, FeedMap* feed) {
  auto* ids = static_cast<int64_t*>((*feed)["ids"].Alloc(DType::kInt64, {batch, 26, 1}));
  auto* dense = static_cast<float*>((*feed)["dense"].Alloc(DType::kFloat32, {batch, 13}));
  auto* label = static_cast<int64_t*>((*feed)["label"].Alloc(DType::kInt64, {batch, 1}));
  for (int64_t n = 0; n < batch; ++n) {
    const int64_t i = next_;
    next_ = (next_ + 1) % size();
    std::copy_n(ids_.begin() + i * 26, 26, ids + n * 26);
    std::copy_n(dense_.begin() + i * 13, 13, dense + n * 13);
    label[n] = labels_[i];
  }
}

void AucCounter::Add(double score, bool positive) {
  const int b = static_cast<int>(std::clamp(score, 0.0, 1.0) * (kBuckets - 1));
  counts_[(positive ? 0 : kBuckets) + b] += 1;
}

// Walks the thresholds from the highest score down, adding the trapezoids of the ROC curve.
double AucCounter::Auc() const {
  double tp = 0, fp = 0, area = 0;
  for (int b = kBuckets - 1; b >= 0; --b) {
    const double pos = counts_[b], neg = counts_[kBuckets + b];
    area += neg * (tp + pos / 2);
    tp += pos;
    fp += neg;
  }
  return tp > 0 && fp > 0 ? area / (tp * fp) : 0.5;
}

}  // namespace models
}  // namespace keel
