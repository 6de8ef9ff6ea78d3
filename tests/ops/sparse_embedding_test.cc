// Row-sparse embedding gradients (layers::embedding(..., is_sparse=true)): the gradient holds the
// touched rows only, and sgd, momentum and adam give exactly the dense results with it; Adam's
// lazy_mode leaves untouched rows alone; ops that need dense gradients refuse it by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/autodiff/backward.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/dsl/tensor_layers.h"
#include "framework/error.h"
#include "framework/op/op_registry.h"
#include "tests/util/grad_checker.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using namespace optimizer;  // NOLINT
using testing::ErrorOf;
using testing::ExpectErrorContainsAll;
using testing::ToDouble;

constexpr int64_t kVocab = 20, kDim = 4, kBatch = 5, kSlots = 3;

struct Net {
  Program main, startup;
  std::string table, loss;
};

// ids [B, 3, 1] -> embedding [B, 3, 4] -> fc 2 -> softmax cross-entropy, the table optimized by
// `opt` (a fresh optimizer per net).
std::unique_ptr<Net> BuildNet(bool is_sparse, std::unique_ptr<Optimizer> opt,
                              const std::function<void(Optimizer&)>& configure = nullptr) {
  auto net = std::make_unique<Net>();
  net->startup.set_random_seed(11);
  ProgramGuard guard(net->main, net->startup);
  Var ids = layers::data("ids", {-1, kSlots, 1}, DType::kInt64);
  Var label = layers::data("label", {-1, 1}, DType::kInt64);
  Var emb = layers::embedding(ids, {kVocab, kDim}, -1, {}, DType::kFloat32, is_sparse);
  Var logits = layers::fc(emb, 2, "", /*num_flatten_dims=*/1);
  Var loss = layers::mean(layers::softmax_with_cross_entropy(logits, label));
  net->table = emb.block()->ops()[0]->Input("W")[0];
  net->loss = loss.name();
  if (configure) configure(*opt);
  opt->minimize(loss);
  return net;
}

// Batch k's ids: a few ids repeat inside a batch (their rows sum), most of the vocabulary is
// never touched in a given step.
FeedMap Batch(int k) {
  std::vector<int64_t> ids, labels;
  for (int b = 0; b < kBatch; ++b) {
    for (int s = 0; s < kSlots; ++s) ids.push_back((3 * k + 7 * b + 5 * s * s) % 9);
    labels.push_back((b + k) % 2);
  }
  return {{"ids", Tensor::FromVector<int64_t>(ids, {kBatch, kSlots, 1})},
          {"label", Tensor::FromVector<int64_t>(labels, {kBatch, 1})}};
}

// Every parameter after `steps` steps.
std::vector<std::vector<double>> Train(Net& net, int steps) {
  Executor exe;
  exe.Run(net.startup);
  for (int k = 0; k < steps; ++k) exe.Run(net.main, Batch(k));
  std::vector<std::vector<double>> params;
  for (const VarDesc* v : net.main.global_block().AllVars())
    if (v->is_parameter()) params.push_back(ToDouble(exe.scope().FindVar(v->name())->tensor()));
  return params;
}

TEST(SparseEmbedding, GradientHoldsEachTouchedRowOnceSummedInOrder) {
  auto sparse = BuildNet(true, std::make_unique<SGD>(0.1f));
  auto dense = BuildNet(false, std::make_unique<SGD>(0.1f));
  const VarDesc* g = sparse->main.global_block().FindVar(GradVarName(sparse->table));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->row_sparse());
  EXPECT_FALSE(dense->main.global_block().FindVar(GradVarName(dense->table))->row_sparse());
  EXPECT_NE(sparse->main.ToText().find("row_sparse"), std::string::npos);

  Executor es, ed;
  es.Run(sparse->startup);
  ed.Run(dense->startup);
  // Fetched, so that they outlive the step.
  es.Run(sparse->main, Batch(0), {GradVarName(sparse->table)});
  ed.Run(dense->main, Batch(0), {GradVarName(dense->table)});
  const Variable* sv = es.local_scope().FindVar(GradVarName(sparse->table));
  ASSERT_NE(sv, nullptr);
  ASSERT_TRUE(sv->is_row_sparse());
  EXPECT_EQ(sv->height(), kVocab);
  // The ids of batch 0, sorted and distinct.
  std::vector<int64_t> expect;
  for (int b = 0; b < kBatch; ++b)
    for (int s = 0; s < kSlots; ++s) expect.push_back((7 * b + 5 * s * s) % 9);
  std::sort(expect.begin(), expect.end());
  expect.erase(std::unique(expect.begin(), expect.end()), expect.end());
  EXPECT_EQ(sv->rows(), expect);
  ASSERT_EQ(sv->tensor().dims(), DDim({static_cast<int64_t>(expect.size()), kDim}));
  // Each row equals the dense gradient's row, bit for bit; the other dense rows are zeros.
  const std::vector<double> rows = ToDouble(sv->tensor());
  const std::vector<double> full =
      ToDouble(ed.local_scope().FindVar(GradVarName(dense->table))->tensor());
  for (int64_t r = 0; r < kVocab; ++r) {
    const auto at = std::find(expect.begin(), expect.end(), r);
    for (int64_t j = 0; j < kDim; ++j) {
      const double want = at == expect.end() ? 0.0 : rows[(at - expect.begin()) * kDim + j];
      EXPECT_EQ(full[r * kDim + j], want) << "row " << r << " column " << j;
    }
  }
}

