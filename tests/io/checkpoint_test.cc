// framework/io/checkpoint.h and prune.h: programs and persistables round-trip bit-exactly, loads
// write into the scope's existing tensors, a missing or mismatched var is an error that names it
// and writes or changes nothing; pruning keeps the forward slice of the targets, an export
// refuses targets that need more than the feeds, and an exported inference model round-trips and
// predicts in test mode (batch norm, dropout).
#include "framework/io/checkpoint.h"
#include "executor/executor_io.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/error.h"
#include "framework/io/atomic_file.h"
#include "framework/io/prune.h"
#include "framework/io/safetensors.h"
#include "tests/util/files.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using testing::MakeTensor;
using testing::TensorBytes;
using testing::WriteText;

class IoTest : public testing::TempDirTest {};

// b: f64[4], step: i64[1], w: f32[3,4] persistable (w declared last, so a bad w is found after
// the others validated); x, h temporaries.
std::unique_ptr<Program> CheckpointProgram(const std::vector<int64_t>& w_shape = {3, 4}) {
  auto p = std::make_unique<Program>();
  Block& b = p->global_block();
  VarDesc* x = b.Var("x");
  x->set_shape({-1, 3});
  x->set_is_data(true);
  VarDesc* bias = b.Var("b");
  bias->set_dtype(DType::kFloat64);
  bias->set_shape({4});
  bias->set_persistable(true);
  VarDesc* step = b.Var("step");
  step->set_dtype(DType::kInt64);
  step->set_shape({1});
  step->set_persistable(true);
  VarDesc* w = b.Var("w");
  w->set_shape(w_shape);
  w->set_persistable(true);
  w->set_is_parameter(true);
  b.Var("h")->set_shape({-1, 4});
  return p;
}

void FillCheckpointScope(Scope* scope, float base) {
  std::vector<float> w(12);
  for (int i = 0; i < 12; ++i) w[i] = base + i * 0.1f;
  *scope->Var("w")->mutable_tensor() = MakeTensor(DType::kFloat32, {3, 4}, w);
  *scope->Var("b")->mutable_tensor() =
      MakeTensor<double>(DType::kFloat64, {4}, {base, -0.0, 1e300, 3});
  *scope->Var("step")->mutable_tensor() =
      MakeTensor<int64_t>(DType::kInt64, {1}, {int64_t(base) + 7});
}

