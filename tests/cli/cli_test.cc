// The `keel` binary end to end: training output, determinism, checkpoints, and bad input giving
// exit code 1 with a message (never a crash).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

std::string Keel() { return BinPath("keel"); }

std::vector<double> Losses(const std::string& out) {
  std::vector<double> losses;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    int step;
    double loss;
    if (std::sscanf(line.c_str(), "step %d loss %lf", &step, &loss) == 2) losses.push_back(loss);
  }
  return losses;
}

TEST(KeelTrain, SameSeedPrintsIdenticalLosses) {
  std::string cmd = Keel() + " train --model=mlp --steps=20 --seed=7 --fetch_frequency=5";
  auto a = RunCommand(cmd), b = RunCommand(cmd);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto la = Losses(a.output), lb = Losses(b.output);
  ASSERT_EQ(la.size(), 4u) << a.output;
  EXPECT_EQ(la, lb);
  auto c = RunCommand(Keel() + " train --model=mlp --steps=20 --seed=8 --fetch_frequency=5");
  EXPECT_NE(Losses(c.output), la);
}

TEST(KeelTrain, LossFallsFromLn2) {
  auto r = RunCommand(Keel() + " train --model=mlp --steps=150 --seed=1 --fetch_frequency=10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto l = Losses(r.output);
  ASSERT_EQ(l.size(), 15u);
  EXPECT_NEAR(l.front(), std::log(2.0), 0.05) << r.output;
  EXPECT_LT(l.back(), l.front() - 0.1) << r.output;
}

TEST(KeelTrain, SavesACheckpointThatInspectReadsAndTrainResumesFrom) {
  std::string dir = MakeTempDir();
  auto r = RunCommand(Keel() + " train --steps=5 --seed=2 --save_dir=" + dir + "/ckpt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto i = RunCommand(Keel() + " inspect " + dir + "/ckpt");
  ASSERT_EQ(i.exit_code, 0) << i.output;
  EXPECT_NE(i.output.find("fc_1.w_0 : float32[1280, 1280]"), std::string::npos) << i.output;
  EXPECT_NE(i.output.find("learning_rate_0 : float32[1]"), std::string::npos) << i.output;
  auto resumed = RunCommand(Keel() + " train --steps=2 --seed=2 --load_dir=" + dir + "/ckpt");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos);
  RunCommand("rm -rf " + dir);
}

TEST(KeelInspect, PrintsTheInferenceProgramAsTextAndDot) {
  std::string dir = MakeTempDir();
  auto r = RunCommand(Keel() + " train --steps=1 --seed=2 --save_inference_dir=" + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto text = RunCommand(Keel() + " inspect " + dir + "/__model__");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("softmax(X: "), std::string::npos) << text.output;
  EXPECT_EQ(text.output.find("sgd("), std::string::npos) << text.output;
  EXPECT_EQ(text.output.find("_grad("), std::string::npos) << text.output;
  auto dot = RunCommand(Keel() + " inspect --dot " + dir + "/__model__");
  ASSERT_EQ(dot.exit_code, 0) << dot.output;
  EXPECT_EQ(dot.output.rfind("digraph program {", 0), 0u) << dot.output;
  auto both = RunCommand(Keel() + " inspect " + dir);
  EXPECT_NE(both.output.find("fc_0.w_0 : float32[32, 1280]"), std::string::npos) << both.output;
  RunCommand("rm -rf " + dir);
}

TEST(KeelErrors, TruncatedCheckpointIsExitOneNamingTheFile) {
  std::string dir = MakeTempDir();
  ASSERT_EQ(RunCommand(Keel() + " train --steps=1 --seed=2 --save_dir=" + dir).exit_code, 0);
  std::string f = dir + "/persistables.safetensors";
  ASSERT_EQ(RunCommand("truncate -s 5000 " + f).exit_code, 0);
  for (const std::string& cmd : {Keel() + " inspect " + f,
                                 Keel() + " train --steps=1 --load_dir=" + dir}) {
    auto r = RunCommand(cmd);
    EXPECT_EQ(r.exit_code, 1) << cmd << "\n" << r.output;
    EXPECT_FALSE(r.signaled);
    EXPECT_NE(r.output.find(f), std::string::npos) << r.output;
  }
  RunCommand("rm -rf " + dir);
}

TEST(KeelErrors, BadFlagsAndEnvAreExitOneWithAMessage) {
  struct Case {
    std::string cmd, expect;
  } cases[] = {
      {Keel() + " train --batch_size=0", "--batch_size"},
      {Keel() + " train --model=nope", "known: mlp"},
      {"FLAGS_steps=abc " + Keel() + " train", "FLAGS_steps"},
      {Keel() + " inspect /nonexistent/file", "/nonexistent/file"},
      {Keel() + " bench nope", "nope"},
  };
  for (auto& c : cases) {
    auto r = RunCommand(c.cmd);
    EXPECT_EQ(r.exit_code, 1) << c.cmd << "\n" << r.output;
    EXPECT_FALSE(r.signaled) << c.cmd;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.cmd << "\n" << r.output;
  }
}

TEST(KeelFlags, EnvironmentSetsFlagsAndUnknownNamesOnlyWarn) {
  auto r = RunCommand("FLAGS_steps=3 FLAGS_not_a_keel_flag=1 " + Keel() + " train --seed=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Losses(r.output).size(), 3u) << r.output;
  EXPECT_NE(r.output.find("FLAGS_not_a_keel_flag"), std::string::npos) << r.output;
  // The command line wins over the environment.
  r = RunCommand("FLAGS_steps=3 " + Keel() + " train --seed=1 --steps=2");
  EXPECT_EQ(Losses(r.output).size(), 2u) << r.output;
}

TEST(KeelBench, PrintsOneJsonLine) {
  auto r = RunCommand(Keel() + " bench mlp --bench_steps=3 --bench_warmup=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"system\": \"keel\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"step_ms\": "), std::string::npos) << r.output;
}

TEST(UserProgram, TrainMlpRunsTheSeedProgramAndSaves) {
  std::string dir = MakeTempDir();
  auto r = RunCommand("cd " + dir + " && " + BinPath("train_mlp"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 99 cost="), std::string::npos) << r.output;
  std::ifstream f(dir + "/model/persistables.safetensors");
  EXPECT_TRUE(f.good());
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
