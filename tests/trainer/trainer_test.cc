// keel::Trainer on one worker: the callbacks' order, a stop from a callback, a run stopped and
// resumed that ends with the uninterrupted run's bits, evaluation of a loaded checkpoint, a
// model's own evaluate function, and options and models refused naming the field.
#include "trainer/trainer.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fleet/fleet.h"
#include "framework/io/checkpoint.h"
#include "tests/trainer/tiny_model.h"
#include "tests/util/files.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

// Writes down every callback as a line.
struct Recorder : Callback {
  std::vector<std::string> events;
  std::map<int64_t, float> losses;
  int64_t stop_at = -1;

  void on_train_begin(Trainer&, const FitInfo& i) override {
    events.push_back("begin " + std::to_string(i.start_step) + "/" + std::to_string(i.total_steps) +
                     " per_epoch " + std::to_string(i.steps_per_epoch) + " epochs " +
                     std::to_string(i.epochs));
  }
  void on_step_end(Trainer& t, const StepInfo& s) override {
    events.push_back("step " + std::to_string(s.step) + " epoch " + std::to_string(s.epoch) +
                     (s.loss ? " loss" : ""));
    if (s.loss) losses[s.step] = *s.loss;
    EXPECT_GE(s.step_ms, 0);
    if (s.step == stop_at) t.stop();
  }
  void on_eval_end(Trainer&, const EvalResult& e) override {
    events.push_back("eval " + std::to_string(e.step) + " epoch " + std::to_string(e.epoch));
  }
  void on_save(Trainer&, const SaveInfo& s) override {
    events.push_back("save " + std::to_string(s.step) + (s.final ? " final" : ""));
  }
  void on_train_end(Trainer&, const TrainResult& r) override {
    events.push_back("end " + std::to_string(r.steps_done) + (r.stopped ? " stopped" : ""));
  }
};

class TrainerTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    fleet::reset();
    fleet::init(fleet::UserDefinedRoleMaker(0, 1));
  }
  TrainerOptions Quiet() const {
    TrainerOptions o;
    o.progress = "none";
    return o;
  }
};

TEST_F(TrainerTest, CallbacksRunInOrder) {
  auto t = MakeTinyModel();  // 32 rows in batches of 8: 4 steps an epoch
  TrainerOptions o = Quiet();
  o.epochs = 2;
  o.fetch_frequency = 2;
  o.save_dir = Path("ckpt");
  o.save_every = 4;
  Trainer trainer(o);
  auto rec = std::make_shared<Recorder>();
  trainer.add_callback(rec);
  TrainResult r = trainer.fit(t->model);
  const std::vector<std::string> want = {
      "begin 0/8 per_epoch 4 epochs 2",
      "step 0 epoch 0 loss",
      "step 1 epoch 0",
      "step 2 epoch 0 loss",
      "step 3 epoch 0",
      "save 4",
      "eval 3 epoch 0",
      "step 4 epoch 1 loss",
      "step 5 epoch 1",
      "step 6 epoch 1 loss",
      "step 7 epoch 1",
      "save 8",
      "eval 7 epoch 1",
      "save 8 final",
      "end 8",
  };
  EXPECT_EQ(rec->events, want);
  EXPECT_EQ(r.steps_done, 8);
  EXPECT_FALSE(r.stopped);
  ASSERT_TRUE(r.last_loss.has_value());
  EXPECT_EQ(*r.last_loss, rec->losses[6]);
  ASSERT_TRUE(r.last_eval.has_value());
  EXPECT_EQ(r.last_eval->samples, 20);
  EXPECT_GE(r.last_eval->metric("accuracy"), 0.0);
  EXPECT_LE(r.last_eval->metric("accuracy"), 1.0);
  EXPECT_GT(r.last_eval->metric("loss"), 0.0);
  EXPECT_THROW(r.last_eval->metric("recall"), Error);
  std::optional<TrainingState> st = ReadTrainingState(Path("ckpt"));
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->step, 8);
  EXPECT_EQ(st->seed, 3u);  // the program's random seed, the options giving none
}

TEST_F(TrainerTest, ACallbackStopsTrainingAfterItsStep) {
  auto t = MakeTinyModel();
  TrainerOptions o = Quiet();
  o.steps = 20;
  o.save_dir = Path("ckpt");
  Trainer trainer(o);
  auto rec = std::make_shared<Recorder>();
  rec->stop_at = 6;
  trainer.add_callback(rec);
  TrainResult r = trainer.fit(t->model);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.steps_done, 7);
  ASSERT_GE(rec->events.size(), 3u);
  EXPECT_EQ(rec->events[rec->events.size() - 3], "step 6 epoch 1 loss");
  EXPECT_EQ(rec->events[rec->events.size() - 2], "save 7 final");
  EXPECT_EQ(rec->events.back(), "end 7 stopped");
  std::optional<TrainingState> st = ReadTrainingState(Path("ckpt"));
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->step, 7);
}

