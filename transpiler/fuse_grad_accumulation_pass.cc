#include "transpiler/fuse_grad_accumulation_pass.h"

#include <string>
#include <vector>

#include "framework/op/op_registry.h"
#include "transpiler/var_uses.h"

namespace keel {
namespace transpiler {
namespace {

// Whether `slot` of `op` writes `var` and nothing else.
bool WritesOnly(const OpDesc& op, const std::string& slot, const std::string& var) {
  const auto& args = op.Output(slot);
  return args.size() == 1 && args[0] == var;
}

}  // namespace

void FuseGradAccumulationPass::Apply(Program& main, Program& /*startup*/) const {
  fused_.clear();
  Block& block = main.global_block();
  // The merge step's sub-block reads and writes the buffers: that is expected. Only the gradients
  // themselves must not appear there.
  const VarUses uses(main);
  std::vector<size_t> sums;  // the sums to remove, in order
  std::vector<std::string> grads;
  for (size_t i = 0; i < block.num_ops(); ++i) {
    const OpDesc& sum = *block.op(i);
    if (sum.type() != "sum" || sum.Input("X").size() != 2 || sum.Output("Out").size() != 1)
      continue;
    const std::string& buffer = sum.Input("X")[0];
    const std::string& g = sum.Input("X")[1];
    const VarDesc* bv = block.FindVar(buffer);
    const VarDesc* gv = block.FindVar(g);
    if (sum.Output("Out")[0] != buffer || buffer != g + "@GRAD_MERGED" || bv == nullptr ||
        gv == nullptr || !bv->persistable() || gv->persistable() || gv->row_sparse() ||
        bv->dtype() != gv->dtype() || uses.InSubBlock(g) || uses.Readers(g).size() != 1)
      continue;
    const std::vector<VarUse>& w = uses.Writers(g);
    if (w.size() != 1) continue;
    OpDesc& writer = *block.op(w[0].op);
    const std::string slot = w[0].slot;
    if (w[0].op >= i || !OpRegistry::Traits(writer.type()).AccumulatesOutput(slot) ||
        !WritesOnly(writer, slot, g) || OpRegistry::KernelDType(writer, block) != gv->dtype())
      continue;
    writer.SetOutput(slot, {buffer});
    if (writer.HasAttr(kOpRoleVarAttr)) {  // the (parameter, gradient) pairs name the buffer
      auto pairs = writer.Attr<std::vector<std::string>>(kOpRoleVarAttr);
      for (std::string& v : pairs)
        if (v == g) v = buffer;
      writer.SetAttr(kOpRoleVarAttr, pairs);
    }
    auto slots = writer.HasAttr("accumulate_into")
                     ? writer.Attr<std::vector<std::string>>("accumulate_into")
                     : std::vector<std::string>{};
    slots.push_back(slot);
    writer.SetAttr("accumulate_into", slots);
    sums.push_back(i);
    grads.push_back(g);
    fused_.push_back(buffer);
  }
  for (size_t k = sums.size(); k-- > 0;) block.RemoveOp(sums[k]);
  for (const std::string& g : grads) block.RemoveVar(g);
}

}  // namespace transpiler
}  // namespace keel
