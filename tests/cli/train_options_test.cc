// keel train's user-facing options end to end: every optimizer and schedule flag changes the
// training it names (or is refused where it does not apply), --eval_every, the progress bar and
// lines, TensorBoard files read back with the tensorboard package, and the grouped --help.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/util/golden.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_data.h"

namespace keel::testing {
namespace {

// A small, fast model: the seed MLP 16 wide.
const std::string kTrain = " train --model=mlp --mlp_hidden=16 --seed=3 --progress=lines ";

struct Line {
  double loss = 0, lr = -1;
};

// "step N loss L ... [lr R]" lines by step.
std::map<int, Line> Steps(const std::string& out) {
  std::map<int, Line> steps;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    int step;
    double loss;
    if (std::sscanf(line.c_str(), "step %d loss %lf", &step, &loss) != 2) continue;
    steps[step].loss = loss;
    size_t at = line.find(" lr ");
    if (at != std::string::npos) steps[step].lr = std::atof(line.c_str() + at + 4);
  }
  return steps;
}

std::vector<double> Losses(const std::string& out) {
  std::vector<double> l;
  for (auto& [step, line] : Steps(out)) l.push_back(line.loss);
  return l;
}

CommandResult Train(const std::string& flags) {
  return RunCommand(Keel() + kTrain + flags + " 2>&1");
}

TEST(TrainOptimizerFlags, EachSettingChangesTheTraining) {
  auto sgd = Train("--steps=12 --optimizer=sgd --lr=0.1");
  ASSERT_EQ(sgd.exit_code, 0) << sgd.output;
  // Momentum with mu = 0 is SGD: the flag reaches the momentum op.
  auto mu0 = Train("--steps=12 --optimizer=momentum --momentum=0 --lr=0.1");
  auto mu9 = Train("--steps=12 --optimizer=momentum --momentum=0.9 --lr=0.1");
  auto nesterov = Train("--steps=12 --optimizer=momentum --nesterov --lr=0.1");
  EXPECT_EQ(Losses(mu0.output), Losses(sgd.output)) << mu0.output;
  EXPECT_NE(Losses(mu9.output), Losses(sgd.output));
  EXPECT_NE(Losses(nesterov.output), Losses(mu9.output));
  auto adam = Train("--steps=12 --optimizer=adam");
  auto beta1 = Train("--steps=12 --optimizer=adam --beta1=0.5");
  auto beta2 = Train("--steps=12 --optimizer=adam --beta2=0.9");
  auto eps = Train("--steps=12 --optimizer=adam --epsilon=0.1");
  for (auto* r : {&adam, &beta1, &beta2, &eps}) ASSERT_EQ(r->exit_code, 0) << r->output;
  EXPECT_NE(Losses(beta1.output), Losses(adam.output));
  EXPECT_NE(Losses(beta2.output), Losses(adam.output));
  EXPECT_NE(Losses(eps.output), Losses(adam.output));
  auto decay = Train("--steps=12 --optimizer=sgd --lr=0.1 --weight_decay=0.5");
  auto adamw = Train("--steps=12 --optimizer=adamw");
  auto adamw0 = Train("--steps=12 --optimizer=adamw --weight_decay=0");
  EXPECT_NE(Losses(decay.output), Losses(sgd.output));
  EXPECT_NE(Losses(adamw.output), Losses(adamw0.output));
  // A clip far below the gradients' norm slows training down.
  auto clip = Train("--steps=12 --optimizer=sgd --lr=0.1 --clip_global_norm=0.001");
  ASSERT_EQ(clip.exit_code, 0) << clip.output;
  EXPECT_LT(std::fabs(Losses(clip.output).back() - Losses(clip.output).front()),
            std::fabs(Losses(sgd.output).back() - Losses(sgd.output).front()));
  EXPECT_NE(clip.output.find("clip_global_norm=0.001"), std::string::npos) << clip.output;
}

TEST(TrainScheduleFlags, PrintedRatesFollowTheSchedule) {
  auto pw = Train(
      "--steps=8 --optimizer=sgd --lr_schedule=piecewise --lr_boundaries=3,6 "
      "--lr_values=0.1,0.05,0.01");
  ASSERT_EQ(pw.exit_code, 0) << pw.output;
  auto s = Steps(pw.output);
  EXPECT_NEAR(s[0].lr, 0.1, 1e-7);
  EXPECT_NEAR(s[2].lr, 0.1, 1e-7);
  EXPECT_NEAR(s[3].lr, 0.05, 1e-7);
  EXPECT_NEAR(s[7].lr, 0.01, 1e-7);
  // Warm-up over 4 steps towards the cosine's value at step 4, then half a cosine from 0.1 down
  // to 0 at step 10 (the run's length).
  auto cos = Train("--steps=10 --optimizer=sgd --lr=0.1 --lr_schedule=cosine --warmup_steps=4");
  ASSERT_EQ(cos.exit_code, 0) << cos.output;
  s = Steps(cos.output);
  EXPECT_NEAR(s[0].lr, 0.0, 1e-7);
  EXPECT_NEAR(s[2].lr, 0.5 * 0.05 * (1 + std::cos(M_PI * 4 / 10)), 1e-6);
  for (int step = 5; step < 10; ++step)
    EXPECT_NEAR(s[step].lr, 0.05 * (1 + std::cos(M_PI * step / 10)), 1e-6) << step;
  auto min = Train(
      "--steps=4 --optimizer=sgd --lr=0.1 --lr_schedule=cosine --lr_decay_steps=2 "
      "--min_lr=0.02");
  EXPECT_NEAR(Steps(min.output)[3].lr, 0.02, 1e-7) << min.output;
}

TEST(TrainFlags, SettingsThatDoNotApplyAreRefusedByName) {
  struct Case {
    std::string flags, expect;
  } cases[] = {
      {"--optimizer=adam --momentum=0.5", "--momentum applies only to --optimizer=momentum"},
      {"--optimizer=sgd --nesterov", "--nesterov"},
      {"--optimizer=momentum --beta1=0.5", "--beta1 applies only to --optimizer=adam|adamw"},
      {"--lr_values=0.1,0.2", "--lr_values applies only to --lr_schedule=piecewise"},
      {"--lr_schedule=piecewise --lr_values=0.1,0.2", "one more value than boundaries"},
      {"--lr_schedule=piecewise --lr_boundaries=2 --lr_values=0.1,x", "'x' is not a number"},
      {"--lr_schedule=piecewise --lr=0.1 --lr_boundaries=2 --lr_values=0.1,0.2", "drop --lr"},
      {"--lr_schedule=step", "--lr_schedule='step'"},
      {"--min_lr=0.1", "--min_lr applies only to --lr_schedule=cosine"},
      {"--warmup_start_lr=0.1", "--warmup_start_lr"},
      {"--lr_schedule=cosine --epochs=1", "--lr_decay_steps"},
      {"--weight_decay=-1", "--weight_decay must be >= 0"},
      {"--clip_global_norm=-2", "--clip_global_norm"},
      {"--beta2=1 --optimizer=adam", "--beta2 must be in [0, 1)"},
      {"--eval_every=5", "--eval_every: model mlp has no test data"},
      {"--progress=fancy", "--progress='fancy'"},
      {"--logdir_all_ranks", "--logdir_all_ranks needs --logdir"},
      {"--logdir=/proc/keel_no", "/proc/keel_no"},
  };
  for (const Case& c : cases) {
    auto r = Train("--steps=1 " + c.flags);
    EXPECT_EQ(r.exit_code, 1) << c.flags << "\n" << r.output;
    EXPECT_FALSE(r.signaled);
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.flags << "\n" << r.output;
  }
}

// TensorBoard logging that cannot write (here: past the file size limit) warns once, naming the
// flag and the limit, and training goes on to its last step; no SIGXFSZ kills the worker.
TEST(TrainTensorboard, ALogDiskThatFailsStopsTheLoggingNotTheTraining) {
  const std::string dir = MakeTempDir();
  auto r = RunCommand("ulimit -f 4; " + Keel() +
                      " train --model=mlp --mlp_hidden=16 --steps=300 --fetch_frequency=1 "
                      "--progress=lines --logdir=" +
                      dir + "/tb");
  EXPECT_EQ(r.exit_code, 0) << r.output.substr(0, 2000);
  EXPECT_FALSE(r.signaled);
  EXPECT_NE(r.output.find("warning: --logdir=" + dir + "/tb"), std::string::npos)
      << r.output.substr(0, 2000);
  EXPECT_NE(r.output.find("ulimit -f"), std::string::npos) << r.output.substr(0, 2000);
  EXPECT_NE(r.output.find("step 299 loss"), std::string::npos);
  size_t warnings = 0;
  for (size_t at = r.output.find("warning: --logdir"); at != std::string::npos;
       at = r.output.find("warning: --logdir", at + 1))
    ++warnings;
  EXPECT_EQ(warnings, 1u);
  RunCommand("rm -rf " + dir);
}

TEST(TrainProgress, BarOnRequestAndLinesWithEta) {
  auto bar = RunCommand(Keel() +
                        " train --model=mlp --mlp_hidden=16 --steps=6 --progress=bar "
                        "2>/dev/null");
  ASSERT_EQ(bar.exit_code, 0) << bar.output;
  EXPECT_NE(bar.output.find("\r100% [########################] 6/6 loss "), std::string::npos)
      << bar.output;
  EXPECT_NE(bar.output.find("samples/s"), std::string::npos);
  auto lines = Train("--steps=6");
  EXPECT_EQ(lines.output.find('\r'), std::string::npos);
  EXPECT_NE(lines.output.find("step 1 loss "), std::string::npos);
  EXPECT_NE(lines.output.find(" eta 0:00:0"), std::string::npos) << lines.output;
  EXPECT_NE(lines.output.find(" step_ms "), std::string::npos) << lines.output;
  // Not a terminal: auto means lines.
  auto autom = RunCommand(Keel() + " train --model=mlp --mlp_hidden=16 --steps=3 2>/dev/null");
  EXPECT_EQ(autom.output.find('\r'), std::string::npos);
}

TEST(TrainTensorboard, LossRateAndAccuracyReadBackWithTensorboard) {
  if (!HaveTensorboard()) GTEST_SKIP() << "python tensorboard not installed (tools/setup.sh)";
  if (!HaveMnist()) GTEST_SKIP() << "no MNIST in " << MnistDir();
  const std::string mnist = MnistDir();
  std::string dir = MakeTempDir();
  auto r = RunCommand(Keel() + " train --model=lenet --data=mnist:" + mnist +
                      " --steps=20 --batch_size=32 --eval_every=10 --fetch_frequency=5 --seed=1 "
                      "--progress=lines --lr_schedule=cosine --logdir=" +
                      dir + "/tb 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto printed = Steps(r.output);
  ASSERT_EQ(printed.size(), 4u) << r.output;
  auto got = ReadTensorboardScalars(dir + "/tb");
  ASSERT_EQ(got["train/loss"].size(), 4u);
  for (auto& [step, line] : printed) {
    EXPECT_NEAR(got["train/loss"][step], line.loss, 1e-5) << step;
    EXPECT_NEAR(got["train/learning_rate"][step], line.lr, 1e-7) << step;
    EXPECT_GT(got["train/samples_per_sec"][step], 0) << step;
    EXPECT_GT(got["train/step_time_ms"][step], 0) << step;
  }
  EXPECT_LT(got["train/learning_rate"][15], got["train/learning_rate"][0]);
  ASSERT_EQ(got["eval/accuracy"].size(), 2u);  // after steps 9 and 19
  double acc = 0;
  std::sscanf(r.output.substr(r.output.find("step 19 test_accuracy")).c_str(),
              "step 19 test_accuracy %lf", &acc);
  EXPECT_NEAR(got["eval/accuracy"][19], acc, 1e-4);
  EXPECT_GT(acc, 0.3);  // better than chance after 20 steps
  RunCommand("rm -rf " + dir);
}

TEST(TrainTensorboard, EveryRankWritesItsOwnFolderWhenAsked) {
  std::string dir = MakeTempDir();
  auto r = RunCommand(Keel() + " launch --nproc_per_node=2 --log_dir=" + dir + "/log " + Keel() +
                      kTrain + " --steps=4 --logdir=" + dir + "/tb --logdir_all_ranks");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank : {0, 1}) {
    auto files = RunCommand("ls " + dir + "/tb/rank_" + std::to_string(rank));
    EXPECT_NE(files.output.find("events.out.tfevents."), std::string::npos) << files.output;
    if (HaveTensorboard()) {
      EXPECT_EQ(
          ReadTensorboardScalars(dir + "/tb/rank_" + std::to_string(rank))["train/loss"].size(),
          4u);
    }
  }
  // Without the flag only rank 0 writes, straight into DIR.
  auto one = RunCommand(Keel() + " launch --nproc_per_node=2 --log_dir=" + dir + "/log " + Keel() +
                        kTrain + " --steps=2 --logdir=" + dir + "/tb0");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(RunCommand("ls " + dir + "/tb0 | wc -l").output, "1\n");
  RunCommand("rm -rf " + dir);
}

TEST(TrainEval, EvalEveryEvaluatesMidRunAndAtTheEnd) {
  auto r = RunCommand(Keel() +
                      " train --model=transformer --steps=6 --batch_size=16 "
                      "--eval_every=4 --seed=1 --progress=lines 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 3 test_accuracy "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 5 test_accuracy "), std::string::npos) << r.output;
}

// The transformer's sizes and dropout reach the model (its parameters' shapes, its dropout ops),
// and values that cannot work, or flags of another model, are refused naming the flag.
TEST(KeelTrain, TransformerSizeFlagsReachTheModel) {
  auto r = RunCommand(Keel() +
                      " inspect --summary --model=transformer --vocab=12 --d_model=16 --heads=4 "
                      "--d_ff=24 --layers=1 --seq_len=5 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* shape : {"embedding_0.w_0                          float32[12, 16]",
                            "pos_embedding.w_0                        float32[5, 16]",
                            "fc_4.w_0                                 float32[16, 24]",
                            "fc_6.w_0                                 float32[16, 12]"})
    EXPECT_NE(r.output.find(shape), std::string::npos) << shape << "\n" << r.output;
  // One layer: six fc (q, k, v, output projection, two feed-forward), then the output layer fc_6.
  EXPECT_EQ(r.output.find("fc_7.w_0 "), std::string::npos) << r.output;
  auto drop = RunCommand(Keel() +
                         " inspect --strategy --model=transformer --nranks=1 --program=main "
                         "--dropout=0.1 2>&1 | grep -c '^  dropout('");
  EXPECT_EQ(drop.output, "4\n");  // two layers, two sublayers each
  auto none = RunCommand(Keel() +
                         " inspect --strategy --model=transformer --nranks=1 --program=main "
                         "2>&1 | grep -c '^  dropout('");
  EXPECT_EQ(none.output, "0\n");  // the default model has none
  for (auto [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--model=transformer --heads=3", "--d_model=32 must divide by --heads=3"},
           {"--model=transformer --dropout=1", "--dropout=1 must be in [0, 1)"},
           {"--model=transformer --layers=0", "--layers=0 must be >= 1"},
           {"--model=mlp --d_ff=8", "--d_ff is a setting of the transformer model"}}) {
    auto bad = RunCommand(Keel() + " train --steps=1 " + flags + " 2>&1");
    EXPECT_NE(bad.exit_code, 0) << flags;
    EXPECT_NE(bad.output.find(says), std::string::npos) << flags << "\n" << bad.output;
  }
}

// --tp_degree under keel launch trains the transformer tensor-parallel (2 x 2 workers); values
// that cannot work are refused naming the flag.
TEST(KeelTrain, TensorParallelFlags) {
  const std::string dir = MakeTempDir();
  auto r = RunCommand("FLAGS_cpu_math_threads=1 " + Keel() +
                      " launch --nproc_per_node=4 --log_dir=" + dir + "/log " + Keel() +
                      " train --model=transformer --tp_degree=2 --steps=3 --seed=1 "
                      "--progress=lines 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 2 loss "), std::string::npos) << r.output;
  for (auto [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--nproc_per_node=2 " + Keel() +
                " train --model=transformer --tp_degree=2 --heads=1 "
                "--d_model=8",
            "--heads=1 must divide by --tp_degree=2"},
           {"--nproc_per_node=2 " + Keel() + " train --model=lenet --tp_degree=2",
            "model lenet has no tensor-parallel variant"},
           {"--nproc_per_node=2 " + Keel() + " train --model=mlp --tp_degree=2 --mlp_hidden=7",
            "--mlp_hidden=7 must divide by --tp_degree=2"},
           {"--nproc_per_node=3 " + Keel() + " train --model=transformer --tp_degree=2",
            "--tp_degree=2 does not divide the 3 workers"}}) {
    RunCommand("rm -rf " + dir + "/badlog");
    auto bad = RunCommand("FLAGS_cpu_math_threads=1 " + Keel() + " launch --log_dir=" + dir +
                          "/badlog " + flags + " --steps=1 2>&1");
    EXPECT_NE(bad.exit_code, 0) << flags;
    // Every rank refuses the flags; the launcher shows the log of the rank that ended first,
    // which may be one that saw a faster rank leave before it got to its own check.
    const std::string logs = RunCommand("cat " + dir + "/badlog/workerlog.* 2>&1").output;
    EXPECT_NE((bad.output + logs).find(says), std::string::npos) << flags << "\n" << bad.output;
  }
  RunCommand("rm -rf " + dir);
}