// sgd, momentum and Adam (not lazy) see a row-sparse gradient as the dense one with zeros
// elsewhere: five steps give bit-identical parameters and accumulators.
TEST(SparseEmbedding, SgdMomentumAndAdamEqualTheDenseTableExactly) {
  const std::vector<std::pair<std::string, std::function<std::unique_ptr<Optimizer>()>>> opts = {
      {"sgd", [] { return std::make_unique<SGD>(0.1f); }},
      {"momentum", [] { return std::make_unique<Momentum>(0.1f, 0.9f); }},
      {"adam", [] { return std::make_unique<Adam>(0.05f); }},
  };
  for (const auto& [name, make] : opts) {
    auto sparse = BuildNet(true, make());
    auto dense = BuildNet(false, make());
    const auto ps = Train(*sparse, 5), pd = Train(*dense, 5);
    ASSERT_EQ(ps.size(), pd.size());
    for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(ps[i], pd[i]) << name << " parameter " << i;
    // The table moved (a test that cannot fail would not).
    Executor fresh;
    fresh.Run(sparse->startup);
    EXPECT_NE(ToDouble(fresh.scope().FindVar(sparse->table)->tensor()), ps[0]) << name;
  }
}

// Lazy Adam: a row no batch touched keeps its initial value and zero moments, whereas plain Adam
// moves rows touched earlier on every later step too. Touched rows follow Adam's rule.
TEST(SparseEmbedding, LazyAdamLeavesUntouchedRowsAlone) {
  auto lazy = BuildNet(true, std::make_unique<Adam>(0.05f, 0.9f, 0.999f, 1e-8f, true));
  auto eager = BuildNet(true, std::make_unique<Adam>(0.05f));
  Executor el, ee;
  el.Run(lazy->startup);
  ee.Run(eager->startup);
  const std::vector<double> init = ToDouble(el.scope().FindVar(lazy->table)->tensor());
  // Step 1 is the same for both (zero moments make an untouched row's Adam step zero), up to
  // rounding: lazy mode runs Adam's expression row by row, whose vector code may contract
  // multiply-adds differently from one pass over the table (-march=native builds do).
  el.Run(lazy->main, Batch(0));
  ee.Run(eager->main, Batch(0));
  {
    const std::vector<double> a = ToDouble(el.scope().FindVar(lazy->table)->tensor());
    const std::vector<double> b = ToDouble(ee.scope().FindVar(eager->table)->tensor());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << "element " << i;
  }
  // Step 2 with ids that avoid row 0 (touched in step 1) and rows >= 9 (never touched).
  FeedMap feed = Batch(0);
  std::vector<int64_t> ids(kBatch * kSlots, 4);
  feed["ids"] = Tensor::FromVector<int64_t>(ids, {kBatch, kSlots, 1});
  el.Run(lazy->main, feed);
  ee.Run(eager->main, feed);
  const std::vector<double> wl = ToDouble(el.scope().FindVar(lazy->table)->tensor());
  const std::vector<double> we = ToDouble(ee.scope().FindVar(eager->table)->tensor());
  const std::vector<double> after1 = [&] {
    Executor e;
    e.Run(lazy->startup);
    e.Run(lazy->main, Batch(0));
    return ToDouble(e.scope().FindVar(lazy->table)->tensor());
  }();
  for (int64_t j = 0; j < kDim; ++j) {
    EXPECT_EQ(wl[0 * kDim + j], after1[0 * kDim + j]) << "lazy: row 0 sat out step 2";
    EXPECT_NE(we[0 * kDim + j], after1[0 * kDim + j]) << "plain Adam: row 0's moment moved it";
    EXPECT_EQ(wl[15 * kDim + j], init[15 * kDim + j]) << "never touched";
    EXPECT_NEAR(wl[4 * kDim + j], we[4 * kDim + j], 1e-6) << "row 4 took both steps";
  }
  const std::string m1 = [&] {
    for (const VarDesc* v : lazy->main.global_block().AllVars())
      if (v->name().find(lazy->table) == 0 && v->name().find("moment1") != std::string::npos)
        return v->name();
    return std::string();
  }();
  ASSERT_FALSE(m1.empty());
  const std::vector<double> mom = ToDouble(el.scope().FindVar(m1)->tensor());
  for (int64_t j = 0; j < kDim; ++j) EXPECT_EQ(mom[15 * kDim + j], 0.0);
}

// Lazy Adam updates a row to the same bits wherever the row lies in the table: a parameter
// server's shard numbers a table's rows in the order they were created, not by id, and must end
// where one process's table ends. Rows of 10 floats (40 bytes) start at every alignment; the
// same values at rows 1 and 3 of one table and rows 2 and 0 of another must update alike.
TEST(SparseEmbedding, LazyAdamUpdatesARowAlikeAtAnyRowNumber) {
  constexpr int64_t kRows = 4, kWidth = 10;
  // Small parameters and a rate of 1: the step is most of the result, so its rounding shows.
  const Tensor p0 = testing::RandomTensor(DDim({kRows, kWidth}), DType::kFloat32, -1e-3, 1e-3, 1);
  const Tensor m10 = testing::RandomTensor(DDim({kRows, kWidth}), DType::kFloat32, -1, 1, 2);
  const Tensor m20 = testing::RandomTensor(DDim({kRows, kWidth}), DType::kFloat32, 0, 1, 3);
  const Tensor g = testing::RandomTensor(DDim({2, kWidth}), DType::kFloat32, -1, 1, 4);
  Tensor g_swapped(DType::kFloat32, g.dims());
  std::copy_n(g.data<float>() + kWidth, kWidth, g_swapped.data<float>());
  std::copy_n(g.data<float>(), kWidth, g_swapped.data<float>() + kWidth);
  // Runs lazy Adam with the gradient's rows at `rows`, the table's rows permuted by `from`
  // (row r of the table holds row from[r] of p0, m10, m20); returns the table.
  auto run = [&](const std::vector<int64_t>& rows, const std::vector<int64_t>& from,
                 const Tensor& grad) {
    Program prog;
    Block& b = prog.global_block();
    for (const char* n : {"p", "m1", "m2", "g"}) b.Var(n)->set_shape({kRows, kWidth});
    for (const char* n : {"lr", "b1p", "b2p"}) b.Var(n)->set_shape({1});
    for (const char* n : {"p", "m1", "m2", "g", "lr", "b1p", "b2p"})
      b.FindVar(n)->set_persistable(true);
    b.FindVar("g")->set_row_sparse(true);
    OpDesc* op = b.AppendOp("adam");
    op->SetInput("Param", {"p"});
    op->SetInput("Grad", {"g"});
    op->SetInput("Moment1", {"m1"});
    op->SetInput("Moment2", {"m2"});
    op->SetInput("LearningRate", {"lr"});
    op->SetInput("Beta1Pow", {"b1p"});
    op->SetInput("Beta2Pow", {"b2p"});
    op->SetOutput("ParamOut", {"p"});
    op->SetOutput("Moment1Out", {"m1"});
    op->SetOutput("Moment2Out", {"m2"});
    op->SetOutput("Beta1PowOut", {"b1p"});
    op->SetOutput("Beta2PowOut", {"b2p"});
    op->SetAttr("lazy_mode", true);
    OpRegistry::Get("adam").Complete(op);
    Executor exe;
    Scope& sc = exe.scope();
    auto permuted = [&](const Tensor& t) {
      Tensor out(DType::kFloat32, t.dims());
      for (int64_t r = 0; r < kRows; ++r)
        std::copy_n(t.data<float>() + from[r] * kWidth, kWidth, out.data<float>() + r * kWidth);
      return out;
    };
    *sc.Var("p")->mutable_tensor() = permuted(p0);
    *sc.Var("m1")->mutable_tensor() = permuted(m10);
    *sc.Var("m2")->mutable_tensor() = permuted(m20);
    *sc.Var("g")->mutable_tensor() = grad.Clone(CPUPlace());
    sc.Var("g")->SetRows(kRows, rows);
    *sc.Var("lr")->mutable_tensor() = Tensor::FromVector<float>({1.0f}, {1});
    *sc.Var("b1p")->mutable_tensor() = Tensor::FromVector<float>({0.9f}, {1});
    *sc.Var("b2p")->mutable_tensor() = Tensor::FromVector<float>({0.999f}, {1});
    exe.Run(prog);
    return ToDouble(sc.FindVar("p")->tensor());
  };
  // Table A: p0 as it is, gradient rows 1 and 3. Table B: p0's rows reversed, so p0's rows 1 and
  // 3 are at 2 and 0, and the gradient's rows (sorted ids) come swapped.
  const std::vector<double> a = run({1, 3}, {0, 1, 2, 3}, g);
  const std::vector<double> b = run({0, 2}, {3, 2, 1, 0}, g_swapped);
  for (int64_t j = 0; j < kWidth; ++j) {
    EXPECT_EQ(a[1 * kWidth + j], b[2 * kWidth + j]) << "row 1, column " << j;
    EXPECT_EQ(a[3 * kWidth + j], b[0 * kWidth + j]) << "row 3, column " << j;
    EXPECT_NE(a[1 * kWidth + j], static_cast<double>(p0.data<float>()[1 * kWidth + j]));
  }
}

