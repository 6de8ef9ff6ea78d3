#include "models/transformer/transformer_model.h"

#include <cmath>

#include "framework/dsl/nn_layers.h"
#include "framework/dsl/tensor_layers.h"

namespace keel {
namespace models {

namespace {

// Dimension legend: N = batch, L = sequence, D = d_model, H = heads, E = D / H.
Var SelfAttention(Var x, const TransformerConfig& c) {
  const int E = c.d_model / c.heads;
  auto heads = [&](Var t) {  // [N, L, D] -> [N, H, L, E]
    return layers::transpose(layers::reshape(t, {0, 0, c.heads, E}), {0, 2, 1, 3});
  };
  Var q = heads(layers::fc(x, c.d_model, "", 2));
  Var k = heads(layers::fc(x, c.d_model, "", 2));
  Var v = heads(layers::fc(x, c.d_model, "", 2));
  // scores = q k' / sqrt(E): [N, H, L, L]
  Var scores = layers::matmul(q, k, false, true, 1.0f / std::sqrt(static_cast<float>(E)));
  Var ctx = layers::matmul(layers::softmax(scores), v);  // [N, H, L, E]
  ctx = layers::reshape(layers::transpose(ctx, {0, 2, 1, 3}), {0, 0, c.d_model});
  return layers::fc(ctx, c.d_model, "", 2);
}

}  // namespace

ClassifierOutputs transformer_encoder(Var ids, Var labels, const TransformerConfig& c) {
  KEEL_ENFORCE(c.d_model % c.heads == 0, "transformer: d_model ", c.d_model,
               " must divide by heads ", c.heads);
  Var x = layers::embedding(ids, {c.vocab, c.d_model});  // [N, L, D]
  Var pos = layers::create_parameter({c.seq_len, c.d_model}, DType::kFloat32, "pos_embedding",
                                     "w_0", {}, initializer::Normal(0.0f, 0.02f));
  x = layers::elementwise_add(x, pos, 1);
  for (int i = 0; i < c.layers; ++i) {
    x = layers::layer_norm(layers::elementwise_add(x, SelfAttention(x, c)), 2);
    recompute_checkpoint(x);  // the attention sublayer's output
    Var ff = layers::fc(layers::gelu(layers::fc(x, c.d_ff, "", 2)), c.d_model, "", 2);
    x = layers::layer_norm(layers::elementwise_add(x, ff), 2);
    recompute_checkpoint(x);  // the layer's output: recompute keeps these sublayer outputs alone
  }
  Var logits = layers::reshape(layers::fc(x, c.vocab, "", 2), {-1, c.vocab});  // [N*L, V]
  Var flat_labels = layers::reshape(labels, {-1, 1});
  Var loss = layers::mean(layers::softmax_with_cross_entropy(logits, flat_labels));
  Var acc = layers::accuracy(layers::softmax(logits), flat_labels, 1);
  return {logits, loss, acc};
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
