#include "transpiler/flat_buffer.h"

#include "framework/error.h"
#include "framework/op/op_registry.h"

namespace keel {
namespace transpiler {

namespace {

OpDesc* Insert(Block& b, size_t at, const std::string& type, const std::vector<std::string>& x,
               const std::vector<std::string>& out, int role) {
  OpDesc* op = b.InsertOp(at, type);
  op->SetInput("X", x);
  op->SetOutput("Out", out);
  op->SetAttr(kOpRoleAttr, role);
  return op;
}

}  // namespace

std::string FlatName(const std::string& var) { return var + "@FLAT"; }

size_t InsertFlatten(Block& b, size_t at, const std::string& var, int role) {
  const VarDesc* v = b.MustFindVar(var);
  KEEL_ENFORCE(v->dims().known(), "flat buffer: '", var, "' has shape ", v->dims().str(),
               "; only tensors of known shape go through a flat buffer");
  const int64_t n = v->dims().numel();
  VarDesc* f = b.Var(FlatName(var));
  f->set_dtype(v->dtype());
  f->set_shape({n});
  OpDesc* op = Insert(b, at, "reshape", {var}, {FlatName(var)}, role);
  op->SetAttr("shape", std::vector<int>{static_cast<int>(n)});
  InferShapeAtBuild(op, &b);
  return at + 1;
}

size_t InsertUnflatten(Block& b, size_t at, const std::string& var, int role) {
  const std::vector<int64_t>& dims = b.MustFindVar(var)->shape();
  OpDesc* op = Insert(b, at, "reshape", {FlatName(var)}, {var}, role);
  op->SetAttr("shape", std::vector<int>(dims.begin(), dims.end()));
  InferShapeAtBuild(op, &b);
  return at + 1;
}

size_t InsertConcatFlat(Block& b, size_t at, const std::vector<std::string>& parts,
                        const std::string& out, int role) {
  int64_t total = 0;
  for (const std::string& p : parts) total += b.MustFindVar(p)->dims().numel();
  VarDesc* v = b.Var(out);
  v->set_dtype(b.MustFindVar(parts.at(0))->dtype());
  v->set_shape({total});
  OpDesc* op = Insert(b, at, "concat", parts, {out}, role);
  op->SetAttr("axis", 0);
  InferShapeAtBuild(op, &b);
  return at + 1;
}

size_t InsertSplitFlat(Block& b, size_t at, const std::string& in,
                       const std::vector<std::string>& parts, const std::vector<int>& sizes,
                       int role) {
  OpDesc* op = Insert(b, at, "split", {in}, parts, role);
  op->SetAttr("sections", sizes);
  op->SetAttr("axis", 0);
  InferShapeAtBuild(op, &b);
  return at + 1;
}

}  // namespace transpiler
}  // namespace keel