// A run stopped mid-epoch and resumed from its checkpoint (data position, optimizer state and
// dropout's draws) prints the losses and ends with the parameters of a run never stopped.
TEST_F(TrainerTest, AResumedRunEndsWithTheUninterruptedRunsBits) {
  TrainerOptions o = Quiet();
  o.epochs = 3;
  o.save_every = 4;
  auto straight_model = MakeTinyModel();
  o.save_dir = Path("straight");
  Trainer straight(o);
  auto all = std::make_shared<Recorder>();
  straight.add_callback(all);
  ASSERT_EQ(straight.fit(straight_model->model).steps_done, 12);

  o.save_dir = Path("resumed");
  auto first_model = MakeTinyModel();
  Trainer first(o);
  auto stopper = std::make_shared<Recorder>();
  stopper->stop_at = 5;  // 6 steps done: epoch 1, two batches into it
  first.add_callback(stopper);
  ASSERT_EQ(first.fit(first_model->model).steps_done, 6);

  o.auto_resume = true;
  auto again_model = MakeTinyModel();
  Trainer again(o);
  EXPECT_EQ(again.resume_step(), 6);
  auto rest = std::make_shared<Recorder>();
  again.add_callback(rest);
  TrainResult r = again.fit(again_model->model);
  EXPECT_EQ(r.start_step, 6);
  EXPECT_EQ(r.steps_done, 12);
  ASSERT_GE(rest->events.size(), 2u);
  EXPECT_EQ(rest->events[0], "begin 6/12 per_epoch 4 epochs 3");
  EXPECT_EQ(rest->events[1], "step 6 epoch 1 loss");
  for (int64_t s = 6; s < 12; ++s) EXPECT_EQ(rest->losses[s], all->losses[s]) << "step " << s;
  EXPECT_EQ(CheckpointTensorBytes(Path("resumed")), CheckpointTensorBytes(Path("straight")));
}

TEST_F(TrainerTest, EvaluateBeforeFitEvaluatesTheCheckpointItLoads) {
  TrainerOptions o = Quiet();
  o.epochs = 2;
  o.save_dir = Path("ckpt");
  auto trained = MakeTinyModel();
  Trainer a(o);
  TrainResult r = a.fit(trained->model);
  ASSERT_TRUE(r.last_eval.has_value());

  TrainerOptions lo = Quiet();
  lo.load_dir = Path("ckpt");
  auto loaded = MakeTinyModel();
  Trainer b(lo);
  auto rec = std::make_shared<Recorder>();
  b.add_callback(rec);
  EvalResult e = b.evaluate(loaded->model);
  EXPECT_EQ(e.metrics, r.last_eval->metrics);
  EXPECT_EQ(e.samples, 20);
  EXPECT_EQ(e.step, 7);  // the checkpoint's 8 steps
  EXPECT_EQ(rec->events, std::vector<std::string>{"eval 7 epoch -1"});

  auto fresh = MakeTinyModel();
  Trainer c(Quiet());
  EXPECT_NE(c.evaluate(fresh->model).metric("loss"), r.last_eval->metric("loss"));
}

TEST_F(TrainerTest, AModelsOwnEvaluateRunsAtEvalEveryAndTheLastStep) {
  auto t = MakeTinyModel();
  t->model.eval_data = nullptr;
  t->model.metrics.clear();
  std::vector<int64_t> calls;
  t->model.evaluate = [&](Executor& exe) {
    EvalResult e;
    e.metrics = {{"calls", static_cast<double>(calls.size())}};
    calls.push_back(0);
    return e;
  };
  TrainerOptions o = Quiet();
  o.steps = 7;
  o.eval_every = 3;
  Trainer trainer(o);
  auto rec = std::make_shared<Recorder>();
  trainer.add_callback(rec);
  TrainResult r = trainer.fit(t->model);
  EXPECT_EQ(calls.size(), 3u);
  std::vector<std::string> evals;
  for (const std::string& e : rec->events)
    if (e.rfind("eval", 0) == 0) evals.push_back(e);
  EXPECT_EQ(evals,
            (std::vector<std::string>{"eval 2 epoch -1", "eval 5 epoch -1", "eval 6 epoch -1"}));
  EXPECT_EQ(r.last_eval->metric("calls"), 2.0);
}

