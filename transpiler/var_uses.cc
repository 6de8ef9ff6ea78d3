#include "transpiler/var_uses.h"

#include "framework/op/op_registry.h"

namespace keel {
namespace transpiler {
namespace {

template <typename V>
const V& Find(const std::map<std::string, V>& m, const std::string& key) {
  static const V none;
  auto it = m.find(key);
  return it == m.end() ? none : it->second;
}

}  // namespace

VarUses::VarUses(const Program& program) {
  for (int b = 0; b < program.num_blocks(); ++b) {
    const Block& block = program.block(b);
    for (size_t i = 0; i < block.num_ops(); ++i) {
      const OpDesc& op = *block.op(i);
      for (const auto& [slot, args] : op.inputs())
        for (const std::string& v : args) readers_[v].push_back({b, i, slot});
      for (const auto& [slot, args] : op.outputs())
        for (const std::string& v : args) writers_[v].push_back({b, i, slot});
      const OpTraits& t = OpRegistry::Traits(op.type());
      if (t.slices_slot.empty()) continue;
      for (const std::string& slice : op.Output(t.slices_slot))
        for (const std::string& fused : op.Output(t.fused_slot)) buffers_[slice].push_back(fused);
    }
  }
}

const std::vector<VarUse>& VarUses::Readers(const std::string& var) const {
  return Find(readers_, var);
}

const std::vector<VarUse>& VarUses::Writers(const std::string& var) const {
  return Find(writers_, var);
}

bool VarUses::InSubBlock(const std::string& var) const {
  for (const auto* uses : {&Readers(var), &Writers(var)})
    for (const VarUse& u : *uses)
      if (u.block != 0) return true;
  return false;
}

const std::vector<std::string>& VarUses::Buffers(const std::string& var) const {
  return Find(buffers_, var);
}

bool OnlyBy(const std::vector<VarUse>& uses, int block, size_t op) {
  return uses.size() == 1 && uses[0].Is(block, op);
}

}  // namespace transpiler
}  // namespace keel
