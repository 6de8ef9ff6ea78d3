#include "transpiler/fuse_gemm_epilogue_pass.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "framework/op/op_registry.h"
#include "transpiler/var_uses.h"

namespace keel {
namespace transpiler {

namespace {

bool Single(const std::vector<std::string>& args) { return args.size() == 1; }

// True when an op of block b strictly between positions `from` and `to` reads (when `reads`) or
// writes one of `vars`.
bool TouchedBetween(const Block& block, size_t from, size_t to,
                    const std::vector<std::string>& vars, bool reads) {
  for (size_t i = from + 1; i < to; ++i) {
    const OpDesc& op = *block.op(i);
    for (const std::string& v : vars) {
      if (v == kEmptyVarName) continue;
      const auto outs = op.OutputArgumentNames();
      if (std::find(outs.begin(), outs.end(), v) != outs.end()) return true;
      if (!reads) continue;
      const auto ins = op.InputArgumentNames();
      if (std::find(ins.begin(), ins.end(), v) != ins.end()) return true;
    }
  }
  return false;
}

// One layer to fuse: its ops' positions in one block (grad and mul_grad: npos when absent).
struct Match {
  size_t mul, add, add_grad = std::string::npos, mul_grad = std::string::npos;
};

// The layer whose mul is op `i` of `block`, if it matches the header's pattern.
bool MatchLayer(const Block& block, int b, size_t i, const VarUses& uses, Match* m) {
  const OpDesc& mul = *block.op(i);
  if (mul.type() != "mul" || !Single(mul.Input("X")) || !Single(mul.Input("Y")) ||
      !Single(mul.Output("Out")) || mul.Attr<int>("y_num_col_dims") != 1)
    return false;
  const std::string& x = mul.Input("X")[0];
  const std::string& w = mul.Input("Y")[0];
  const std::string& t = mul.Output("Out")[0];
  const VarDesc* wv = block.FindVarRecursive(w);
  const VarDesc* tv = block.FindVarRecursive(t);
  if (!wv || !tv || wv->dims().size() != 2 || tv->persistable()) return false;
  if (uses.Writers(t).size() != 1) return false;
  const int xk = mul.Attr<int>("x_num_col_dims");
  m->mul = i;
  bool have_add = false;
  std::string b_name;
  for (const VarUse& u : uses.Readers(t)) {
    if (u.block != b) return false;
    const OpDesc& op = *block.op(u.op);
    if (op.type() == "elementwise_add" && !have_add) {
      if (u.op < i || !Single(op.Input("X")) || op.Input("X")[0] != t || !Single(op.Input("Y")) ||
          !Single(op.Output("Out")))
        return false;
      const VarDesc* bv = block.FindVarRecursive(op.Input("Y")[0]);
      const int axis = op.Attr<int>("axis");
      if (!bv || bv->dims().size() != 1 || bv->dims()[0] != wv->dims()[1] ||
          !(axis == xk || (axis == -1 && tv->dims().size() == xk + 1)))
        return false;
      b_name = op.Input("Y")[0];
      m->add = u.op;
      have_add = true;
    } else if (op.type() == "elementwise_add_grad" && m->add_grad == std::string::npos &&
               op.Input("X") == std::vector<std::string>{t}) {
      m->add_grad = u.op;
    } else if (op.type() == "mul_grad" && m->mul_grad == std::string::npos) {
      // One that adds into gradient merge's buffer (FuseGradAccumulationPass ran first) is left
      // whole: the fused op would take the add_grad's attributes and overwrite the buffer.
      if (op.HasAttr("accumulate_into") &&
          !op.Attr<std::vector<std::string>>("accumulate_into").empty())
        return false;
      m->mul_grad = u.op;
    } else {
      return false;  // another reader of the product
    }
  }
  if (!have_add || TouchedBetween(block, m->mul, m->add, {x, w}, false)) return false;
  if (m->add_grad == std::string::npos) return m->mul_grad == std::string::npos;
  // The backward pair: add_grad(X t, Y b) -> (X@GRAD gt), then mul_grad(Out@GRAD gt).
  const OpDesc& ag = *block.op(m->add_grad);
  if (ag.Input("Y") != std::vector<std::string>{b_name} || !Single(ag.Input(GradVarName("Out"))) ||
      !Single(ag.Output(GradVarName("X"))) || !Single(ag.Output(GradVarName("Y"))))
    return false;
  const std::string& gt = ag.Output(GradVarName("X"))[0];
  if (gt == kEmptyVarName) return m->mul_grad == std::string::npos;
  if (m->mul_grad == std::string::npos || m->mul_grad < m->add_grad) return false;
  const OpDesc& mg = *block.op(m->mul_grad);
  if (mg.Input("X") != std::vector<std::string>{x} ||
      mg.Input("Y") != std::vector<std::string>{w} ||
      mg.Input(GradVarName("Out")) != std::vector<std::string>{gt} ||
      mg.Attr<int>("x_num_col_dims") != xk || mg.Attr<int>("y_num_col_dims") != 1)
    return false;
  if (uses.Writers(gt).size() != 1 || uses.Readers(gt).size() != 1) return false;
  std::vector<std::string> outs = mg.OutputArgumentNames();
  if (TouchedBetween(block, m->add_grad, m->mul_grad, outs, true)) return false;
  return !TouchedBetween(block, m->add_grad, m->mul_grad, {x, w, ag.Input(GradVarName("Out"))[0]},
                         false);
}

// The elementwise op's attrs but its axis (op_role, op_role_var, op_device), then x_num_col_dims.
void CopyAttrs(const OpDesc& from, OpDesc* to, int xk) {
  for (const auto& [name, value] : from.attrs())
    if (name != "axis") to->SetAttr(name, value);
  to->SetAttr("x_num_col_dims", xk);
}

}  // namespace

void FuseGemmEpiloguePass::Apply(Program& main, Program& /*startup*/) const {
  for (int b = 0; b < main.num_blocks(); ++b) {
    Block& block = main.block(b);
    const VarUses uses(main);
    std::vector<Match> matches;
    for (size_t i = 0; i < block.num_ops(); ++i) {
      Match m;
      if (MatchLayer(block, b, i, uses, &m)) matches.push_back(m);
    }
    std::vector<size_t> removed;
    std::vector<std::string> dead_vars;
    for (const Match& m : matches) {
      const OpDesc& mul = *block.op(m.mul);
      const OpDesc& add = *block.op(m.add);
      const int xk = mul.Attr<int>("x_num_col_dims");
      const std::string x = mul.Input("X")[0], w = mul.Input("Y")[0], t = mul.Output("Out")[0];
      const std::string bias = add.Input("Y")[0], out = add.Output("Out")[0];
      auto fused = std::make_unique<OpDesc>("fused_gemm_epilogue");
      fused->SetInput("X", {x});
      fused->SetInput("Y", {w});
      fused->SetInput("Bias", {bias});
      fused->SetOutput("Out", {out});
      CopyAttrs(add, fused.get(), xk);
      std::unique_ptr<OpDesc> fused_grad;
      if (m.add_grad != std::string::npos) {
        const OpDesc& ag = *block.op(m.add_grad);
        const OpDesc* mg = m.mul_grad == std::string::npos ? nullptr : block.op(m.mul_grad);
        fused_grad = std::make_unique<OpDesc>("fused_gemm_epilogue_grad");
        fused_grad->SetInput("X", {x});
        fused_grad->SetInput("Y", {w});
        fused_grad->SetInput("Bias", {bias});
        fused_grad->SetInput("Out", {out});
        fused_grad->SetInput(GradVarName("Out"), ag.Input(GradVarName("Out")));
        for (const char* slot : {"X", "Y"})
          fused_grad->SetOutput(GradVarName(slot), mg ? mg->Output(GradVarName(slot))
                                                      : std::vector<std::string>{kEmptyVarName});
        fused_grad->SetOutput(GradVarName("Bias"), ag.Output(GradVarName("Y")));
        CopyAttrs(ag, fused_grad.get(), xk);
        std::vector<std::string> role_var;
        for (const OpDesc* op : {&ag, mg}) {
          if (!op || !op->HasAttr(kOpRoleVarAttr)) continue;
          const auto& v = op->Attr<std::vector<std::string>>(kOpRoleVarAttr);
          role_var.insert(role_var.end(), v.begin(), v.end());
        }
        if (role_var.empty())
          fused_grad->RemoveAttr(kOpRoleVarAttr);
        else
          fused_grad->SetAttr(kOpRoleVarAttr, role_var);
        const std::string gt = ag.Output(GradVarName("X"))[0];
        if (gt != kEmptyVarName) dead_vars.push_back(gt);
      }
      dead_vars.push_back(t);
      block.RemoveOp(m.add);
      InferShapeAtBuild(block.InsertOp(m.add, std::move(fused)), &block);
      if (fused_grad) {
        block.RemoveOp(m.add_grad);
        InferShapeAtBuild(block.InsertOp(m.add_grad, std::move(fused_grad)), &block);
      }
      removed.push_back(m.mul);
      if (m.mul_grad != std::string::npos) removed.push_back(m.mul_grad);
    }
    std::sort(removed.rbegin(), removed.rend());
    for (size_t i : removed) block.RemoveOp(i);
    for (const std::string& v : dead_vars)
      if (block.FindVar(v)) block.RemoveVar(v);
  }
}

}  // namespace transpiler
}  // namespace keel
