// The seed MLP trains, and a checkpoint loads back bit-exactly and resumes identically.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "executor/executor_io.h"
#include "framework/dsl/layers.h"
#include "framework/io/checkpoint.h"
#include "models/model_zoo.h"
#include "tests/util/subprocess.h"

namespace keel {
namespace {

models::TrainableModel Mlp(uint64_t seed) {
  models::ModelConfig cfg;
  cfg.seed = seed;
  return models::BuildModel(cfg);
}

TEST(MlpTraining, CheckpointLoadsBitExactlyAndResumesIdentically) {
  std::string dir = testing::MakeTempDir();
  auto m = Mlp(11);
  Executor a;
  a.Run(*m.startup);
  FeedMap feed;
  for (int i = 0; i < 5; ++i) {
    m.next_batch(32, &feed);
    a.Run(*m.main, feed);
  }
  save_persistables(a, dir, *m.main);

  Executor b;
  b.Run(*m.startup);  // different init would be overwritten by the load
  load_persistables(b, dir, *m.main);
  for (VarDesc* v : m.main->global_block().AllVars()) {
    if (!v->persistable()) continue;
    const Tensor& ta = a.scope().FindVar(v->name())->tensor();
    const Tensor& tb = b.scope().FindVar(v->name())->tensor();
    ASSERT_EQ(ta.dims(), tb.dims()) << v->name();
    EXPECT_EQ(0, std::memcmp(ta.raw_data(), tb.raw_data(), ta.nbytes())) << v->name();
  }
  for (int i = 0; i < 5; ++i) {
    m.next_batch(32, &feed);
    float la = a.Run(*m.main, feed, {m.loss})[0].item<float>();
    float lb = b.Run(*m.main, feed, {m.loss})[0].item<float>();
    EXPECT_EQ(la, lb) << "step " << i;
  }
  testing::RunCommand("rm -rf " + dir);
}

TEST(MlpTraining, LoadIntoADifferentModelNamesVarAndShapes) {
  std::string dir = testing::MakeTempDir();
  auto m = Mlp(1);
  Executor a;
  a.Run(*m.startup);
  save_persistables(a, dir, *m.main);
  // Same names, other shapes: the first layer takes 16 features instead of 32.
  Program main, startup;
  {
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, 16});
    layers::fc(x, 1280);
  }
  Executor b;
  b.Run(startup);
  try {
    load_persistables(b, dir, main);
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("fc_0.w_0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[32, 1280]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[16, 1280]"), std::string::npos) << msg;
  }
  testing::RunCommand("rm -rf " + dir);
}

TEST(MlpTraining, InferenceModelPredictsLikeTheTrainedProgram) {
  std::string dir = testing::MakeTempDir();
  auto m = Mlp(5);
  Executor a;
  a.Run(*m.startup);
  FeedMap feed;
  for (int i = 0; i < 3; ++i) {
    m.next_batch(16, &feed);
    a.Run(*m.main, feed);
  }
  // The softmax output is the prediction.
  std::string pred;
  for (auto& op : m.main->global_block().ops())
    if (op->type() == "softmax") pred = op->Output("Out")[0];
  ASSERT_FALSE(pred.empty());
  save_inference_model(dir, {"x"}, {pred}, a, *m.main);
  Executor b;
  InferenceModel im = load_inference_model(dir, b);
  EXPECT_EQ(im.feeds, std::vector<std::string>{"x"});
  for (auto& op : im.program->global_block().ops()) EXPECT_NE(op->type(), "sgd");
  m.next_batch(16, &feed);
  FeedMap xin{{"x", feed["x"]}};
  Tensor pa = a.Run(*m.main, feed, {pred})[0];  // note: also takes one more training step after
  Tensor pb = b.Run(*im.program, xin, {pred})[0];
  ASSERT_EQ(pa.dims(), pb.dims());
  for (int64_t i = 0; i < pa.numel(); ++i) EXPECT_EQ(pa.data<float>()[i], pb.data<float>()[i]);
  testing::RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel
