#include "models/transformer/transformer_model.h"

#include <cmath>
#include <memory>

#include "framework/dsl/nn_layers.h"
#include "framework/dsl/pipeline.h"
#include "framework/dsl/tensor_layers.h"
#include "framework/dsl/tensor_parallel.h"

namespace keel {
namespace models {

namespace {

constexpr layers::Parallel kCol = layers::Parallel::kColumn;
constexpr layers::Parallel kRow = layers::Parallel::kRow;

// Dimension legend: N = batch, L = sequence, D = d_model, H = heads, E = D / H, T = the
// tensor-parallel degree (1 outside a TensorParallelGuard: then every layer is the plain one).
// Megatron's split: Q, K and V column-parallel (each rank computes H / T whole heads), the output
// projection row-parallel (one all-reduce after it).
Var SelfAttention(Var x, const TransformerConfig& c) {
  const int E = c.d_model / c.heads;
  // The reshapes leave the head count to -1, so that the program holds no per-shard size: with
  // the whole parameters it is the single-device model (a tensor-parallel job's inference model,
  // fleet/model_parallel_checkpoint.h).
  auto heads = [&](Var t) {  // [N, L, D / T] -> [N, H / T, L, E]
    return layers::transpose(layers::reshape(t, {0, 0, -1, E}), {0, 2, 1, 3});
  };
  Var q = heads(layers::fc(x, c.d_model, "", 2, {}, {}, true, kCol));
  Var k = heads(layers::fc(x, c.d_model, "", 2, {}, {}, true, kCol));
  Var v = heads(layers::fc(x, c.d_model, "", 2, {}, {}, true, kCol));
  // scores = q k' / sqrt(E): [N, H / T, L, L]
  Var scores = layers::matmul(q, k, false, true, 1.0f / std::sqrt(static_cast<float>(E)));
  Var ctx = layers::matmul(layers::softmax(scores), v);                     // [N, H / T, L, E]
  ctx = layers::reshape(layers::transpose(ctx, {0, 2, 1, 3}), {0, 0, -1});  // [N, L, H / T * E]
  return layers::fc(ctx, c.d_model, "", 2, {}, {}, true, kRow);
}

Var MaybeDropout(Var x, const TransformerConfig& c) {
  return c.dropout > 0 ? layers::dropout(x, c.dropout) : x;
}

}  // namespace

ClassifierOutputs transformer_encoder(Var ids, Var labels, const TransformerConfig& c,
                                      int pp_degree) {
  ValidateTransformerConfig(c, current_tensor_parallel().degree);
  KEEL_ENFORCE(pp_degree >= 1 && pp_degree <= c.layers, "transformer: pipeline degree ", pp_degree,
               " must be 1..layers=", c.layers, " (each stage holds whole layers)");
  // Pipeline stages: the embeddings with layer 0 on stage 0, layer i on stage i * S / layers, the
  // output layer and the loss with the last layer. No marks without a pipeline.
  std::unique_ptr<PipelineStageGuard> stage;
  auto on_stage = [&](int s) {
    if (pp_degree == 1) return;
    stage.reset();  // the previous guard first: guards restore what they found
    stage = std::make_unique<PipelineStageGuard>(s);
  };
  on_stage(0);
  Var x = layers::vocab_parallel_embedding(ids, {c.vocab, c.d_model});  // [N, L, D]
  Var pos = layers::create_parameter({c.seq_len, c.d_model}, DType::kFloat32, "pos_embedding",
                                     "w_0", {}, initializer::Normal(0.0f, 0.02f));
  x = layers::elementwise_add(x, pos, 1);
  for (int i = 0; i < c.layers; ++i) {
    on_stage(i * pp_degree / c.layers);
    x = layers::layer_norm(layers::elementwise_add(x, MaybeDropout(SelfAttention(x, c), c)), 2);
    recompute_checkpoint(x);  // the attention sublayer's output
    Var ff = layers::fc(layers::gelu(layers::fc(x, c.d_ff, "", 2, {}, {}, true, kCol)), c.d_model,
                        "", 2, {}, {}, true, kRow);
    x = layers::layer_norm(layers::elementwise_add(x, MaybeDropout(ff, c)), 2);
    recompute_checkpoint(x);  // the layer's output: recompute keeps these sublayer outputs alone
  }
  // The output layer is column-parallel over the vocabulary (each rank its V / T classes), with
  // the vocabulary-parallel loss and top-1: no rank holds a whole row of logits.
  Var logits = layers::fc(layers::reshape(x, {-1, c.d_model}), c.vocab, "", 1, {}, {}, true,
                          kCol);  // [N*L, V / T]
  Var flat_labels = layers::reshape(labels, {-1, 1});
  Var loss = layers::mean(layers::vocab_parallel_cross_entropy(logits, flat_labels));
  Var acc = layers::vocab_parallel_accuracy(logits, flat_labels);
  return {logits, loss, acc};
}

void ValidateTransformerConfig(const TransformerConfig& c, int tp_degree) {
  auto positive = [](int v, const char* name) {
    KEEL_ENFORCE(v >= 1, "transformer: ", name, "=", v, " must be >= 1");
  };
  positive(c.vocab, "vocab");
  positive(c.seq_len, "seq_len");
  positive(c.d_model, "d_model");
  positive(c.heads, "heads");
  positive(c.d_ff, "d_ff");
  positive(c.layers, "layers");
  KEEL_ENFORCE(c.dropout >= 0 && c.dropout < 1, "transformer: dropout=", c.dropout,
               " must be in [0, 1)");
  KEEL_ENFORCE(c.d_model % c.heads == 0, "transformer: d_model=", c.d_model,
               " must divide by heads=", c.heads);
  if (tp_degree <= 1) return;
  KEEL_ENFORCE(c.heads % tp_degree == 0, "transformer: heads=", c.heads,
               " must divide by the tensor-parallel degree ", tp_degree,
               " (each rank computes whole heads)");
  KEEL_ENFORCE(c.d_ff % tp_degree == 0, "transformer: d_ff=", c.d_ff,
               " must divide by the tensor-parallel degree ", tp_degree);
  KEEL_ENFORCE(c.vocab % tp_degree == 0, "transformer: vocab=", c.vocab,
               " must divide by the tensor-parallel degree ", tp_degree,
               " (the embedding table's rows are split)");
}

void ReversalTaskData::Next(int64_t batch, Tensor* ids, Tensor* labels) {
  const int64_t L = cfg_.seq_len;
  int64_t* pi = static_cast<int64_t*>(ids->Alloc(DType::kInt64, {batch, L, 1}));
  int64_t* pl = static_cast<int64_t*>(labels->Alloc(DType::kInt64, {batch, L, 1}));
  std::uniform_int_distribution<int64_t> tok(0, cfg_.vocab - 1);
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t i = 0; i < L; ++i) pi[n * L + i] = tok(rng_);
    for (int64_t i = 0; i < L; ++i) pl[n * L + i] = pi[n * L + (L - 1 - i)];
  }
}

}  // namespace models
}  // namespace keel