// LeNet places its five layers on the stages: on MNIST, PP=2 and PP=5 (2 micro-batches) print
// one process's losses within float rounding. (Not to the printed digit: the pipeline's loss is
// the mean of the micro-batches' means, and with -march=native's fused multiply-adds step 0 reads
// 3.262145 against one process's 3.262144.)
TEST(KeelTrain, LenetPipelineEqualsOneProcessOnMnist) {
  if (!HaveMnist()) GTEST_SKIP() << "no MNIST at " << MnistDir();
  const std::string dir = MakeTempDir();
  const std::string train = " train --model=lenet --data=mnist:" + MnistDir() +
                            " --steps=4 --seed=3 --batch_size=32 --optimizer=sgd --progress=lines";
  auto losses = [](const std::string& out) {
    std::vector<double> v;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      int step = 0;
      double loss = 0;
      if (std::sscanf(line.c_str(), "step %d loss %lf", &step, &loss) == 2) v.push_back(loss);
    }
    return v;
  };
  auto one = RunCommand("FLAGS_cpu_math_threads=1 " + Keel() + train + " 2>&1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> want = losses(one.output);
  ASSERT_EQ(want.size(), 4u) << one.output;
  for (int pp : {2, 5}) {
    auto job = RunCommand("FLAGS_cpu_math_threads=1 " + Keel() +
                          " launch --nproc_per_node=" + std::to_string(pp) + " --log_dir=" + dir +
                          "/log" + std::to_string(pp) + " " + Keel() + train +
                          " --pp_degree=" + std::to_string(pp) + " --micro_batches=2 2>&1");
    ASSERT_EQ(job.exit_code, 0) << job.output;
    const std::vector<double> got = losses(job.output);
    ASSERT_EQ(got.size(), want.size()) << "PP=" << pp << "\n" << job.output;
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      // (Within one unit of the printed sixth decimal too: a loss below 1 rounds at 1e-6.)
      EXPECT_LE(std::abs(got[i] - want[i]), std::max(1e-6 * std::abs(want[i]), 1.5e-6))
          << "PP=" << pp << " step " << i << "\n"
          << job.output;
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    }
    std::printf("PP=%d: losses' max relative difference %.2g\n", pp, worst);
  }
  RunCommand("rm -rf " + dir);
}