// What cannot read a row-sparse gradient says so before the first step, naming the op and the
// variable, and trains nothing half-way.
TEST(SparseEmbedding, OpsThatNeedDenseGradientsRefuseItByName) {
  auto decay =
      BuildNet(true, std::make_unique<SGD>(0.1f), [](Optimizer& o) { o.set_weight_decay(0.01f); });
  auto clip =
      BuildNet(true, std::make_unique<SGD>(0.1f), [](Optimizer& o) { o.set_grad_clip({1.0f}); });
  for (Net* net : {decay.get(), clip.get()}) {
    Executor exe;
    exe.Run(net->startup);
    const std::vector<double> before = ToDouble(exe.scope().FindVar(net->table)->tensor());
    const std::string err = ErrorOf([&] { exe.Run(net->main, Batch(0)); });
    ExpectErrorContainsAll(err, {GradVarName(net->table), "row-sparse", "is_sparse=false"});
    EXPECT_EQ(ToDouble(exe.scope().FindVar(net->table)->tensor()), before);
  }
}

// Two lookups through one shared table (Paddle's Fluid CTR model looks each slot up apart): the
// parts' row-sparse sum gives the dense sum's training, bit for bit.
std::unique_ptr<Net> BuildSharedTableNet(bool is_sparse) {
  auto net = std::make_unique<Net>();
  net->startup.set_random_seed(11);
  ProgramGuard guard(net->main, net->startup);
  Var ids = layers::data("ids", {-1, kSlots, 1}, DType::kInt64);
  Var label = layers::data("label", {-1, 1}, DType::kInt64);
  std::vector<Var> slots = layers::split(ids, {1, kSlots - 1}, 1);
  Var a = layers::embedding(slots[0], {kVocab, kDim}, -1, ParamAttr("shared_table"),
                            DType::kFloat32, is_sparse);
  Var b = layers::embedding(slots[1], {kVocab, kDim}, -1, ParamAttr("shared_table"),
                            DType::kFloat32, is_sparse);
  Var x = layers::concat({layers::flatten(a, 1), layers::flatten(b, 1)}, 1);
  Var loss = layers::mean(layers::softmax_with_cross_entropy(layers::fc(x, 2), label));
  net->table = "shared_table";
  SGD(0.1f).minimize(loss);
  return net;
}

TEST(SparseEmbedding, LookupsSharingATableSumTheirRowsExactly) {
  auto sparse = BuildSharedTableNet(true), dense = BuildSharedTableNet(false);
  bool row_sparse_sum = false;
  for (const auto& op : sparse->main.global_block().ops())
    row_sparse_sum |= op->type() == "sum" && op->Attr<bool>("row_sparse");
  EXPECT_TRUE(row_sparse_sum) << sparse->main.ToText();
  const auto ps = Train(*sparse, 4), pd = Train(*dense, 4);
  ASSERT_EQ(ps.size(), pd.size());
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(ps[i], pd[i]) << "parameter " << i;
}

TEST(SparseEmbedding, AProgramMarkingADenseWriterRowSparseIsRefused) {
  auto net = BuildNet(false, std::make_unique<SGD>(0.1f));
  net->main.global_block().FindVar(GradVarName(net->table))->set_row_sparse(true);
  Executor exe;
  exe.Run(net->startup);
  ExpectErrorContainsAll(ErrorOf([&] { exe.Run(net->main, Batch(0)); }),
                         {"lookup_table_grad", "W@GRAD", "dense", "declared row-sparse"});
}

TEST(SparseEmbedding, RowSparseSurvivesTheProgramsProto) {
  auto net = BuildNet(true, std::make_unique<SGD>(0.1f));
  auto back = Program::ParseFromString(net->main.SerializeToString());
  EXPECT_TRUE(back->global_block().FindVar(GradVarName(net->table))->row_sparse());
  EXPECT_FALSE(back->global_block().FindVar(net->table)->row_sparse());
}

}  // namespace
}  // namespace keel
