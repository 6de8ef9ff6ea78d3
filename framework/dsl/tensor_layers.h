// layers:: for embeddings, layout, the newer activations and evaluation: each call appends its op
// to the current main program (parameters also to the startup program) and returns the output.
// Shapes are checked as the op is appended, so a wrong shape fails at the user's line.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "framework/dsl/layers.h"

namespace keel {
namespace layers {

// W[ids] for int64 ids [..., 1] -> [..., size[1]]; W is a [size[0], size[1]] parameter, Xavier
// (uniform) unless param_attr names an initializer, as in Paddle 1.x. Rows whose id equals
// padding_idx are zeros and W's row gets no gradient; -1: no padding id. is_sparse: W's gradient
// holds only the rows the batch's ids touch (row-sparse; sgd, momentum and adam update them, and
// Adam(..., lazy_mode=true) touches nothing else), as Paddle's is_sparse; ops that need dense
// gradients (weight decay, clipping, collectives, mixed precision) refuse it by name.
// is_distributed (Paddle's; needs is_sparse): in parameter-server training the table lives on the
// servers only, row id on server id % servers, created when first looked up; trainers fetch the
// rows of each batch and push row gradients (docs/sparse-embeddings.md). Its initializer
// (Uniform, Normal or Constant) becomes row_seeded_random: row r's values depend on the seed and
// r alone, so one process holds the same rows as the servers create.
Var embedding(Var ids, const std::vector<int64_t>& size, int64_t padding_idx = -1,
              const ParamAttr& param_attr = {}, DType dtype = DType::kFloat32,
              bool is_sparse = false, bool is_distributed = false);

// xs joined along `axis`; the other dims must agree.
Var concat(const std::vector<Var>& xs, int axis = 0);
// x cut along `dim` into `num` equal parts, or parts of `sections` (one may be -1, inferred).
std::vector<Var> split(Var x, int num, int dim = -1);
std::vector<Var> split(Var x, const std::vector<int>& sections, int dim = -1);
// Out's dim i is x's dim perm[i].
Var transpose(Var x, const std::vector<int>& perm);
// x as [prod(dims[:axis]), prod(dims[axis:])].
Var flatten(Var x, int axis = 1);
// x with a size-1 dim inserted at each of `axes`, in turn.
Var unsqueeze(Var x, const std::vector<int>& axes);
// x without the size-1 dims at `axes` (every size-1 dim when empty).
Var squeeze(Var x, const std::vector<int>& axes = {});

// x * Phi(x); approximate: the tanh form.
Var gelu(Var x, bool approximate = false);
Var leaky_relu(Var x, float alpha = 0.02f);
Var log_softmax(Var x, int axis = -1);
// min(max(x, min), max).
Var clip(Var x, float min, float max);

// The k largest values along the last axis and their int64 indices: {values, indices}.
std::pair<Var, Var> topk(Var x, int k);
// The int64 index of the largest element along `axis`.
Var argmax(Var x, int axis = 0, bool keepdims = false);
// Appends top_k(input, k) and accuracy against int64 label [N, 1]; returns the float32 [1]
// fraction of rows whose label is among the top k.
Var accuracy(Var input, Var label, int k = 1);
// The accuracy op alone, on top-k `values` and `indices` made elsewhere (e.g. c_top1 over
// vocabulary-parallel logits).
Var accuracy_of_topk(Var values, Var indices, Var label);

}  // namespace layers
}  // namespace keel