// Under a pipeline LeNet's training loader drops an epoch's short last batch: 8000 MNIST images in
// batches of 48 leave 32, which do not split into 3 micro-batches (the runner would refuse them
// after the epoch's 166 steps); two epochs train 332 steps and evaluate after each.
TEST(KeelTrain, LenetPipelineTrainsWholeEpochs) {
  if (!HaveMnist()) GTEST_SKIP() << "no MNIST at " << MnistDir();
  const std::string dir = MakeTempDir();
  auto job = RunCommand("FLAGS_cpu_math_threads=1 " + Keel() + " launch --nproc_per_node=2 " +
                        "--log_dir=" + dir + "/log " + Keel() +
                        " train --model=lenet --data=mnist:" + MnistDir() +
                        " --pp_degree=2 --micro_batches=3 --epochs=2 --batch_size=48 --seed=3 "
                        "--progress=lines 2>&1");
  ASSERT_EQ(job.exit_code, 0) << job.output;
  EXPECT_NE(job.output.find("step 331 loss"), std::string::npos) << job.output;
  EXPECT_EQ(job.output.find("step 332 loss"), std::string::npos) << job.output;
  size_t evals = 0;
  for (size_t at = job.output.find("test_accuracy"); at != std::string::npos;
       at = job.output.find("test_accuracy", at + 1))
    ++evals;
  EXPECT_EQ(evals, 2u) << job.output;
  RunCommand("rm -rf " + dir);
}

