// Who reads and who writes each var of a program: the index a pass builds before it decides what
// it may rewrite (a var with one writer, read only by ops that declare a trait, touched by no
// sub-block...).
//
// One entry per (op, slot, argument) that names the var, so a var an op reads through two slots
// counts twice, as the op's argument lists do. A snapshot of the program when built: a pass that
// changes ops builds it again before it asks again.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "framework/ir/program.h"

namespace keel {
namespace transpiler {

// Where an op touches a var: the op's block and index there, and the slot that names the var.
struct VarUse {
  int block;
  size_t op;
  std::string slot;
  // Whether this is op `op` of block `block`, whatever the slot.
  bool Is(int b, size_t i) const { return block == b && op == i; }
};

class VarUses {
 public:
  // Every block of `program`.
  explicit VarUses(const Program& program);

  // In program order, block by block; empty for a var nothing reads (writes).
  const std::vector<VarUse>& Readers(const std::string& var) const;
  const std::vector<VarUse>& Writers(const std::string& var) const;
  // Whether an op of a block other than the global block reads or writes `var`.
  bool InSubBlock(const std::string& var) const;
  // The fused buffers `var` is a slice of (OpTraits::slices_slot and fused_slot: the outputs of
  // coalesce_tensor), whose writers change `var` too.
  const std::vector<std::string>& Buffers(const std::string& var) const;

 private:
  std::map<std::string, std::vector<VarUse>> readers_, writers_;
  std::map<std::string, std::vector<std::string>> buffers_;
};

// Whether `uses` is exactly one use, by op `op` of block `block`.
bool OnlyBy(const std::vector<VarUse>& uses, int block, size_t op);

}  // namespace transpiler
}  // namespace keel
