// keel::Trainer on two workers under `keel launch`, with real processes: evaluation metrics of
// the whole data on every rank, a stop asked by one rank's callback that stops both at one step,
// and the user-model example (examples/train_cnn.cc) stopped and resumed, and killed and restarted
// by --max_restarts, each ending with the parameters of an uninterrupted run.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "framework/io/checkpoint.h"
#include "tests/util/files.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

std::string Launch(const std::string& log_dir, const std::string& flags = "") {
  return "FLAGS_cpu_math_threads=1 timeout 300 " + Keel() + " launch --nproc_per_node=2 " + flags +
         " --log_dir=" + log_dir + " ";
}

std::string WorkerLog(const std::string& log_dir, int rank) {
  return ReadText(log_dir + "/workerlog." + std::to_string(rank));
}

// "step N loss X ..." lines of a training log: step -> X as printed.
std::map<int, std::string> LossLines(const std::string& text) {
  std::map<int, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string step_word, loss_word, loss;
    int step = -1;
    if (words >> step_word >> step >> loss_word >> loss && step_word == "step" &&
        loss_word == "loss")
      out[step] = loss;
  }
  return out;
}

TEST(TrainerFleet, EvaluationMetricsAreGlobalOverTheRanks) {
  const std::string dir = MakeTempDir();
  auto r = RunCommand(Launch(dir + "/log") + BinPath("trainer_worker") + " --case=eval_global");
  ASSERT_EQ(r.exit_code, 0) << r.output << WorkerLog(dir + "/log", 1);
  for (int rank : {0, 1}) {
    const std::string log = WorkerLog(dir + "/log", rank), R = std::to_string(rank);
    // Rank 0's shard alone has mean 14, rank 1's 11.67: 13 is all seven values.
    EXPECT_TRUE(Contains(log, "rank " + R + " fit_eval 13.000000 samples 7")) << log;
    EXPECT_TRUE(Contains(log, "rank " + R + " evaluate 13.000000 samples 7")) << log;
  }
  RunCommand("rm -rf " + dir);
}

TEST(TrainerFleet, AStopAskedByOneRankStopsEveryRankAfterTheSameStep) {
  const std::string dir = MakeTempDir();
  const std::string worker = BinPath("trainer_worker") + " --case=stop --stop_rank=1";
  auto r = RunCommand(Launch(dir + "/a") + worker + " --stop_at=3");
  ASSERT_EQ(r.exit_code, 0) << r.output << WorkerLog(dir + "/a", 1);
  for (int rank : {0, 1})
    EXPECT_TRUE(Contains(WorkerLog(dir + "/a", rank),
                         "rank " + std::to_string(rank) + " steps_done 4 stopped 1"))
        << WorkerLog(dir + "/a", rank);
  // Agreed every 4 steps: asked after step 4 (5 done), both stop when 8 are done.
  auto every4 = RunCommand(Launch(dir + "/b") + worker + " --stop_at=4 --stop_check_every=4");
  ASSERT_EQ(every4.exit_code, 0) << every4.output << WorkerLog(dir + "/b", 1);
  for (int rank : {0, 1})
    EXPECT_TRUE(Contains(WorkerLog(dir + "/b", rank),
                         "rank " + std::to_string(rank) + " steps_done 8 stopped 1"))
        << WorkerLog(dir + "/b", rank);
  RunCommand("rm -rf " + dir);
}

// The example of docs/trainer.md: 1024 images, 32 per worker and step on 2 workers, 4 epochs of
// 16 steps; a checkpoint every 10 steps.
class TrainCnnExample : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir());
    straight_ = new CommandResult(
        RunCommand(Launch(*dir_ + "/l0") + Cnn() + " --save_dir=" + *dir_ + "/straight"));
  }
  static void TearDownTestSuite() {
    RunCommand("rm -rf " + *dir_);
    delete dir_;
    delete straight_;
  }
  static std::string Cnn() { return BinPath("train_cnn") + " --save_every=10"; }
  void SetUp() override {
    ASSERT_EQ(straight_->exit_code, 0) << straight_->output;
    ASSERT_TRUE(Contains(straight_->output, "trained 64 steps: test accuracy"))
        << straight_->output;
  }
  // The run's losses from step `from` on are the uninterrupted run's, it printed none before,
  // and it ends with the same test accuracy and parameters.
  void ExpectSameAsStraight(const std::string& out, const std::string& save_dir, int from) {
    std::map<int, std::string> a = LossLines(straight_->output), b = LossLines(out);
    ASSERT_FALSE(b.empty()) << out;
    EXPECT_EQ(b.rbegin()->first, a.rbegin()->first) << out;
    for (const auto& [step, loss] : b) {
      if (step >= from) {
        EXPECT_EQ(loss, a[step]) << "step " << step;
      }
    }
    const std::string& s = straight_->output;
    const std::string last = s.substr(s.find("trained 64 steps"));
    EXPECT_TRUE(Contains(out, last.substr(0, last.find('\n')))) << out;
    EXPECT_EQ(CheckpointTensorBytes(save_dir), CheckpointTensorBytes(*dir_ + "/straight"));
    std::optional<TrainingState> st = ReadTrainingState(save_dir);
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->step, 64);
    EXPECT_EQ(st->world_size, 2);
  }

  static std::string* dir_;
  static CommandResult* straight_;
};
std::string* TrainCnnExample::dir_ = nullptr;
CommandResult* TrainCnnExample::straight_ = nullptr;

TEST_F(TrainCnnExample, StoppedAndResumedOnTwoWorkersEqualsAnUninterruptedRun) {
  const std::string ckpt = *dir_ + "/resumed";
  auto first =
      RunCommand(Launch(*dir_ + "/l1") + Cnn() + " --save_dir=" + ckpt + " --stop_at_step=24");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(Contains(first.output, "final checkpoint at step 25")) << first.output;
  std::optional<TrainingState> st = ReadTrainingState(ckpt);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->step, 25);  // mid-epoch: epoch 1, 9 steps into it

  auto again = RunCommand(Launch(*dir_ + "/l2") + Cnn() + " --save_dir=" + ckpt + " --auto_resume");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(Contains(again.output, "resumed from " + ckpt + " at step 25")) << again.output;
  EXPECT_EQ(LossLines(again.output).begin()->first, 25) << again.output;
  ExpectSameAsStraight(again.output, ckpt, 25);
}

TEST_F(TrainCnnExample, AKilledWorkerIsRestartedAndTheJobResumesFromItsLastCheckpoint) {
  const std::string ckpt = *dir_ + "/restarted";
  // Rank 1 is killed (SIGKILL) right after step 35 on the first attempt; rank 0 saved step 30.
  auto r = RunCommand("KEEL_FAULT_POINT=trainer_step_35@1 " +
                      Launch(*dir_ + "/l3", "--max_restarts=1") + Cnn() + " --save_dir=" + ckpt);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "keel launch: restart 1 of 1: worker rank 1")) << r.output;
  EXPECT_TRUE(Contains(r.output, "resumed from " + ckpt + " at step 30")) << r.output;
  ExpectSameAsStraight(r.output.substr(r.output.find("resumed from")), ckpt, 30);
}

}  // namespace
}  // namespace keel::testing