// --pp_degree: a two-stage mlp under keel launch prints the losses one process prints (both
// schedules; PP=N initializes as one process), and the flags are refused where they cannot act.
TEST(KeelTrain, PipelineFlags) {
  const std::string dir = MakeTempDir();
  const std::string train =
      " train --model=mlp --mlp_hidden=16 --steps=4 --seed=3 --batch_size=8 "
      "--optimizer=adam --progress=lines";
  auto losses = [](const std::string& out) {
    std::string lines;
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("step ", 0) == 0) lines += line.substr(0, line.find(" samples/s")) + "\n";
    return lines;
  };
  auto one = RunCommand("FLAGS_cpu_math_threads=1 " + Keel() + train + " 2>&1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_NE(losses(one.output), "");
  for (const char* sched : {"1f1b", "fthenb"}) {
    auto two = RunCommand("FLAGS_cpu_math_threads=1 " + Keel() + " launch --nproc_per_node=2 " +
                          "--log_dir=" + dir + "/log " + Keel() + train +
                          " --pp_degree=2 --micro_batches=4 --pp_schedule=" + sched + " 2>&1");
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_EQ(losses(two.output), losses(one.output)) << sched << "\n" << two.output;
  }
  for (auto [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--nproc_per_node=2 " + Keel() + " train --model=mlp --micro_batches=2",
            "--micro_batches applies only to pipelines (--pp_degree > 1)"},
           {"--nproc_per_node=2 " + Keel() + " train --model=mlp --pp_degree=2 --pp_schedule=gpipe",
            "--pp_schedule must be 1f1b or fthenb"},
           {"--nproc_per_node=3 " + Keel() + " train --model=mlp --pp_degree=2",
            "--pp_degree=2 does not divide the 3 workers"},
           {"--nproc_per_node=2 " + Keel() + " train --model=ctr --pp_degree=2",
            "model ctr places no pipeline stages"},
           {"--nproc_per_node=2 " + Keel() +
                " train --model=mlp --pp_degree=2 --micro_batches=3 --batch_size=8",
            "--batch_size=8 must divide by --micro_batches=3"}}) {
    RunCommand("rm -rf " + dir + "/badlog");
    auto bad = RunCommand("FLAGS_cpu_math_threads=1 " + Keel() + " launch --log_dir=" + dir +
                          "/badlog " + flags + " --steps=1 2>&1");
    EXPECT_NE(bad.exit_code, 0) << flags;
    // Every rank refuses the flags; the launcher shows the log of the rank that ended first,
    // which may be one that saw a faster rank leave before it got to its own check.
    const std::string logs = RunCommand("cat " + dir + "/badlog/workerlog.* 2>&1").output;
    EXPECT_NE((bad.output + logs).find(says), std::string::npos) << flags << "\n" << bad.output;
  }
  RunCommand("rm -rf " + dir);
}

