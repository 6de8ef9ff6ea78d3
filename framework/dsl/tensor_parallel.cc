#include "framework/dsl/tensor_parallel.h"

#include <memory>
#include <utility>

#include "framework/dsl/pipeline.h"
#include "framework/dsl/tensor_layers.h"
#include "framework/ir/op_device.h"

namespace keel {

namespace {
TensorParallelConfig& Current() {
  static thread_local TensorParallelConfig config;
  return config;
}

// The current group, refusing a collective layer outside a guard of degree > 1.
const TensorParallelConfig& Group(const char* layer) {
  const TensorParallelConfig& c = Current();
  KEEL_ENFORCE(c.degree > 1, "layers::", layer,
               ": no tensor-parallel group (build the model inside a TensorParallelGuard with "
               "degree > 1)");
  return c;
}

Var Collective(const char* type, Var x, std::map<std::string, Attribute> attrs) {
  const TensorParallelConfig& c = Group(type);
  Program& prog = default_main_program();
  Block& block = prog.global_block();
  const std::string out = prog.UniqueName(std::string(type) + ".tmp");
  attrs["ring_id"] = c.ring_id;
  AppendOp(block, type, {{"X", {x.name()}}}, {{"Out", {out}}}, attrs);
  return Var(&block, out);
}
}  // namespace

TensorParallelGuard::TensorParallelGuard(const TensorParallelConfig& config) : saved_(Current()) {
  KEEL_ENFORCE(config.degree >= 1, "TensorParallelGuard: degree=", config.degree, " must be >= 1");
  KEEL_ENFORCE(config.rank >= 0 && config.rank < config.degree,
               "TensorParallelGuard: rank=", config.rank, " must be in [0, degree=", config.degree,
               ")");
  Current() = config;
}
TensorParallelGuard::~TensorParallelGuard() { Current() = saved_; }

const TensorParallelConfig& current_tensor_parallel() { return Current(); }

namespace layers {

Var c_identity(Var x) {
  const TensorParallelConfig& c = Group("c_identity");
  // One entry per input (and stage): the column layers that read the same x share it, so their
  // gradients of x are summed before one all-reduce (Megatron's one backward all-reduce per
  // block: attention's Q, K and V projections are one block).
  Block& block = default_main_program().global_block();
  const std::string device =
      current_pipeline_stage() < 0 ? std::string() : PipelineStageName(current_pipeline_stage());
  for (const auto& op : block.ops()) {
    if (op->type() != "c_identity" || op->Input("X") != std::vector<std::string>{x.name()} ||
        op->Attr<int>("ring_id") != c.ring_id)
      continue;
    const std::string op_device =
        op->HasAttr(kOpDeviceAttr) ? op->Attr<std::string>(kOpDeviceAttr) : std::string();
    if (op_device == device) return Var(&block, op->Output("Out")[0]);
  }
  return Collective("c_identity", x, {});
}
Var mp_allreduce_sum(Var x) { return Collective("mp_allreduce_sum", x, {}); }
Var c_split(Var x, int axis) {
  const TensorParallelConfig& c = Group("c_split");
  return Collective("c_split", x, {{"nranks", c.degree}, {"rank", c.rank}, {"axis", axis}});
}
Var c_concat(Var x, int axis) {
  const TensorParallelConfig& c = Group("c_concat");
  return Collective("c_concat", x, {{"nranks", c.degree}, {"rank", c.rank}, {"axis", axis}});
}

Var create_sharded_parameter(const std::vector<int64_t>& full_shape, int axis, DType dtype,
                             const std::string& layer, const std::string& suffix,
                             const ParamAttr& attr, const initializer::Initializer& default_init) {
  const TensorParallelConfig& c = Current();
  if (c.degree == 1) return create_parameter(full_shape, dtype, layer, suffix, attr, default_init);
  const int n = static_cast<int>(full_shape.size());
  const int a = axis < 0 ? axis + n : axis;
  KEEL_ENFORCE(a >= 0 && a < n, layer, ": shard axis ", axis, " is outside parameter shape ",
               DDim(full_shape).str());
  KEEL_ENFORCE(full_shape[a] % c.degree == 0, layer, ": parameter shape ", DDim(full_shape).str(),
               " dim ", a, " (", full_shape[a], ") does not divide by the tensor-parallel degree ",
               c.degree);
  std::vector<int64_t> shard = full_shape;
  shard[a] /= c.degree;
  const std::string name = attr.name.empty() ? layer + "." + suffix : attr.name;
  Block& sb = default_startup_program().global_block();
  KEEL_ENFORCE(default_main_program().global_block().FindVar(name) == nullptr, layer,
               ": parameter '", name, "' already exists; a sharded parameter cannot be shared");
  // The full initial value, made by create_parameter's initializer placement (before every
  // c_split), then declared as a plain startup temporary.
  ParamAttr full_attr = attr;
  full_attr.name = name + kTpFullSuffix;
  // Built through create_parameter so the initializer sees the full shape and lands where TP=1's
  // does; then the full var leaves main and stops being a persistable parameter.
  create_parameter(full_shape, dtype, layer, suffix, full_attr, default_init);
  default_main_program().global_block().RemoveVar(full_attr.name);
  VarDesc* full = sb.FindVar(full_attr.name);
  full->set_persistable(false);
  full->set_is_parameter(false);
  // The shard: a parameter in main and startup, written by c_split at the end of startup.
  Block& mb = default_main_program().global_block();
  for (VarDesc* v : {mb.Var(name), sb.Var(name)}) {
    v->set_shape(shard);
    v->set_dtype(dtype);
    v->set_persistable(true);
    v->set_is_parameter(attr.trainable);
    v->set_stop_gradient(!attr.trainable);
  }
  AppendOp(sb, "c_split", {{"X", {full_attr.name}}}, {{"Out", {name}}},
           {{"ring_id", c.ring_id}, {"nranks", c.degree}, {"rank", c.rank}, {"axis", a}});
  return Var(&mb, name);
}

Var vocab_parallel_embedding(Var ids, const std::vector<int64_t>& size, const ParamAttr& param_attr,
                             DType dtype) {
  const TensorParallelConfig& c = Current();
  if (c.degree == 1) return embedding(ids, size, -1, param_attr, dtype);
  KEEL_ENFORCE(size.size() == 2, "layers::vocab_parallel_embedding(", ids.name(),
               "): size must be {vocab, dim}, got ", DDim(size).str());
  KEEL_ENFORCE(size[0] % c.degree == 0, "layers::vocab_parallel_embedding(", ids.name(),
               "): vocab ", size[0], " does not divide by the tensor-parallel degree ", c.degree);
  Program& prog = default_main_program();
  const std::string layer = prog.UniqueName("embedding");  // the name TP=1's embedding has
  Var w = create_sharded_parameter(size, 0, dtype, layer, "w_0", param_attr, initializer::Xavier());
  Block& block = prog.global_block();
  const std::string out = prog.UniqueName("c_embedding.tmp");
  AppendOp(block, "c_embedding", {{"W", {w.name()}}, {"Ids", {ids.name()}}}, {{"Out", {out}}},
           {{"start_index", static_cast<int64_t>(c.rank) * (size[0] / c.degree)}});
  return mp_allreduce_sum(Var(&block, out));
}

Var vocab_parallel_cross_entropy(Var logits, Var label, int ignore_index) {
  const TensorParallelConfig& c = Current();
  if (c.degree == 1) return softmax_with_cross_entropy(logits, label, false, ignore_index);
  Program& prog = default_main_program();
  Block& block = prog.global_block();
  const std::string sm = prog.UniqueName("c_softmax_with_cross_entropy.tmp");
  const std::string loss = prog.UniqueName("c_softmax_with_cross_entropy.tmp");
  AppendOp(block, "c_softmax_with_cross_entropy",
           {{"Logits", {logits.name()}}, {"Label", {label.name()}}},
           {{"Softmax", {sm}}, {"Loss", {loss}}},
           {{"ring_id", c.ring_id},
            {"nranks", c.degree},
            {"rank", c.rank},
            {"ignore_index", ignore_index}});
  return Var(&block, loss);
}

Var vocab_parallel_accuracy(Var logits, Var label) {
  const TensorParallelConfig& c = Current();
  if (c.degree == 1) return accuracy(logits, label, 1);
  Program& prog = default_main_program();
  Block& block = prog.global_block();
  const std::string top = prog.UniqueName("c_top1.tmp"), idx = prog.UniqueName("c_top1.tmp");
  AppendOp(block, "c_top1", {{"X", {logits.name()}}}, {{"Out", {top}}, {"Indices", {idx}}},
           {{"ring_id", c.ring_id}, {"nranks", c.degree}, {"rank", c.rank}});
  return accuracy_of_topk(Var(&block, top), Var(&block, idx), label);
}

}  // namespace layers
}  // namespace keel