TEST_F(IoTest, ProgramRoundTrip) {
  auto p = CheckpointProgram();
  const std::string path = Path("__model__");
  SaveProgram(*p, path);
  EXPECT_EQ(LoadProgram(path)->ToText(), p->ToText());
  try {
    LoadProgram(Path("nope"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(Path("nope")), std::string::npos);
  }
  WriteText(Path("junk"), "\xff\xff\xff junk");
  try {
    LoadProgram(Path("junk"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(Path("junk")), std::string::npos);
  }
}

TEST_F(IoTest, PersistablesRoundTripBitExactly) {
  auto p = CheckpointProgram();
  Scope scope;
  FillCheckpointScope(&scope, 1.5f);
  const std::string dir = Path("ckpt/epoch_1");  // created on demand
  save_persistables(scope, dir, *p);

  std::map<std::string, std::string> meta;
  NamedTensors file = LoadSafetensors(dir + "/" + kPersistablesFile, &meta);
  EXPECT_EQ(meta.at("format"), "keel");
  EXPECT_EQ(meta.at("keel.version"), "2");
  EXPECT_EQ(file.size(), 3u);  // only persistables

  Scope loaded;
  load_persistables(loaded, dir, *p);
  for (const char* name : {"w", "b", "step"}) {
    SCOPED_TRACE(name);
    ASSERT_NE(loaded.FindVar(name), nullptr);
    const Tensor& got = loaded.FindVar(name)->tensor();
    const Tensor& want = scope.FindVar(name)->tensor();
    EXPECT_EQ(got.dtype(), want.dtype());
    EXPECT_EQ(got.dims(), want.dims());
    EXPECT_EQ(TensorBytes(got), TensorBytes(want));
  }
  EXPECT_EQ(loaded.FindVar("x"), nullptr);

  // Executor overloads go through exe.scope().
  Executor exe;
  load_persistables(exe, dir, *p);
  EXPECT_EQ(TensorBytes(exe.scope().FindVar("w")->tensor()),
            TensorBytes(scope.FindVar("w")->tensor()));
  save_persistables(exe, Path("ckpt2"), *p);
  EXPECT_EQ(ReadFile(Path("ckpt2/") + kPersistablesFile), ReadFile(dir + "/" + kPersistablesFile));
}

TEST_F(IoTest, LoadPersistablesWritesIntoExistingViews) {
  // A var that is a view into a fused buffer keeps its memory: the buffer sees the loaded values.
  auto p = CheckpointProgram();
  Scope src;
  FillCheckpointScope(&src, 2.f);
  save_persistables(src, dir_, *p);

  Scope dst;
  Tensor fused(DType::kFloat32, {32});
  std::memset(fused.raw_data(), 0, fused.nbytes());
  *dst.Var("w")->mutable_tensor() = fused.View({3, 4}, 8);
  load_persistables(dst, dir_, *p);
  EXPECT_EQ(dst.FindVar("w")->tensor().holder(), fused.holder());
  EXPECT_EQ(std::memcmp(fused.data<float>() + 8, src.FindVar("w")->tensor().raw_data(), 48), 0);
}

TEST_F(IoTest, SavePersistablesMissingVarWritesNothing) {
  auto p = CheckpointProgram();
  Scope scope;
  FillCheckpointScope(&scope, 0.f);
  scope.EraseVar("b");
  scope.Var("step")->mutable_tensor()->clear();
  const std::string dir = Path("ckpt");
  try {
    save_persistables(scope, dir, *p);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("b (not in scope)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step (uninitialized)"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(IoTest, LoadPersistablesMismatchNamesVarAndShapesAndChangesNothing) {
  auto p = CheckpointProgram();
  Scope scope;
  FillCheckpointScope(&scope, 1.f);
  save_persistables(scope, dir_, *p);
  const std::string file = dir_ + "/" + kPersistablesFile;

  // "b" and "step" (checked first) would load fine; "w" is declared transposed.
  auto other = CheckpointProgram({4, 3});
  Scope target;
  FillCheckpointScope(&target, 9.f);
  const std::string w_before = TensorBytes(target.FindVar("w")->tensor());
  const std::string b_before = TensorBytes(target.FindVar("b")->tensor());
  const std::string step_before = TensorBytes(target.FindVar("step")->tensor());
  try {
    load_persistables(target, dir_, *other);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 3]"), std::string::npos) << msg;
  }
  EXPECT_EQ(TensorBytes(target.FindVar("w")->tensor()), w_before);
  EXPECT_EQ(TensorBytes(target.FindVar("b")->tensor()), b_before);
  EXPECT_EQ(TensorBytes(target.FindVar("step")->tensor()), step_before);

  // A dtype mismatch and a var the file lacks are errors too; an extra var in the file is not.
  auto wrong_dtype = CheckpointProgram();
  wrong_dtype->global_block().Var("step")->set_dtype(DType::kInt32);
  EXPECT_THROW(load_persistables(target, dir_, *wrong_dtype), Error);
  auto needs_more = CheckpointProgram();
  needs_more->global_block().Var("moment")->set_persistable(true);
  try {
    load_persistables(target, dir_, *needs_more);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'moment'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
  EXPECT_EQ(TensorBytes(target.FindVar("b")->tensor()), b_before);
  auto fewer = CheckpointProgram();
  fewer->global_block().Var("step")->set_persistable(false);
  load_persistables(target, dir_, *fewer);
  EXPECT_EQ(TensorBytes(target.FindVar("w")->tensor()), TensorBytes(scope.FindVar("w")->tensor()));
  EXPECT_EQ(TensorBytes(target.FindVar("step")->tensor()), step_before);
}

// A var stored by rows (a parameter server's distributed table): only the rows given are in the
// file, with the rule the others start from. One process loading it gets the whole tensor (each
// row by the rule, then the stored rows); a loader that asks gets the rows back as stored; a bad
// set of rows is refused naming the var, and writes nothing.
TEST_F(IoTest, VarStoredByRowsLoadsWholeOrAsRows) {
  auto p = CheckpointProgram({5, 3});
  Scope scope;
  FillCheckpointScope(&scope, 1.f);
  scope.EraseVar("w");
  RowInitRule rule;
  rule.dist = RowInitRule::kUniform;
  rule.a = -0.25f;
  rule.b = 0.75f;
  rule.seed = 42;
  StoredRows rows;
  rows.init = rule;
  rows.ids = {1, 4};
  rows.values = MakeTensor<float>(DType::kFloat32, {2, 3}, {10, 11, 12, 40, 41, 42});
  TrainingState st;
  st.step = 3;
  save_checkpoint(scope, dir_, *p, st, {}, {{"w", rows}});
  std::map<std::string, std::string> meta;
  NamedTensors file = LoadSafetensors(dir_ + "/" + kPersistablesFile, &meta);
  EXPECT_EQ(meta.at("keel.rows.w"), "uniform -0.25 0.75 42");
  EXPECT_EQ(file.size(), 4u);  // b, step, w@ROWS.ids, w@ROWS.values

  // Whole: rows 0, 2, 3 from the rule (as op row_seeded_random draws them), 1 and 4 stored.
  Scope whole;
  ASSERT_EQ(load_checkpoint(whole, CPUPlace(), dir_, *p)->step, 3);
  const Tensor& w = whole.FindVar("w")->tensor();
  ASSERT_EQ(w.dims(), DDim({5, 3}));
  std::vector<float> want(15);
  for (int64_t r = 0; r < 5; ++r) RowInit(rule, r, 3, want.data() + r * 3);
  for (int j = 0; j < 3; ++j) {
    want[3 + j] = 10.f + j;
    want[12 + j] = 40.f + j;
  }
  EXPECT_EQ(std::vector<float>(w.data<float>(), w.data<float>() + 15), want);
  EXPECT_GE(want[0], -0.25f);
  EXPECT_LT(want[0], 0.75f);

  // As rows: what was stored, and nothing put in the scope for it.
  Scope server;
  RowsByVar asked = {{"w", {}}};
  load_checkpoint(server, CPUPlace(), dir_, *p, {}, &asked);
  EXPECT_EQ(server.FindVar("w"), nullptr);
  EXPECT_FALSE(asked.at("w").whole);
  EXPECT_EQ(asked.at("w").ids, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(asked.at("w").init, rule);
  EXPECT_EQ(TensorBytes(asked.at("w").values), TensorBytes(rows.values));
  // A file holding it whole gives every row, marked whole.
  Scope dense;
  FillCheckpointScope(&dense, 1.f);
  *dense.Var("w")->mutable_tensor() = w;
  save_checkpoint(dense, Path("dense"), *p, st);
  RowsByVar again = {{"w", {}}};
  load_checkpoint(server, CPUPlace(), Path("dense"), *p, {}, &again);
  EXPECT_TRUE(again.at("w").whole);
  EXPECT_EQ(again.at("w").ids, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(TensorBytes(again.at("w").values), TensorBytes(w));

  // Rows out of order, or values of another width: refused naming the var; nothing written.
  for (const auto& [ids, width] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{
           {{4, 1}, 3}, {{1, 5}, 3}, {{1, 4}, 2}}) {
    StoredRows bad = rows;
    bad.ids = ids;
    bad.values = Tensor(DType::kFloat32, DDim({2, width}));
    try {
      save_checkpoint(scope, Path("bad"), *p, st, {}, {{"w", bad}});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rows of 'w'"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(Path("bad")));
  }
  // A file whose rule cannot be read: an error naming the var and the file.
  std::map<std::string, std::string> broken = meta;
  broken["keel.rows.w"] = "uniform -0.25 zero 42";
  SaveSafetensors(Path("broken.safetensors"), file, broken);
  fs::create_directories(Path("broken"));
  fs::rename(Path("broken.safetensors"), Path("broken/") + kPersistablesFile);
  Scope none;
  try {
    load_checkpoint(none, CPUPlace(), Path("broken"), *p);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("var 'w' stored by rows"), std::string::npos) << e.what();
  }
  EXPECT_EQ(none.FindVar("b"), nullptr);
}

// ---------------------------------------------------------------- pruning and inference models

// y = relu(x * w + b); loss = mse(y, label); its backward and sgd ops; an unrelated branch.
std::unique_ptr<Program> TrainingProgram() {
  auto p = CheckpointProgram();
  Block& b = p->global_block();
  b.Var("label")->set_is_data(true);
  for (const char* n : {"y", "z", "loss", "loss@GRAD", "y@GRAD", "h@GRAD", "w@GRAD", "side"})
    b.Var(n);
  VarDesc* lr = b.Var("lr");
  lr->set_persistable(true);
  lr->set_shape({1});

  OpDesc* mul = b.AppendOp("mul");  // no op_role: forward
  mul->SetInput("X", {"x"});
  mul->SetInput("Y", {"w"});
  mul->SetOutput("Out", {"h"});
  OpDesc* add = b.AppendOp("elementwise_add");
  add->SetInput("X", {"h"});
  add->SetInput("Y", {"b"});
  add->SetOutput("Out", {"y"});
  add->SetAttr(kOpRoleAttr, 0);
  OpDesc* relu = b.AppendOp("relu");
  relu->SetInput("X", {"y"});
  relu->SetOutput("Out", {"z"});
  relu->SetAttr(kOpRoleAttr, 0);
  OpDesc* side = b.AppendOp("scale");  // forward but feeds no target
  side->SetInput("X", {"x"});
  side->SetOutput("Out", {"side"});
  OpDesc* loss = b.AppendOp("mse");
  loss->SetInput("X", {"z"});
  loss->SetInput("Label", {"label"});
  loss->SetOutput("Out", {"loss"});
  loss->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kForward) | static_cast<int>(OpRole::kLoss));
  OpDesc* fill = b.AppendOp("fill_constant");
  fill->SetOutput("Out", {"loss@GRAD"});
  fill->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kBackward) | static_cast<int>(OpRole::kLoss));
  // A backward op that (re)writes z: pruning must not keep it.
  OpDesc* grad = b.AppendOp("mse_grad");
  grad->SetInput("Out@GRAD", {"loss@GRAD"});
  grad->SetOutput("X@GRAD", {"z"});
  grad->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kBackward));
  OpDesc* sgd = b.AppendOp("sgd");
  sgd->SetInput("Param", {"w"});
  sgd->SetInput("Grad", {"w@GRAD"});
  sgd->SetInput("LearningRate", {"lr"});
  sgd->SetOutput("ParamOut", {"w"});
  sgd->SetAttr(kOpRoleAttr, static_cast<int>(OpRole::kOptimize));
  return p;
}

TEST_F(IoTest, PruneForInferenceKeepsTheForwardSliceOfTheTargets) {
  auto p = TrainingProgram();
  const std::string before = p->ToText();
  auto pruned = PruneForInference(*p, {"x"}, {"z"});
  EXPECT_EQ(p->ToText(), before);  // the input is untouched
  testing::ExpectGolden(pruned->ToText(), "io_prune_for_inference.txt");

  std::vector<std::string> types;
  for (const auto& op : pruned->global_block().ops()) types.push_back(op->type());
  EXPECT_EQ(types, (std::vector<std::string>{"mul", "elementwise_add", "relu"}));
  std::vector<std::string> vars;
  for (const VarDesc* v : pruned->global_block().AllVars()) vars.push_back(v->name());
  EXPECT_EQ(vars, (std::vector<std::string>{"x", "b", "w", "h", "y", "z"}));

  // Feeding an intermediate stops the walk there.
  auto from_h = PruneForInference(*p, {"h"}, {"z"});
  types.clear();
  for (const auto& op : from_h->global_block().ops()) types.push_back(op->type());
  EXPECT_EQ(types, (std::vector<std::string>{"elementwise_add", "relu"}));
  EXPECT_EQ(from_h->global_block().FindVar("w"), nullptr);

  try {
    PruneForInference(*p, {"x"}, {"nope"});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos) << e.what();
  }
  try {
    PruneForInference(*p, {"nofeed"}, {"z"});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nofeed'"), std::string::npos) << e.what();
  }
}

