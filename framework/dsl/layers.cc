#include "framework/dsl/layers.h"

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
  init(startup.global_block(), *startup.global_block().FindVar(name));
  return Var(&mb, name);
}

Var fc(Var x, int size, const std::string& act, int num_flatten_dims, const ParamAttr& param_attr,
       const ParamAttr& bias_attr, bool with_bias) {
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
  Var w = create_parameter({width, size}, dt, layer, "w_0", param_attr, initializer::Xavier());
  Var out = Unary("mul", {{"X", {x.name()}}, {"Y", {w.name()}}},
                  {{"x_num_col_dims", num_flatten_dims}, {"y_num_col_dims", 1}}, layer);
  if (with_bias) {
    Var b = create_parameter({size}, dt, layer, "b_0", bias_attr, initializer::Constant(0.0f));
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
