#include "framework/dsl/layers.h"

#include <memory>

#include "framework/dsl/tensor_parallel.h"

namespace keel {
namespace layers {

namespace {

Program& Main() { return default_main_program(); }

// Appends `type` with one output "Out" named "<prefix>.tmp_N"; returns it.
Var Unary(const std::string& type, const OpDesc::VarMap& inputs,
          const std::map<std::string, Attribute>& attrs = {}, const std::string& prefix = "") {
  Program& prog = Main();
  Block& block = prog.global_block();
  std::string out = prog.UniqueName((prefix.empty() ? type : prefix) + ".tmp");
  AppendOp(block, type, inputs, {{"Out", {out}}}, attrs);
  return Var(&block, out);
}

// A sharded parameter's c_split in startup (tensor_parallel.h).
bool IsShardSplit(const OpDesc& op) {
  if (op.type() != "c_split" || op.Input("X").empty()) return false;
  const std::string& x = op.Input("X")[0];
  const std::string suffix = kTpFullSuffix;
  return x.size() > suffix.size() &&
         x.compare(x.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Var Binary(const std::string& type, Var x, Var y, int axis) {
  return Unary(type, {{"X", {x.name()}}, {"Y", {y.name()}}}, {{"axis", axis}});
}

}  // namespace

Var data(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
         bool stop_gradient) {
  Block& block = Main().global_block();
  KEEL_ENFORCE(!block.HasVar(name), "layers::data: variable '", name, "' already exists");
  for (int64_t d : shape)
    KEEL_ENFORCE(d == -1 || d > 0, "layers::data('", name, "'): dim ", d,
                 " must be positive or -1");
  VarDesc* v = block.Var(name);
  v->set_shape(shape);
  v->set_dtype(dtype);
  v->set_is_data(true);
  v->set_stop_gradient(stop_gradient);
  return Var(&block, name);
}

Var create_parameter(const std::vector<int64_t>& shape, DType dtype, const std::string& layer,
                     const std::string& suffix, const ParamAttr& attr,
                     const initializer::Initializer& default_init) {
  for (int64_t d : shape)
    KEEL_ENFORCE(d > 0, layer, ": parameter shape ", DDim(shape).str(),
                 " must be fully known and positive");
  Program& main = Main();
  Program& startup = default_startup_program();
  std::string name = attr.name.empty() ? layer + "." + suffix : attr.name;
  Block& mb = main.global_block();
  if (VarDesc* existing = mb.FindVar(name)) {
    KEEL_ENFORCE(existing->persistable() && existing->shape() == shape, layer, ": parameter '",
                 name, "' exists with shape ", existing->dims().str(), ", requested ",
                 DDim(shape).str());
    return Var(&mb, name);
  }
  for (VarDesc* v : {mb.Var(name), startup.global_block().Var(name)}) {
    v->set_shape(shape);
    v->set_dtype(dtype);
    v->set_persistable(true);
    v->set_is_parameter(attr.trainable);
    v->set_stop_gradient(!attr.trainable);
  }
  const auto& init = attr.initializer ? attr.initializer : default_init;
  Block& sb = startup.global_block();
  const size_t before = sb.num_ops();
  init(sb, *sb.FindVar(name));
  // Keep the c_splits of sharded parameters (tensor_parallel.h) after every initializer, so that
  // initializers have the indices (and so the derived seeds) of the model without them.
  size_t splits = before;
  while (splits > 0 && IsShardSplit(*sb.op(splits - 1))) --splits;
  const size_t after = sb.num_ops();
  for (size_t i = before; splits < before && i < after; ++i) {
    auto moved = std::make_unique<OpDesc>(*sb.op(i));
    sb.RemoveOp(i);
    sb.InsertOp(splits + (i - before), std::move(moved));
  }
  return Var(&mb, name);
}

Var fc(Var x, int size, const std::string& act, int num_flatten_dims, const ParamAttr& param_attr,
       const ParamAttr& bias_attr, bool with_bias, Parallel parallel) {
  KEEL_ENFORCE(size > 0, "layers::fc(", x.name(), "): size must be positive, got ", size);
  DDim in = x.shape();
  KEEL_ENFORCE(num_flatten_dims >= 1 && in.size() > num_flatten_dims, "layers::fc(", x.name(),
               "): input has shape ", in.str(), " (rank ", in.size(),
               "), but num_flatten_dims=", num_flatten_dims,
               " needs rank >= ", num_flatten_dims + 1);
  int64_t width = 1;
  for (int i = num_flatten_dims; i < in.size(); ++i) {
    KEEL_ENFORCE(in[i] > 0, "layers::fc(", x.name(), "): input shape ", in.str(),
                 " has unknown dim ", i, " among the flattened ones");
    width *= in[i];
  }
  std::string layer = Main().UniqueName("fc");
  DType dt = x.dtype();
  const int tp = current_tensor_parallel().degree;
  if (tp == 1) parallel = Parallel::kNone;
  if (parallel == Parallel::kColumn)
    KEEL_ENFORCE(size % tp == 0, "layers::fc(", x.name(), ", parallel=Column): size ", size,
                 " does not divide by the tensor-parallel degree ", tp);
  // The full weight is [in, size]; a row layer's input is this rank's in / tp columns.
  const int64_t full_in = parallel == Parallel::kRow ? width * tp : width;
  const int w_axis = parallel == Parallel::kColumn ? 1 : 0;
  Var w = parallel == Parallel::kNone
              ? create_parameter({width, size}, dt, layer, "w_0", param_attr, initializer::Xavier())
              : layers::create_sharded_parameter({full_in, size}, w_axis, dt, layer, "w_0",
                                                 param_attr, initializer::Xavier());
  if (parallel == Parallel::kColumn) x = layers::c_identity(x);
  Var out = Unary("mul", {{"X", {x.name()}}, {"Y", {w.name()}}},
                  {{"x_num_col_dims", num_flatten_dims}, {"y_num_col_dims", 1}}, layer);
  if (parallel == Parallel::kRow) out = layers::mp_allreduce_sum(out);
  if (with_bias) {
    Var b =
        parallel == Parallel::kColumn
            ? layers::create_sharded_parameter({size}, 0, dt, layer, "b_0", bias_attr,
                                               initializer::Constant(0.0f))
            : create_parameter({size}, dt, layer, "b_0", bias_attr, initializer::Constant(0.0f));
    out = Unary("elementwise_add", {{"X", {out.name()}}, {"Y", {b.name()}}},
                {{"axis", num_flatten_dims}}, layer);
  }
  return activation(out, act);
}

Var activation(Var x, const std::string& act) {
  if (act.empty()) return x;
  if (act == "tanh" || act == "relu" || act == "sigmoid") return Unary(act, {{"X", {x.name()}}});
  if (act == "softmax") return softmax(x);
  KEEL_THROW("unknown activation '", act, "' (known: tanh, relu, sigmoid, softmax)");
}

Var tanh(Var x) { return Unary("tanh", {{"X", {x.name()}}}); }
Var relu(Var x) { return Unary("relu", {{"X", {x.name()}}}); }
Var sigmoid(Var x) { return Unary("sigmoid", {{"X", {x.name()}}}); }
Var softmax(Var x, int axis) { return Unary("softmax", {{"X", {x.name()}}}, {{"axis", axis}}); }

Var cross_entropy(Var input, Var label, bool soft_label, int ignore_index) {
  Program& prog = Main();
  Block& block = prog.global_block();
  std::string out = prog.UniqueName("cross_entropy.tmp");
  AppendOp(block, "cross_entropy", {{"X", {input.name()}}, {"Label", {label.name()}}},
           {{"Y", {out}}}, {{"soft_label", soft_label}, {"ignore_index", ignore_index}});
  return Var(&block, out);
}

Var softmax_with_cross_entropy(Var logits, Var label, bool soft_label, int ignore_index) {
  Program& prog = Main();
  Block& block = prog.global_block();
  std::string sm = prog.UniqueName("softmax_with_cross_entropy.tmp");
  std::string loss = prog.UniqueName("softmax_with_cross_entropy.tmp");
  AppendOp(block, "softmax_with_cross_entropy",
           {{"Logits", {logits.name()}}, {"Label", {label.name()}}},
           {{"Softmax", {sm}}, {"Loss", {loss}}},
           {{"soft_label", soft_label}, {"ignore_index", ignore_index}});
  return Var(&block, loss);
}

Var mean(Var x) { return Unary("mean", {{"X", {x.name()}}}); }

Var reduce_sum(Var x, std::vector<int> dim, bool keep_dim) {
  bool all = dim.empty();
  return Unary(
      "reduce_sum", {{"X", {x.name()}}},
      {{"dim", all ? std::vector<int>{0} : dim}, {"keep_dim", keep_dim}, {"reduce_all", all}});
}

Var reduce_mean(Var x, std::vector<int> dim, bool keep_dim) {
  bool all = dim.empty();
  return Unary(
      "reduce_mean", {{"X", {x.name()}}},
      {{"dim", all ? std::vector<int>{0} : dim}, {"keep_dim", keep_dim}, {"reduce_all", all}});
}

Var scale(Var x, float s, float bias, bool bias_after_scale) {
  return Unary("scale", {{"X", {x.name()}}},
               {{"scale", s}, {"bias", bias}, {"bias_after_scale", bias_after_scale}});
}

Var elementwise_add(Var x, Var y, int axis) { return Binary("elementwise_add", x, y, axis); }
Var elementwise_sub(Var x, Var y, int axis) { return Binary("elementwise_sub", x, y, axis); }
Var elementwise_mul(Var x, Var y, int axis) { return Binary("elementwise_mul", x, y, axis); }
Var elementwise_div(Var x, Var y, int axis) { return Binary("elementwise_div", x, y, axis); }

Var mul(Var x, Var y, int xk, int yk) {
  return Unary("mul", {{"X", {x.name()}}, {"Y", {y.name()}}},
               {{"x_num_col_dims", xk}, {"y_num_col_dims", yk}});
}

Var matmul(Var x, Var y, bool tx, bool ty, float alpha) {
  return Unary("matmul", {{"X", {x.name()}}, {"Y", {y.name()}}},
               {{"transpose_X", tx}, {"transpose_Y", ty}, {"alpha", alpha}});
}

Var sums(const std::vector<Var>& xs) {
  std::vector<std::string> names;
  for (auto& v : xs) names.push_back(v.name());
  return Unary("sum", {{"X", names}});
}

Var cast(Var x, DType dtype) {
  return Unary("cast", {{"X", {x.name()}}},
               {{"in_dtype", static_cast<int>(x.dtype())}, {"out_dtype", static_cast<int>(dtype)}});
}

Var reshape(Var x, const std::vector<int>& shape) {
  return Unary("reshape", {{"X", {x.name()}}}, {{"shape", shape}});
}

Var fill_constant(const std::vector<int64_t>& shape, DType dtype, float value) {
  return Unary("fill_constant", {},
               {{"shape", shape}, {"dtype", static_cast<int>(dtype)}, {"value", value}});
}

}  // namespace layers
}  // namespace keel
