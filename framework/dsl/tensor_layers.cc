#include "framework/dsl/tensor_layers.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>

namespace keel {
namespace layers {

namespace {

// Appends `type` with one fresh var "<type>.tmp_N" in each of `out_slots` (count each); returns
// them in order.
std::vector<Var> AppendWithOutputs(const std::string& type, const OpDesc::VarMap& inputs,
                                   const std::vector<std::pair<std::string, int>>& out_slots,
                                   const std::map<std::string, Attribute>& attrs = {}) {
  Program& prog = default_main_program();
  Block& block = prog.global_block();
  OpDesc::VarMap outputs;
  std::vector<Var> vars;
  for (const auto& [slot, count] : out_slots) {
    std::vector<std::string> names;
    for (int i = 0; i < count; ++i) {
      names.push_back(prog.UniqueName(type + ".tmp"));
      vars.emplace_back(&block, names.back());
    }
    outputs.emplace_back(slot, names);
  }
  AppendOp(block, type, inputs, outputs, attrs);
  return vars;
}

// Appends `type` with X = x and one output Out; returns Out.
Var UnaryOp(const std::string& type, Var x, const std::map<std::string, Attribute>& attrs = {}) {
  return AppendWithOutputs(type, {{"X", {x.name()}}}, {{"Out", 1}}, attrs)[0];
}

std::vector<Var> SplitOp(Var x, int num, const std::vector<int>& sections, int dim) {
  const int parts = sections.empty() ? num : static_cast<int>(sections.size());
  KEEL_ENFORCE(parts > 0, "layers::split(", x.name(), "): need num > 0 or non-empty sections");
  return AppendWithOutputs(
      "split", {{"X", {x.name()}}}, {{"Out", parts}},
      {{"num", sections.empty() ? num : 0}, {"sections", sections}, {"axis", dim}});
}

}  // namespace

namespace {

// The startup op that initializes table `w` (uniform_random, gaussian_random or fill_constant)
// becomes row_seeded_random with the same distribution: row r drawn from (seed, r) alone. A seed
// of 0 becomes a hash of the table's name (FNV-1a), so that it does not depend on the op's place
// in the startup program.
void RowSeededInitializer(Block& startup, const std::string& w) {
  for (size_t i = startup.num_ops(); i-- > 0;) {
    OpDesc& op = *startup.op(i);
    const auto outs = op.OutputArgumentNames();
    if (std::find(outs.begin(), outs.end(), w) == outs.end()) continue;
    if (op.type() == "row_seeded_random") return;  // a table looked up again
    int dist = 0;
    float a = 0, b = 0;
    int64_t seed = 0;
    if (op.type() == "uniform_random") {
      a = op.Attr<float>("min");
      b = op.Attr<float>("max");
      seed = op.Attr<int>("seed");
    } else if (op.type() == "gaussian_random") {
      dist = 1;
      a = op.Attr<float>("mean");
      b = op.Attr<float>("std");
      seed = op.Attr<int>("seed");
    } else {
      KEEL_ENFORCE(op.type() == "fill_constant", "layers::embedding: table ", w,
                   " is_distributed=true needs a Uniform, Normal or Constant initializer (its "
                   "rows are created one by one on the servers), got ",
                   op.type());
      dist = 2;
      a = op.Attr<float>("value");
    }
    if (seed == 0) {
      uint64_t h = 1469598103934665603ull;
      for (char c : w) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
      seed = static_cast<int64_t>(h >> 1);
    }
    std::unique_ptr<OpDesc> init = std::make_unique<OpDesc>("row_seeded_random");
    init->SetOutput("Out", {w});
    init->SetAttr("shape", startup.MustFindVar(w)->shape());
    init->SetAttr("dtype", static_cast<int>(startup.MustFindVar(w)->dtype()));
    init->SetAttr("dist", dist);
    init->SetAttr("a", a);
    init->SetAttr("b", b);
    init->SetAttr("row_seed", seed);
    if (op.HasAttr(kOpRoleAttr)) init->SetAttr(kOpRoleAttr, op.Attr<int>(kOpRoleAttr));
    startup.RemoveOp(i);
    startup.InsertOp(i, std::move(init));
    return;
  }
  KEEL_THROW("layers::embedding: no startup op initializes table ", w);
}

}  // namespace

Var embedding(Var ids, const std::vector<int64_t>& size, int64_t padding_idx,
              const ParamAttr& param_attr, DType dtype, bool is_sparse, bool is_distributed) {
  KEEL_ENFORCE(size.size() == 2, "layers::embedding(", ids.name(),
               "): size must be {vocab, dim}, got ", DDim(size).str());
  KEEL_ENFORCE(!is_distributed || is_sparse, "layers::embedding(", ids.name(),
               "): is_distributed=true needs is_sparse=true (a distributed table's gradient is "
               "its rows)");
  const std::string layer = default_main_program().UniqueName("embedding");
  Var w = create_parameter(size, dtype, layer, "w_0", param_attr, initializer::Xavier());
  if (is_distributed) RowSeededInitializer(default_startup_program().global_block(), w.name());
  std::map<std::string, Attribute> attrs{{"padding_idx", padding_idx}};
  if (is_sparse) attrs["is_sparse"] = true;
  if (is_distributed) attrs["is_distributed"] = true;
  return AppendWithOutputs("lookup_table", {{"W", {w.name()}}, {"Ids", {ids.name()}}}, {{"Out", 1}},
                           attrs)[0];
}

Var concat(const std::vector<Var>& xs, int axis) {
  std::vector<std::string> names;
  for (const Var& v : xs) names.push_back(v.name());
  return AppendWithOutputs("concat", {{"X", names}}, {{"Out", 1}}, {{"axis", axis}})[0];
}

std::vector<Var> split(Var x, int num, int dim) { return SplitOp(x, num, {}, dim); }
std::vector<Var> split(Var x, const std::vector<int>& sections, int dim) {
  return SplitOp(x, 0, sections, dim);
}

Var transpose(Var x, const std::vector<int>& perm) {
  return UnaryOp("transpose", x, {{"axis", perm}});
}
Var flatten(Var x, int axis) { return UnaryOp("flatten", x, {{"axis", axis}}); }
Var unsqueeze(Var x, const std::vector<int>& axes) {
  return UnaryOp("unsqueeze", x, {{"axes", axes}});
}
Var squeeze(Var x, const std::vector<int>& axes) { return UnaryOp("squeeze", x, {{"axes", axes}}); }

Var gelu(Var x, bool approximate) { return UnaryOp("gelu", x, {{"approximate", approximate}}); }
Var leaky_relu(Var x, float alpha) { return UnaryOp("leaky_relu", x, {{"alpha", alpha}}); }
Var log_softmax(Var x, int axis) { return UnaryOp("log_softmax", x, {{"axis", axis}}); }
Var clip(Var x, float min, float max) { return UnaryOp("clip", x, {{"min", min}, {"max", max}}); }

std::pair<Var, Var> topk(Var x, int k) {
  std::vector<Var> r =
      AppendWithOutputs("top_k", {{"X", {x.name()}}}, {{"Out", 1}, {"Indices", 1}}, {{"k", k}});
  return {r[0], r[1]};
}

Var argmax(Var x, int axis, bool keepdims) {
  return UnaryOp("arg_max", x, {{"axis", static_cast<int64_t>(axis)}, {"keepdims", keepdims}});
}

Var accuracy(Var input, Var label, int k) {
  auto [values, indices] = topk(input, k);
  return accuracy_of_topk(values, indices, label);
}

Var accuracy_of_topk(Var values, Var indices, Var label) {
  return AppendWithOutputs(
      "accuracy",
      {{"Out", {values.name()}}, {"Indices", {indices.name()}}, {"Label", {label.name()}}},
      {{"Accuracy", 1}, {"Correct", 1}, {"Total", 1}})[0];
}

}  // namespace layers
}  // namespace keel