// Options out of range are refused when the Trainer is made, models when fit is called; the
// message names the option or field (with the prefix a CLI chooses for its flags).
TEST_F(TrainerTest, BadOptionsAreRefusedNamingTheOption) {
  struct Case {
    std::function<void(TrainerOptions&)> set;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](TrainerOptions& o) { o.steps = -1; }, "TrainerOptions::steps must be >= 0, got -1"},
      {[](TrainerOptions& o) { o.epochs = -2; }, "TrainerOptions::epochs must be >= 0"},
      {[](TrainerOptions& o) { o.fetch_frequency = 0; },
       "TrainerOptions::fetch_frequency must be positive"},
      {[](TrainerOptions& o) { o.eval_every = -1; }, "TrainerOptions::eval_every must be >= 0"},
      {[](TrainerOptions& o) { o.stop_check_every = -1; },
       "TrainerOptions::stop_check_every must be >= 0"},
      {[](TrainerOptions& o) { o.save_every = 5; },
       "TrainerOptions::save_every=5 needs TrainerOptions::save_dir"},
      {[](TrainerOptions& o) { o.auto_resume = true; },
       "TrainerOptions::auto_resume needs TrainerOptions::save_dir"},
      {[](TrainerOptions& o) { o.progress = "fancy"; }, "TrainerOptions::progress='fancy'"},
      {[](TrainerOptions& o) { o.logdir_all_ranks = true; },
       "TrainerOptions::logdir_all_ranks needs TrainerOptions::logdir"},
      {[](TrainerOptions& o) { o.logdir = "/proc/keel_no/tb"; },
       "TrainerOptions::logdir=/proc/keel_no/tb"},
      {[](TrainerOptions& o) { o.load_dir = "/nonexistent/keel"; },
       "TrainerOptions::load_dir=/nonexistent/keel: no persistables.safetensors"},
      {[](TrainerOptions& o) { o.exec_strategy.num_iteration_per_drop_scope = 0; },
       "TrainerOptions::exec_strategy"},
      {[](TrainerOptions& o) {
         o.save_every = 5;
         o.option_prefix = "--";
       },
       "--save_every=5 needs --save_dir"},
  };
  for (const Case& c : cases) {
    TrainerOptions o;
    c.set(o);
    try {
      Trainer t(o);
      ADD_FAILURE() << "accepted; expected: " << c.expect;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos)
          << e.what() << "\nexpected: " << c.expect;
    }
  }
}

TEST_F(TrainerTest, BadModelsAreRefusedAtFitNamingTheField) {
  struct Case {
    std::function<void(TrainerOptions&, TrainerModel&)> set;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](TrainerOptions& o, TrainerModel&) {
         o.steps = 3;
         o.epochs = 1;
       },
       "TrainerOptions::steps=3 with TrainerOptions::epochs=1: the training data is finite"},
      {[](TrainerOptions& o, TrainerModel& m) {
         o.eval_every = 2;
         m.eval_data = nullptr;
         m.metrics.clear();
       },
       "TrainerOptions::eval_every=2: the model has nothing to evaluate"},
      {[](TrainerOptions&, TrainerModel& m) { m.train_data = nullptr; },
       "TrainerModel has no training data"},
      {[](TrainerOptions&, TrainerModel& m) { m.next_batch = [](FeedMap*) {}; },
       "TrainerModel::train_data and TrainerModel::next_batch are both set"},
      {[](TrainerOptions&, TrainerModel& m) { m.loss = "nope"; },
       "TrainerModel::loss names var 'nope'"},
      {[](TrainerOptions&, TrainerModel& m) { m.main = nullptr; }, "TrainerModel::main is not set"},
      {[](TrainerOptions&, TrainerModel& m) { m.test = nullptr; },
       "TrainerModel::eval_data needs TrainerModel::test"},
      {[](TrainerOptions&, TrainerModel& m) { m.metrics[0].var = "missing"; },
       "TrainerModel::metrics 'accuracy' names var 'missing'"},
      {[](TrainerOptions& o, TrainerModel&) { o.save_inference_dir = "/tmp/x"; },
       "TrainerOptions::save_inference_dir=/tmp/x needs TrainerModel::inference_feeds"},
  };
  for (const Case& c : cases) {
    auto t = MakeTinyModel();
    TrainerOptions o = Quiet();
    o.steps = 2;
    c.set(o, t->model);
    Trainer trainer(o);
    try {
      trainer.fit(t->model);
      ADD_FAILURE() << "accepted; expected: " << c.expect;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos)
          << e.what() << "\nexpected: " << c.expect;
    }
  }
  // A loader sharded for two ranks, in a job of one.
  auto t = MakeTinyModel(32, 8, 0, 2);
  TrainerOptions o = Quiet();
  o.steps = 2;
  Trainer trainer(o);
  try {
    trainer.fit(t->model);
    ADD_FAILURE() << "a shard of 2 ranks was accepted on 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TrainerModel::train_data is shard 0 of 2"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(TrainerTest, FitsOnce) {
  auto t = MakeTinyModel();
  TrainerOptions o = Quiet();
  o.steps = 2;
  Trainer trainer(o);
  trainer.fit(t->model);
  try {
    trainer.fit(t->model);
    ADD_FAILURE() << "a second fit was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has trained already"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace keel::testing
