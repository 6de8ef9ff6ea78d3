// The sparse-table ops of parameter-server training that run without a network
// (ops/ps_sparse_ops.cc): row_seeded_random's rows depend on (seed, row) alone;
// distributed_lookup_table_grad's row-sparse gradient is lookup_table_grad's (is_sparse) without
// the table; merge_sparse_grad adds row-sparse parts row by row in order, then scales.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/program_guard.h"
#include "framework/dsl/tensor_layers.h"
#include "framework/error.h"
#include "framework/op/op_registry.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;

VarDesc* Declare(Block& b, const std::string& name, const std::vector<int64_t>& dims, DType t,
                 bool persistable = false) {
  VarDesc* v = b.Var(name);
  v->set_shape(dims);
  v->set_dtype(t);
  v->set_persistable(persistable);
  return v;
}

OpDesc* Add(Block& b, const std::string& type, const OpDesc::VarMap& ins,
            const OpDesc::VarMap& outs, const std::map<std::string, Attribute>& attrs) {
  OpDesc* op = b.AppendOp(type);
  for (const auto& [slot, args] : ins) op->SetInput(slot, args);
  for (const auto& [slot, args] : outs) op->SetOutput(slot, args);
  for (const auto& [name, value] : attrs) op->SetAttr(name, value);
  OpRegistry::Get(type).Complete(op);
  return op;
}

