#include "transpiler/overflow_flag.h"

#include "framework/op/op_registry.h"

namespace keel {
namespace transpiler {

std::string OverflowFlagIntName(const std::string& found) { return found + "@ALLREDUCE_INT"; }

size_t InsertOverflowFlagMax(Block& b, size_t at, const std::string& found, int ring_id, int role,
                             bool local_false) {
  const std::string flag = OverflowFlagIntName(found);
  VarDesc* v = b.Var(flag);
  v->set_dtype(DType::kInt32);
  v->set_shape({1});
  VarDesc* f = b.Var(found);
  f->set_dtype(DType::kBool);
  f->set_shape({1});
  auto add = [&](const std::string& type) {
    OpDesc* op = b.InsertOp(at++, type);
    op->SetAttr(kOpRoleAttr, role);
    return op;
  };
  OpDesc* first;
  if (local_false) {
    first = add("fill_constant");
    first->SetAttr("shape", std::vector<int64_t>{1});
    first->SetAttr("dtype", static_cast<int>(DType::kInt32));
    first->SetAttr("value", 0.0f);
  } else {
    first = add("cast");
    first->SetInput("X", {found});
    first->SetAttr("in_dtype", static_cast<int>(DType::kBool));
    first->SetAttr("out_dtype", static_cast<int>(DType::kInt32));
  }
  first->SetOutput("Out", {flag});
  InferShapeAtBuild(first, &b);
  for (const char* type : {"c_sync_calc_stream", "c_allreduce_max", "c_sync_comm_stream"}) {
    OpDesc* op = add(type);
    op->SetInput("X", {flag});
    op->SetOutput("Out", {flag});
    op->SetAttr("ring_id", ring_id);
    InferShapeAtBuild(op, &b);
  }
  OpDesc* back = add("cast");
  back->SetInput("X", {flag});
  back->SetOutput("Out", {found});
  back->SetAttr("in_dtype", static_cast<int>(DType::kInt32));
  back->SetAttr("out_dtype", static_cast<int>(DType::kBool));
  InferShapeAtBuild(back, &b);
  return at;
}

}  // namespace transpiler
}  // namespace keel
