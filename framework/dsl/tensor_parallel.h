// Megatron-style tensor parallelism in the DSL (docs/tensor-parallel.md): which group the layers
// being built belong to, and the layers' collectives.
//
// A model is built once per rank; inside a TensorParallelGuard the parallel layers
// (layers::fc(..., Parallel::kColumn / kRow), layers::vocab_parallel_embedding) create this
// rank's shard of their parameters and the collectives between shards. With degree 1 (the
// default, no guard) they are exactly the plain layers: the same ops, names and initializers.
//
// Sharded initialisation, so that TP=N equals TP=1 exactly: the startup program initialises the
// FULL parameter (var "<param>@TP_FULL", the shape the TP=1 model has, the same initializer and
// the same fans) and keeps this rank's slice with c_split. Every c_split of a full parameter sits
// after every initializer in the startup program (create_parameter keeps them last), so each
// initializer has the index it has in the TP=1 startup program and, with a program random seed,
// draws the seed TP=1 draws (the executor derives unseeded ops' seeds from the program seed and
// the op's index). Cost: the full parameter exists once, briefly, while startup runs.
#pragma once

#include <string>

#include "framework/dsl/layers.h"

namespace keel {

struct TensorParallelConfig {
  int degree = 1;   // ranks of this rank's tensor-parallel group
  int rank = 0;     // this rank's index in it
  int ring_id = 0;  // the group's ring (fleet sets transpiler::kTensorParallelRingId)
};

// Layers built while a guard lives use `config`; guards nest.
class TensorParallelGuard {
 public:
  explicit TensorParallelGuard(const TensorParallelConfig& config);
  ~TensorParallelGuard();
  TensorParallelGuard(const TensorParallelGuard&) = delete;
  TensorParallelGuard& operator=(const TensorParallelGuard&) = delete;

 private:
  TensorParallelConfig saved_;
};

// The config layers see now (degree 1 outside any guard).
const TensorParallelConfig& current_tensor_parallel();

// The suffix of the startup var holding a sharded parameter's full initial value.
inline constexpr const char* kTpFullSuffix = "@TP_FULL";

namespace layers {

// The collectives, on the current group's ring (a keel::Error outside a guard of degree > 1,
// naming the layer).
Var c_identity(Var x);               // forward copy, backward all-reduce
Var mp_allreduce_sum(Var x);         // forward all-reduce, backward copy
Var c_split(Var x, int axis = -1);   // this rank's part along axis; backward all-gather
Var c_concat(Var x, int axis = -1);  // all-gather along axis; backward keeps this rank's part

// A parameter of which this rank holds part `rank` of `degree` along `axis` of `full_shape`
// (create_parameter's arguments otherwise). Degree 1: create_parameter(full_shape, ...).
Var create_sharded_parameter(const std::vector<int64_t>& full_shape, int axis, DType dtype,
                             const std::string& layer, const std::string& suffix,
                             const ParamAttr& attr, const initializer::Initializer& default_init);

// Table rows split over the group: rank r holds rows [r * V / n, (r + 1) * V / n) of the
// [V, D] table; an id outside them gives a zero row, and mp_allreduce_sum adds the ranks'
// rows. V must divide by the degree. Degree 1: layers::embedding.
Var vocab_parallel_embedding(Var ids, const std::vector<int64_t>& size,
                             const ParamAttr& param_attr = {}, DType dtype = DType::kFloat32);

// The loss of a vocabulary-parallel output layer (Megatron's parallel cross-entropy): `logits`
// [..., V / n] holds this rank's classes (a column-parallel fc over the classes: rank r's are
// [r * V / n, (r + 1) * V / n)), `label` int64 [..., 1] a class in [0, V). Returns Loss [..., 1]
// (op c_softmax_with_cross_entropy); no rank gathers a whole row of logits. Degree 1:
// softmax_with_cross_entropy.
Var vocab_parallel_cross_entropy(Var logits, Var label, int ignore_index = -100);
// Top-1 accuracy of such logits over all classes (op c_top1, then accuracy). Degree 1:
// accuracy(logits, label, 1).
Var vocab_parallel_accuracy(Var logits, Var label);

}  // namespace layers
}  // namespace keel
