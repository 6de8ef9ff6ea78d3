#include "transpiler/amp_weight_copy_pass.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "framework/op/op_registry.h"
#include "transpiler/var_uses.h"

namespace keel {
namespace transpiler {
namespace {

bool IsLow(DType t) { return t == DType::kBFloat16 || t == DType::kFloat16; }

bool Single(const std::vector<std::string>& args, const std::string& v) {
  return args.size() == 1 && args[0] == v;
}

// One weight's rewrite: its update, forward cast and gradient cast (global block indices).
struct Copy {
  size_t update, cast, cast_grad;
  std::string w, c, g, gc;
  std::vector<size_t> orders;  // ops that only order themselves after g's writer
};

// The rewrite of the update at `u`, when the header's conditions hold.
std::optional<Copy> Plan(const Block& block, const Block& sb, const VarUses& uses, size_t u) {
  const OpDesc& update = *block.op(u);
  const OpSchema* schema = OpRegistry::Find(update.type());
  if (schema == nullptr || schema->FindInput("MasterParam") == nullptr) return std::nullopt;
  if (!update.Input("MasterParam").empty() || update.Input("Param").size() != 1 ||
      update.Input("Grad").size() != 1)
    return std::nullopt;
  Copy p;
  p.update = u;
  p.w = update.Input("Param")[0];
  p.g = update.Input("Grad")[0];
  const VarDesc* w = block.FindVar(p.w);
  if (w == nullptr || !w->persistable() || w->dtype() != DType::kFloat32 ||
      !Single(update.Output("ParamOut"), p.w) || sb.FindVar(p.w) == nullptr)
    return std::nullopt;
  if (!OnlyBy(uses.Writers(p.w), 0, u)) return std::nullopt;
  // g: written by one cast_grad gc -> g before U (and rewritten in place by ops that only
  // order); read by U and those ops.
  auto only_orders = [&](const VarUse& at) {
    if (at.block != 0) return false;
    const OpDesc& op = *block.op(at.op);
    return OpRegistry::Traits(op.type()).only_orders && Single(op.Input("X"), p.g) &&
           Single(op.Output("Out"), p.g);
  };
  std::vector<VarUse> gw;
  for (const VarUse& wr : uses.Writers(p.g))
    if (!only_orders(wr)) gw.push_back(wr);
  if (gw.size() != 1 || gw[0].block != 0 || gw[0].op >= u) return std::nullopt;
  p.cast_grad = gw[0].op;
  const OpDesc& b = *block.op(p.cast_grad);
  if (b.type() != "cast_grad" || b.Input(GradVarName("Out")).size() != 1 ||
      !Single(b.Output(GradVarName("X")), p.g))
    return std::nullopt;
  p.gc = b.Input(GradVarName("Out"))[0];
  for (const VarUse& r : uses.Readers(p.g)) {
    if (r.Is(0, u)) continue;
    if (!only_orders(r)) return std::nullopt;
    p.orders.push_back(r.op);
  }
  // w: read by U, B (when it kept X for the dtype) and one forward cast w -> c.
  bool found_cast = false;
  for (const VarUse& r : uses.Readers(p.w)) {
    if (r.Is(0, u) || r.Is(0, p.cast_grad)) continue;  // B kept X for its dtype
    if (found_cast || r.block != 0) return std::nullopt;
    const OpDesc& op = *block.op(r.op);
    if (op.type() != "cast" || !Single(op.Input("X"), p.w) || op.Output("Out").size() != 1)
      return std::nullopt;
    p.cast = r.op;
    p.c = op.Output("Out")[0];
    found_cast = true;
  }
  if (!found_cast || p.cast >= u) return std::nullopt;
  const VarDesc* c = block.FindVar(p.c);
  const VarDesc* gc = block.FindVar(p.gc);
  if (c == nullptr || gc == nullptr || c->persistable() || !IsLow(c->dtype()) ||
      gc->dtype() != c->dtype() || sb.FindVar(p.c) != nullptr)
    return std::nullopt;
  if (!OnlyBy(uses.Writers(p.c), 0, p.cast)) return std::nullopt;
  for (const VarUse& r : uses.Readers(p.c))
    if (r.block != 0 || r.op <= p.cast || r.op >= u) return std::nullopt;
  // gc keeps, from B to U, the value B read: nothing writes it there, nor a fused buffer it is a
  // slice of (coalesce_tensor's FusedOutput: an all-reduce of the buffer writes its slices).
  std::vector<std::string> holders = {p.gc};
  const std::vector<std::string>& fused = uses.Buffers(p.gc);
  holders.insert(holders.end(), fused.begin(), fused.end());
  for (const std::string& h : holders)
    for (const VarUse& wr : uses.Writers(h))
      if (wr.block != 0 || (wr.op > p.cast_grad && wr.op < u)) return std::nullopt;
  return p;
}

}  // namespace

std::vector<WeightCopy> FindWeightCopies(const Program& main) {
  std::vector<WeightCopy> copies;
  const Block& block = main.global_block();
  for (size_t i = 0; i < block.num_ops(); ++i) {
    const OpDesc& op = *block.op(i);
    const std::vector<std::string>& master = op.Input("MasterParam");
    if (master.size() != 1 || op.Input("Param").size() != 1 || op.Input("Grad").size() != 1)
      continue;
    const VarDesc* w = block.FindVar(master[0]);
    if (w == nullptr || !w->is_parameter()) continue;  // O2's masters are not parameters
    copies.push_back({master[0], op.Input("Param")[0], op.Input("Grad")[0]});
  }
  return copies;
}

void RestoreWeightCasts(Program& program) {
  Block& block = program.global_block();
  for (const WeightCopy& wc : FindWeightCopies(program)) {
    VarDesc* c = block.MustFindVar(wc.copy);
    c->set_persistable(false);
    size_t first = block.num_ops();
    for (size_t i = 0; i < block.num_ops() && first == block.num_ops(); ++i) {
      const std::vector<std::string> in = block.op(i)->InputArgumentNames();
      if (std::find(in.begin(), in.end(), wc.copy) != in.end()) first = i;
    }
    OpDesc* cast = block.InsertOp(first, "cast");
    cast->SetInput("X", {wc.weight});
    cast->SetOutput("Out", {wc.copy});
    cast->SetAttr("in_dtype", static_cast<int>(DType::kFloat32));
    cast->SetAttr("out_dtype", static_cast<int>(c->dtype()));
    cast->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kForward));
  }
  program.Touch();
}