TEST_F(IoTest, SaveInferenceModelRefusesTargetsThatNeedMoreThanTheFeeds) {
  auto p = TrainingProgram();
  Executor exe;
  FillCheckpointScope(&exe.scope(), 4.f);
  *exe.scope().Var("lr")->mutable_tensor() = MakeTensor<float>(DType::kFloat32, {1}, {0.1f});
  // The loss needs the label, which is not fed; z needs x, and no feed is given at all.
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"x"}, "loss"}, {{}, "z"}, {{"label"}, "loss"}};
  for (const auto& [feeds, target] : cases) {
    SCOPED_TRACE(target);
    const std::string dir = Path("refused_" + target + std::to_string(feeds.size()));
    try {
      save_inference_model(dir, feeds, {target}, exe, *p);
      ADD_FAILURE() << "saved an inference model that cannot run on its feeds";
    } catch (const Error& e) {
      const std::string what = e.what();
      const std::string need = feeds.empty() ? "'x'" : feeds[0] == "x" ? "'label'" : "'x'";
      EXPECT_NE(what.find("need " + need), std::string::npos) << what;
      EXPECT_NE(what.find("'" + target + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("nothing was written"), std::string::npos) << what;
    }
    EXPECT_FALSE(fs::exists(dir)) << dir;
  }
  // Feeding what the target needs is fine.
  EXPECT_NO_THROW(save_inference_model(Path("ok"), {"x", "label"}, {"loss"}, exe, *p));
}

