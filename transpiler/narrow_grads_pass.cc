#include "transpiler/narrow_grads_pass.h"

#include <set>
#include <string>
#include <vector>

#include "framework/error.h"
#include "framework/op/op_registry.h"
#include "transpiler/var_uses.h"

namespace keel {
namespace transpiler {
namespace {

// Whether the header's conditions hold for gradient `g`.
bool Narrowable(const Block& block, const VarUses& uses, const std::string& g) {
  const VarDesc* v = block.FindVar(g);
  if (v == nullptr || v->dtype() != DType::kFloat32 || v->persistable() || v->row_sparse() ||
      uses.InSubBlock(g))
    return false;
  const std::vector<VarUse>& w = uses.Writers(g);
  if (w.size() != 1) return false;
  const OpDesc& writer = *block.op(w[0].op);
  if (!OpRegistry::Traits(writer.type()).NarrowsOutput(w[0].slot) ||
      OpRegistry::KernelDType(writer, block) != DType::kFloat32)
    return false;
  const std::vector<VarUse>& r = uses.Readers(g);
  if (r.empty()) return false;
  for (const VarUse& t : r)
    if (!OpRegistry::Traits(block.op(t.op)->type()).WidensInput(t.slot)) return false;
  return true;
}

}  // namespace

void NarrowGradsPass::Apply(Program& main, Program& /*startup*/) const {
  KEEL_ENFORCE(dtype_ == DType::kBFloat16,
               "narrow_grads: the gradients' dtype must be bfloat16, got ", DTypeName(dtype_),
               dtype_ == DType::kFloat16
                   ? " (fp16_allreduce in float16 divides each sum by the ranks in float32 after "
                     "the all-reduce, which needs the float32 gradient back: it keeps its casts)"
                   : "");
  narrowed_.clear();
  Block& block = main.global_block();
  const VarUses uses(main);
  std::set<std::string> seen;
  for (const auto& op : block.ops()) {
    if (!op->HasAttr(kOpRoleVarAttr)) continue;
    const auto& pairs = op->Attr<std::vector<std::string>>(kOpRoleVarAttr);
    for (size_t k = 1; k < pairs.size(); k += 2) {
      const std::string& g = pairs[k];
      if (!seen.insert(g).second || !Narrowable(block, uses, g)) continue;
      block.FindVar(g)->set_dtype(dtype_);
      narrowed_.push_back(g);
    }
  }
}

}  // namespace transpiler
}  // namespace keel