void AmpWeightCopyPass::Apply(Program& main, Program& startup) const {
  Block& block = main.global_block();
  Block& sb = startup.global_block();
  const VarUses uses(main);
  std::vector<Copy> copies;
  for (size_t i = 0; i < block.num_ops(); ++i)
    if (std::optional<Copy> p = Plan(block, sb, uses, i)) copies.push_back(std::move(*p));
  copied_.clear();
  std::vector<size_t> drop;
  for (const Copy& p : copies) {
    OpDesc* u = block.op(p.update);
    u->SetInput("Param", {p.c});
    u->SetOutput("ParamOut", {p.c});
    u->SetInput("Grad", {p.gc});
    u->SetInput("MasterParam", {p.w});
    u->SetOutput("MasterParamOut", {p.w});
    if (u->HasAttr(kOpRoleVarAttr)) u->SetAttr(kOpRoleVarAttr, std::vector<std::string>{p.c, p.gc});
    for (size_t k : p.orders) {
      block.op(k)->RenameInput(p.g, p.gc);
      block.op(k)->RenameOutput(p.g, p.gc);
    }
    drop.push_back(p.cast);
    drop.push_back(p.cast_grad);
    copied_.push_back(p.w);
  }
  std::sort(drop.begin(), drop.end());
  for (size_t k = drop.size(); k-- > 0;) block.RemoveOp(drop[k]);
  for (const Copy& p : copies) {
    block.RemoveVar(p.g);
    VarDesc* c = block.MustFindVar(p.c);
    c->set_persistable(true);
    c->set_stop_gradient(true);
    VarDesc* sc = sb.Var(p.c);
    sc->set_shape(c->shape());
    sc->set_dtype(c->dtype());
    sc->set_persistable(true);
    sc->set_stop_gradient(true);
    OpDesc* cast = sb.AppendOp("cast");
    cast->SetInput("X", {p.w});
    cast->SetOutput("Out", {p.c});
    cast->SetAttr("in_dtype", static_cast<int>(DType::kFloat32));
    cast->SetAttr("out_dtype", static_cast<int>(c->dtype()));
    cast->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kForward));
    InferShapeAtBuild(cast, &sb);
  }
  if (!copies.empty()) {
    main.Touch();
    startup.Touch();
  }
}

}  // namespace transpiler
}  // namespace keel