TEST(CommandHelp, GroupedShortAndListsEveryTrainFlag) {
  auto train = RunCommand(Keel() + " train --help");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  int lines = 0;
  for (char c : train.output) lines += c == '\n';
  // 135 before the transformer's sizes and --tp_degree, 145 before --sync_batch_norm and
  // --sharding_stage, 155 before --pp_degree, --micro_batches and --pp_schedule, 162 before
  // --fp16_allreduce and the ctr model, 166 before --ctr_table, 169 before --fuse_gemm_epilogue,
  // 173 before --ps_max_staleness, 178 before --data_format.
  EXPECT_LT(lines, 180) << train.output;
  for (const char* group :
       {"\noptimizer:\n", "\nlearning-rate schedule:\n", "\nwatching:\n", "\nseveral workers"})
    EXPECT_NE(train.output.find(group), std::string::npos) << group;
  // Every flag defined in keel train's sources (every python_free_cli/train*.cc, so that a new
  // file cannot hide its flags) is listed: grep their DEFINE_ lines.
  // (Joined into one line first: the formatter may break a DEFINE_ after its parenthesis.)
  auto defs = RunCommand("cat " + SourcePath("python_free_cli") +
                         "/train*.cc | tr '\\n' ' ' | grep -o 'DEFINE_[a-z0-9]*( *[a-z_0-9]*' | "
                         "tr -d ' '");
  std::istringstream in(defs.output);
  std::string def;
  int n = 0;
  while (std::getline(in, def)) {
    std::string name = def.substr(def.find('(') + 1);
    EXPECT_NE(train.output.find("  --" + name + "="), std::string::npos) << name;
    ++n;
  }
  EXPECT_GT(n, 30);
  EXPECT_EQ(train.output.find("--logtostderr"), std::string::npos);  // glog's are in --helpfull
  auto launch = RunCommand(Keel() + " launch --help");
  ASSERT_EQ(launch.exit_code, 0);
  lines = 0;
  for (char c : launch.output) lines += c == '\n';
  EXPECT_LT(lines, 48) << launch.output;  // 40 before --server_num/--worker_num, 42 before
                                          // --servers/--workers, 44 before --cpu_sched, 46
                                          // before --cpu_bind
  EXPECT_NE(launch.output.find("--nproc_per_node="), std::string::npos);
  // The worker command's own --help is the worker's, not the launcher's.
  auto worker = RunCommand(Keel() + " launch --log_dir=/tmp/keel_help_log echo --help");
  EXPECT_EQ(worker.exit_code, 0) << worker.output;
  EXPECT_EQ(worker.output.find("usage: keel launch"), std::string::npos) << worker.output;
  RunCommand("rm -rf /tmp/keel_help_log");
}

}  // namespace
}  // namespace keel::testing