// A net with batch norm and dropout, trained a few steps: the exported model predicts what the
// test-mode program predicts, and one sample alone gets the prediction it gets in a batch.
TEST_F(IoTest, InferenceModelsRunBatchNormAndDropoutInTestMode) {
  Program main, startup;
  startup.set_random_seed(3);
  main.set_random_seed(3);
  Var x, label, prob, loss;
  {
    ProgramGuard g(main, startup);
    x = layers::data("x", {-1, 6});
    label = layers::data("label", {-1, 1}, DType::kInt64);
    Var h = layers::batch_norm(layers::fc(x, 16), "relu");
    h = layers::dropout(h, 0.5f);
    prob = layers::fc(h, 3, "softmax");
    loss = layers::mean(layers::cross_entropy(prob, label));
    optimizer::SGD(0.1f).minimize(loss);
  }
  std::unique_ptr<Program> test = main.clone_for_test();
  auto batch = [](int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-2, 2);
    Tensor xs(DType::kFloat32, {n, 6}), ys(DType::kInt64, {n, 1});
    for (int64_t i = 0; i < n; ++i) {
      for (int j = 0; j < 6; ++j) xs.data<float>()[i * 6 + j] = u(rng) + (j == 0 ? 1.f : 0.f);
      ys.data<int64_t>()[i] = static_cast<int64_t>(rng() % 3);
    }
    return FeedMap{{"x", xs}, {"label", ys}};
  };
  Executor exe;
  exe.Run(startup);
  for (int step = 0; step < 20; ++step) exe.Run(main, batch(32, 100 + step));
  const FeedMap eval = batch(50, 7);
  const std::vector<double> want = testing::ToDouble(exe.Run(*test, eval, {prob.name()})[0]);

  const std::string dir = Path("bn_dropout");
  save_inference_model(dir, {"x"}, {prob.name()}, exe, main);
  Executor exe2;
  InferenceModel m = load_inference_model(dir, exe2);
  for (const auto& op : m.program->global_block().ops()) {
    if (op->HasAttr("is_test")) {
      EXPECT_TRUE(op->Attr<bool>("is_test")) << op->type();
    }
  }
  const std::vector<double> got =
      testing::ToDouble(exe2.Run(*m.program, {{"x", eval.at("x")}}, m.targets)[0]);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << i;
  for (int64_t row : {0, 17, 49}) {
    SCOPED_TRACE(row);
    Tensor one(DType::kFloat32, {1, 6});
    std::memcpy(one.data<float>(), eval.at("x").data<float>() + row * 6, 6 * sizeof(float));
    const std::vector<double> alone =
        testing::ToDouble(exe2.Run(*m.program, {{"x", one}}, m.targets)[0]);
    ASSERT_EQ(alone.size(), 3u);
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(alone[k], want[row * 3 + k], 1e-6);
  }
}

