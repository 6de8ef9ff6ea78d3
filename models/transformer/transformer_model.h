// A small Transformer encoder (token + learned position embeddings, post-LN blocks of multi-head
// self-attention built from matmul/softmax and a GELU feed-forward) that labels every position.
// Its synthetic task: output the input sequence reversed, which needs attention across positions.
#pragma once

#include <cstdint>
#include <random>

#include "framework/runtime/tensor.h"
#include "models/lenet/lenet_model.h"

namespace keel {
namespace models {

struct TransformerConfig {
  int vocab = 10, seq_len = 8, d_model = 32, heads = 2, d_ff = 64, layers = 2;
  float dropout = 0;  // after the attention and feed-forward sublayers; 0: none (today's model)
};

// Refuses sizes that cannot work, naming the field: any size < 1, dropout outside [0, 1), d_model
// not dividing by heads; with tp_degree > 1, heads, d_ff or vocab not dividing by it.
void ValidateTransformerConfig(const TransformerConfig& cfg, int tp_degree);

// ids: [N, L, 1] int64, labels: [N, L, 1] int64. Loss and accuracy are per token.
// Built inside a TensorParallelGuard of degree T > 1 (framework/dsl/tensor_parallel.h), the
// tensor-parallel variant: vocabulary-parallel embedding, Q/K/V column-parallel (H / T heads per
// rank) and the attention output row-parallel, the feed-forward column then row; layer norms,
// position embeddings and the output layer replicated. Degree 1: exactly the plain model.
// With pp_degree > 1 (at most cfg.layers) its layers sit on pipeline stages
// (framework/dsl/pipeline.h): the embeddings and layer 0 on stage 0, layer i on stage
// i * pp_degree / layers, the output layer, loss and accuracy with the last layer.
ClassifierOutputs transformer_encoder(Var ids, Var labels, const TransformerConfig& cfg,
                                      int pp_degree = 1);

// Batches of the reversal task: ids uniform in [0, vocab), labels[i] = ids[L-1-i].
class ReversalTaskData {
 public:
  ReversalTaskData(const TransformerConfig& cfg, uint64_t seed) : cfg_(cfg), rng_(seed) {}
  void Next(int64_t batch, Tensor* ids, Tensor* labels);

 private:
  TransformerConfig cfg_;
  std::mt19937_64 rng_;
};

}  // namespace models
}  // namespace keel
