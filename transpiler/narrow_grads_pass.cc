#include "transpiler/narrow_grads_pass.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "framework/error.h"
#include "framework/op/op_registry.h"

namespace keel {
namespace transpiler {
namespace {

// How an op of the global block touches a var: through which of its input or output slots.
struct Touch {
  size_t op;
  std::string slot;
};

// Every (op, slot) of the global block that reads, and that writes, each var; and the vars some
// op of another block touches.
struct Uses {
  std::map<std::string, std::vector<Touch>> reads, writes;
  std::set<std::string> elsewhere;
};

Uses Collect(const Program& program) {
  Uses u;
  const Block& block = program.global_block();
  for (size_t i = 0; i < block.num_ops(); ++i) {
    const OpDesc& op = *block.op(i);
    for (const auto& [slot, args] : op.inputs())
      for (const std::string& v : args) u.reads[v].push_back({i, slot});
    for (const auto& [slot, args] : op.outputs())
      for (const std::string& v : args) u.writes[v].push_back({i, slot});
  }
  for (int b = 1; b < program.num_blocks(); ++b)
    for (const auto& op : program.block(b).ops()) {
      for (const std::string& v : op->InputArgumentNames()) u.elsewhere.insert(v);
      for (const std::string& v : op->OutputArgumentNames()) u.elsewhere.insert(v);
    }
  return u;
}

// Whether the header's conditions hold for gradient `g`.
bool Narrowable(const Block& block, const Uses& uses, const std::string& g) {
  const VarDesc* v = block.FindVar(g);
  if (v == nullptr || v->dtype() != DType::kFloat32 || v->persistable() || v->row_sparse() ||
      uses.elsewhere.count(g))
    return false;
  auto w = uses.writes.find(g);
  if (w == uses.writes.end() || w->second.size() != 1) return false;
  const OpDesc& writer = *block.op(w->second[0].op);
  if (!OpRegistry::Traits(writer.type()).NarrowsOutput(w->second[0].slot) ||
      OpRegistry::KernelDType(writer, block) != DType::kFloat32)
    return false;
  auto r = uses.reads.find(g);
  if (r == uses.reads.end()) return false;
  for (const Touch& t : r->second)
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
  const Uses uses = Collect(main);
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
