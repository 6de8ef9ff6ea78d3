// The CTR-DNN of Paddle's parameter-server examples (PaddleRec's rank/dnn benchmark): 26 sparse
// slots of one id each sharing one embedding table, 13 dense features, three ReLU layers of 400,
// a 2-way softmax; and its data: a deterministic synthetic click rule, or Criteo's TSV files.
//
//   ids [B, 26, 1] int64 -> E [V, 10] (is_sparse: row-sparse gradient) -> [B, 26, 10] -> [B, 260]
//   concat(., dense [B, 13]) [B, 273] -> fc 400 relu -> fc 400 relu -> fc 400 relu -> fc 2
//   loss = mean(softmax_with_cross_entropy(z, label))
//   init: E ~ U(-1, 1); W_i ~ N(0, 1/sqrt(fan_in)); b_i = 0.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/layers.h"

namespace keel {
namespace models {

struct CtrConfig {
  int64_t vocab = 1000001;  // rows of the shared table (ids are taken mod vocab)
  int embed_dim = 10;
  int slots = 26;
  int dense = 13;
  std::vector<int> hidden = {400, 400, 400};
  bool is_sparse = true;  // the table's gradient holds only the batch's rows
  // The table lives on the parameter servers only (is_distributed; needs is_sparse): under
  // parameter-server training trainers fetch each batch's rows (docs/sparse-embeddings.md). Its
  // U(-1, 1) initializer becomes per-row (row_seeded_random), so in one process it draws other
  // rows than with is_distributed = false, the same in every process and under any servers.
  bool is_distributed = false;
};

struct CtrOutputs {
  Var logits, prob, loss, accuracy;  // prob = softmax(logits) [B, 2]; accuracy of its argmax
};
CtrOutputs ctr_dnn(Var ids, Var dense, Var label, const CtrConfig& c);

// The synthetic click data, drawn from a fixed rule so every process and run sees the same task:
// with the rule's engine (rule_seed): w_dense ~ N(0, 1)^13 and w_row ~ N(0, 1) for every table
// row; per sample, for slot s: k ~ Zipf(1.2) (a popularity rank, 1 the hottest),
// id = (((k - 1) mod V) * 26 + s) * 2654435761 mod V; dense ~ U[0, 1)^13;
// logit = (dense - 0.5) . w_dense + sum_s w_row[id_s] / sqrt(26); label = logit > t, t the
// median logit of 65,536 samples from the rule's engine (about half the labels are 1). Samples
// come from their own engine (stream_seed): ranks pass distinct ones.
class SyntheticCtrData {
 public:
  SyntheticCtrData(const CtrConfig& c, uint64_t rule_seed, uint64_t stream_seed);
  // Fills feeds "ids" [batch, slots, 1] int64, "dense" [batch, dense] float32, "label" [batch, 1].
  void Next(int64_t batch, FeedMap* feed);

 private:
  struct Sample;
  void Draw(std::mt19937_64* rng, Sample* s) const;
  CtrConfig c_;
  std::vector<float> w_dense_, w_row_;
  double threshold_ = 0;
  std::mt19937_64 stream_;
};

// A sample of Zipf(a), a > 1 (P(k) proportional to k^-a, k >= 1), by Devroye's rejection method
// (Non-Uniform Random Variate Generation, X.6.1).
int64_t DrawZipf(std::mt19937_64* rng, double a);

// Criteo's display-advertising TSV: label, 13 integer features, 26 categorical features (hex
// strings), tab-separated; empty fields allowed. Integers are clipped to PaddleRec's per-feature
// range [min_i, max_i] and scaled to [0, 1] (missing: 0); a categorical value maps to
// hash(slot, value) mod vocab (missing: the slot's own id for "empty"). Reads the file once into
// memory; batches cycle through it in file order, rank r of n taking lines with index = r mod n.
class CriteoData {
 public:
  CriteoData(const std::string& path, const CtrConfig& c, int rank, int nranks);
  int64_t size() const { return static_cast<int64_t>(labels_.size()); }
  void Next(int64_t batch, FeedMap* feed);

 private:
  CtrConfig c_;
  std::vector<int64_t> ids_, labels_;
  std::vector<float> dense_;
  int64_t next_ = 0;
};

// Area under the ROC curve from scores bucketed as Paddle's auc op does (4095 thresholds): the
// per-bucket counts of positives and negatives add across batches and ranks.
class AucCounter {
 public:
  static constexpr int kBuckets = 4096;
  AucCounter() : counts_(2 * kBuckets, 0.0) {}
  // score: P(label 1) in [0, 1].
  void Add(double score, bool positive);
  // [positives per bucket..., negatives per bucket...]: sum it over ranks, then Auc().
  std::vector<double>* counts() { return &counts_; }
  double Auc() const;

 private:
  std::vector<double> counts_;
};

}  // namespace models
}  // namespace keel