TEST_F(IoTest, InferenceModelRoundTrip) {
  auto p = TrainingProgram();
  Executor exe;
  FillCheckpointScope(&exe.scope(), 4.f);
  *exe.scope().Var("lr")->mutable_tensor() = MakeTensor<float>(DType::kFloat32, {1}, {0.1f});
  const std::string dir = Path("infer");
  save_inference_model(dir, {"x"}, {"z"}, exe, *p);

  // Only what the pruned program uses: the optimizer's lr and the step counter are left out.
  std::map<std::string, std::string> meta;
  NamedTensors params = LoadSafetensors(dir + "/" + kParamsFile, &meta);
  std::vector<std::string> names;
  for (const auto& nt : params) names.push_back(nt.first);
  EXPECT_EQ(names, (std::vector<std::string>{"b", "w"}));
  EXPECT_EQ(meta.at("keel.feeds"), "x");
  EXPECT_EQ(meta.at("keel.targets"), "z");

  Executor exe2;
  InferenceModel m = load_inference_model(dir, exe2);
  EXPECT_EQ(m.program->ToText(), PruneForInference(*p, {"x"}, {"z"})->ToText());
  EXPECT_EQ(m.feeds, std::vector<std::string>{"x"});
  EXPECT_EQ(m.targets, std::vector<std::string>{"z"});
  for (const char* name : {"w", "b"}) {
    SCOPED_TRACE(name);
    ASSERT_NE(exe2.scope().FindVar(name), nullptr);
    EXPECT_EQ(TensorBytes(exe2.scope().FindVar(name)->tensor()),
              TensorBytes(exe.scope().FindVar(name)->tensor()));
  }
  EXPECT_EQ(exe2.scope().FindVar("lr"), nullptr);

  try {
    load_inference_model(Path("nowhere"), exe2);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(Path("nowhere")), std::string::npos) << e.what();
  }
}
}  // namespace
}  // namespace keel