std::vector<float> RowSeeded(int64_t rows, int64_t seed, int dist, float a, float b) {
  Program p;
  Block& blk = p.global_block();
  Declare(blk, "t", {rows, 4}, DType::kFloat32, true);
  Add(blk, "row_seeded_random", {}, {{"Out", {"t"}}},
      {{"shape", std::vector<int64_t>{rows, 4}},
       {"dist", dist},
       {"a", a},
       {"b", b},
       {"row_seed", seed}});
  Executor exe;
  exe.Run(p);
  const Tensor& t = exe.scope().FindVar("t")->tensor();
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(PsSparseOps, RowSeededRandomRowsDependOnSeedAndRowAlone) {
  const std::vector<float> big = RowSeeded(1000, 42, 0, -0.5f, 0.5f);
  const std::vector<float> small = RowSeeded(3, 42, 0, -0.5f, 0.5f);
  // Row r of a 3-row table is row r of a 1000-row one (so servers creating rows one by one hold
  // what one process initializes), and a different seed draws other rows.
  EXPECT_EQ(std::vector<float>(big.begin(), big.begin() + 12), small);
  EXPECT_NE(RowSeeded(3, 43, 0, -0.5f, 0.5f), small);
  double mean = 0;
  for (float v : big) {
    EXPECT_GE(v, -0.5f);
    EXPECT_LT(v, 0.5f);
    mean += v / big.size();
  }
  EXPECT_LT(std::abs(mean), 0.02);
  // Normal: mean a, std b (4000 draws); constant: a everywhere.
  const std::vector<float> normal = RowSeeded(1000, 7, 1, 1.0f, 2.0f);
  double m = 0, sq = 0;
  for (float v : normal) m += v / normal.size();
  for (float v : normal) sq += (v - m) * (v - m) / normal.size();
  EXPECT_NEAR(m, 1.0, 0.1);
  EXPECT_NEAR(std::sqrt(sq), 2.0, 0.1);
  for (float v : RowSeeded(5, 7, 2, 0.25f, 0)) EXPECT_EQ(v, 0.25f);
}

// ids with repeats and a padding id: the gradient's rows are the distinct ids (sorted), each the
// sum of its Out rows in the order of the ids, as lookup_table_grad with is_sparse gives them.
TEST(PsSparseOps, DistributedLookupTableGradIsTheRowSparseGradient) {
  const std::vector<int64_t> ids = {5, 2, 5, 9, 2, 0};  // 0 is padding_idx
  std::vector<float> dy(ids.size() * 3);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = 0.1f * static_cast<float>(i) - 0.7f;
  auto run = [&](bool distributed, std::vector<int64_t>* rows, int64_t height = 10) {
    Program main, startup;
    std::string grad;
    {
      ProgramGuard guard(main, startup);
      Var x = layers::data("ids", {-1, 1}, DType::kInt64);
      Var w = layers::embedding(x, {10, 3}, 0, {}, DType::kFloat32, true);
      grad = GradVarName(w.block()->ops()[0]->Input("W")[0]);
      (void)w;
    }
    Block& b = main.global_block();
    const std::string table = b.op(0)->Input("W")[0];
    Declare(b, "dy", {-1, 3}, DType::kFloat32);
    Declare(b, grad, {10, 3}, DType::kFloat32, true)->set_row_sparse(true);
    if (distributed) {
      Add(b, "distributed_lookup_table_grad", {{"Ids", {"ids"}}, {"OutGrad", {"dy"}}},
          {{"WGrad", {grad}}},
          {{"table", table}, {"height", height}, {"dim", int64_t{3}}, {"padding_idx", int64_t{0}}});
    } else {
      Add(b, "lookup_table_grad", {{"W", {table}}, {"Ids", {"ids"}}, {"Out@GRAD", {"dy"}}},
          {{"W@GRAD", {grad}}}, {{"padding_idx", int64_t{0}}, {"is_sparse", true}});
    }
    Executor exe;
    exe.Run(startup);
    const std::vector<Tensor> out = exe.Run(
        main, {{"ids", Tensor::FromVector(ids, {6, 1})}, {"dy", Tensor::FromVector(dy, {6, 3})}},
        {grad});
    *rows = exe.scope().FindVar(grad)->rows();
    return testing::ToDouble(out[0]);
  };
  std::vector<int64_t> rows_d, rows_s;
  const std::vector<double> d = run(true, &rows_d), s = run(false, &rows_s);
  EXPECT_EQ(d, s);
  EXPECT_EQ(rows_d, (std::vector<int64_t>{2, 5, 9}));
  EXPECT_EQ(rows_d, rows_s);
  // The distinct ids come from a bitmap of the table's rows when it is not much larger than the
  // batch, else from a sort: the same rows and sums either way.
  std::vector<int64_t> rows_big;
  EXPECT_EQ(run(true, &rows_big, int64_t{1} << 40), d);
  EXPECT_EQ(rows_big, rows_d);
  // Out of range: named with the op and the table.
  Program p;
  Block& b = p.global_block();
  Declare(b, "ids", {-1, 1}, DType::kInt64);
  Declare(b, "dy", {-1, 3}, DType::kFloat32);
  Declare(b, "g", {10, 3}, DType::kFloat32)->set_row_sparse(true);
  Add(b, "distributed_lookup_table_grad", {{"Ids", {"ids"}}, {"OutGrad", {"dy"}}},
      {{"WGrad", {"g"}}},
      {{"table", std::string("emb")}, {"height", int64_t{10}}, {"dim", int64_t{3}}});
  Executor exe;
  const std::string e = ErrorOf([&] {
    exe.Run(p, {{"ids", Tensor::FromVector<int64_t>({3, 12}, {2, 1})},
                {"dy", Tensor::FromVector<float>(std::vector<float>(6, 1.0f), {2, 3})}});
  });
  EXPECT_NE(e.find("distributed_lookup_table_grad of table emb: Ids[1] = 12 is outside [0, 10)"),
            std::string::npos)
      << e;
}

TEST(PsSparseOps, MergeSparseGradAddsRowsInOrderThenScales) {
  Program p;
  Block& b = p.global_block();
  for (const char* n : {"a", "b"})
    Declare(b, n, {6, 2}, DType::kFloat32, true)->set_row_sparse(true);
  Declare(b, "out", {6, 2}, DType::kFloat32, true)->set_row_sparse(true);
  Add(b, "merge_sparse_grad", {{"X", {"a", "b"}}}, {{"Out", {"out"}}}, {{"scale", 0.5f}});
  Executor exe;
  auto set = [&](const char* n, const std::vector<int64_t>& rows, const std::vector<float>& v) {
    Variable* var = exe.scope().Var(n);
    *var->mutable_tensor() = Tensor::FromVector(v, {static_cast<int64_t>(rows.size()), 2});
    var->SetRows(6, rows);
  };
  set("a", {1, 4}, {1, 2, 3, 4});
  set("b", {0, 4, 5}, {10, 20, 30, 40, 50, 60});
  const std::vector<Tensor> out = exe.Run(p, {}, {"out"});
  EXPECT_EQ(exe.scope().FindVar("out")->rows(), (std::vector<int64_t>{0, 1, 4, 5}));
  EXPECT_EQ(exe.scope().FindVar("out")->height(), 6);
  EXPECT_EQ(testing::ToDouble(out[0]), (std::vector<double>{5, 10, 0.5, 1, 16.5, 22, 25, 30}));
  // A dense part is refused by name.
  exe.scope().Var("b")->SetDense();
  const std::string e = ErrorOf([&] { exe.Run(p); });
  EXPECT_NE(e.find("merge_sparse_grad: X[1] ('b') holds a dense tensor"), std::string::npos) << e;
}

}  // namespace
}  // namespace keel
