#include "framework/op/validate_program.h"

#include <variant>

#include "framework/op/op_registry.h"

namespace keel {
namespace {

void ValidateVar(const VarDesc& v, int block) {
  const auto& shape = v.shape();
  KEEL_ENFORCE(shape.size() <= static_cast<size_t>(DDim::kMaxRank), "variable '", v.name(),
               "' (block ", block, ") has rank ", shape.size(), ", keel supports at most ",
               DDim::kMaxRank);
  int64_t n = 1;
  for (int64_t d : shape) {
    KEEL_ENFORCE(d >= -1, "variable '", v.name(), "' (block ", block, ") has dim ", d,
                 " in its shape ", DDim(shape).str(), " (dims are >= 0, or -1 for unknown)");
    if (d >= 0)
      KEEL_ENFORCE(!__builtin_mul_overflow(n, d, &n), "variable '", v.name(), "' (block ", block,
                   ") has shape ", DDim(shape).str(), ", whose element count overflows int64");
  }
}

void ValidateSlots(const OpSchema& s, const OpDesc& op, const Block& block) {
  const std::string& type = op.type();
  for (const auto& kv : op.inputs())
    KEEL_ENFORCE(s.FindInput(kv.first) != nullptr, "op ", type, " has no input slot '", kv.first,
                 "'");
  for (const auto& kv : op.outputs())
    KEEL_ENFORCE(s.FindOutput(kv.first) != nullptr, "op ", type, " has no output slot '", kv.first,
                 "'");
  for (const auto& in : s.inputs()) {
    const auto& args = op.Input(in.name);
    KEEL_ENFORCE(in.dispensable || !args.empty(), "op ", type, ": input ", in.name, " is not set");
    KEEL_ENFORCE(in.duplicable || args.size() <= 1, "op ", type, ": input ", in.name,
                 " takes one variable, got ", args.size());
  }
  for (const auto& out : s.outputs()) {
    const auto& args = op.Output(out.name);
    KEEL_ENFORCE(out.dispensable || !args.empty(), "op ", type, ": output ", out.name,
                 " is not set");
    KEEL_ENFORCE(out.duplicable || args.size() <= 1, "op ", type, ": output ", out.name,
                 " takes one variable, got ", args.size());
  }
  // Row-sparse values only where a kernel reads their rows, and only from ops that write them.
  for (const auto& [slot, args] : op.inputs())
    for (const auto& a : args) {
      const VarDesc* v = a == kEmptyVarName ? nullptr : block.FindVarRecursive(a);
      KEEL_ENFORCE(v == nullptr || !v->row_sparse() || s.ReadsRowSparse(op, slot), "op ", type,
                   ": input ", slot, " reads '", a,
                   "', a row-sparse gradient (an embedding with is_sparse=true), but ", type,
                   " takes dense tensors only; use is_sparse=false for that embedding, or an "
                   "optimizer without this op (sgd, momentum and adam update rows; weight decay, "
                   "clipping, collectives and mixed precision need dense gradients)");
    }
  for (const auto& [slot, args] : op.outputs())
    for (const auto& a : args) {
      const VarDesc* v = a == kEmptyVarName ? nullptr : block.FindVarRecursive(a);
      KEEL_ENFORCE(v == nullptr || v->row_sparse() == s.WritesRowSparse(op, slot), "op ", type,
                   ": output ", slot, " writes '", a, "' as a ",
                   s.WritesRowSparse(op, slot) ? "row-sparse" : "dense", " tensor, but '", a,
                   "' is declared ", v->row_sparse() ? "row-sparse" : "dense");
    }
  for (const auto* names : {&op.inputs(), &op.outputs()})
    for (const auto& kv : *names)
      for (const auto& a : kv.second)
        KEEL_ENFORCE(a == kEmptyVarName || block.FindVarRecursive(a) != nullptr, "op ", type,
                     ": variable '", a, "' (slot ", kv.first, ") is not declared in block ",
                     block.idx(), " or its ancestors");
}

void ValidateAttrs(const OpSchema& s, const OpDesc& op, const Program& program,
                   const Block& block) {
  s.CheckNoUnknownAttrs(op);
  for (const auto& a : s.attrs()) {
    if (!op.HasAttr(a.name)) {
      KEEL_ENFORCE(!a.required, "op ", op.type(), ": required attribute '", a.name, "' is not set");
      continue;
    }
    const Attribute& v = op.GetAttr(a.name);
    KEEL_ENFORCE(v.index() == a.default_value.index(), "op ", op.type(), ": attribute '", a.name,
                 "' must be ", AttrTypeName(a.default_value), ", got ", AttrTypeName(v));
    if (a.check) {
      std::string err = a.check(v);
      KEEL_ENFORCE(err.empty(), "op ", op.type(), ": attribute ", a.name, "=", AttrToString(v),
                   ": ", err);
    }
  }
  for (const auto& kv : op.attrs()) {
    const BlockRef* ref = std::get_if<BlockRef>(&kv.second);
    if (!ref) continue;
    KEEL_ENFORCE(ref->idx > 0 && ref->idx < program.num_blocks(), "op ", op.type(), ": attribute ",
                 kv.first, " names block ", ref->idx, ", but the program has ", "blocks 0..",
                 program.num_blocks() - 1, " and block 0 is the main block");
    KEEL_ENFORCE(program.block(ref->idx).parent_idx() == block.idx(), "op ", op.type(),
                 " in block ", block.idx(), ": attribute ", kv.first, " names block ", ref->idx,
                 ", whose parent is block ", program.block(ref->idx).parent_idx(),
                 ": a sub-block must be a child of the block that runs it (no recursion)");
  }
}

}  // namespace

void ValidateProgram(const Program& program, const std::string& what) {
  for (int b = 0; b < program.num_blocks(); ++b) {
    const Block& block = program.block(b);
    try {
      for (const VarDesc* v : block.AllVars()) ValidateVar(*v, b);
    } catch (const Error& e) {
      KEEL_THROW(what, ": ", e.what());
    }
    for (size_t i = 0; i < block.num_ops(); ++i) {
      const OpDesc& op = *block.op(i);
      try {
        const OpSchema& s = OpRegistry::Get(op.type());
        ValidateSlots(s, op, block);
        ValidateAttrs(s, op, program, block);
      } catch (const Error& e) {
        KEEL_THROW(what, ": block ", b, " op #", i, ": ", e.what());
      }
    }
  }
}

}  // namespace keel
