// The built-in models train on their data: LeNet on the real MNIST test set, the transformer
// solves its reversal task, ResNet-20's loss falls; their test programs run in inference mode.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "executor/executor.h"
#include "framework/dsl/nn_layers.h"
#include "models/model_zoo.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_data.h"

namespace keel::testing {
namespace {

std::vector<double> Column(const std::string& out, const char* fmt) {
  std::vector<double> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    long long k;
    double x;
    if (std::sscanf(line.c_str(), fmt, &k, &x) == 2) v.push_back(x);
  }
  return v;
}

TEST(Lenet, ReachesNinetySevenPercentOnRealMnistWithinTheTimeLimit) {
  if (!HaveMnist()) GTEST_SKIP() << "MNIST not found in " << MnistDir() << " (set KEEL_MNIST_DIR)";
  std::string dir = MnistDir();
  auto t0 = std::chrono::steady_clock::now();
  auto r = RunCommand(BinPath("keel") + " train --model=lenet --data=mnist:" + dir +
                      " --epochs=8 --batch_size=64 --seed=1 --fetch_frequency=1000");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto acc = Column(r.output, "epoch %lld test_accuracy %lf");
  ASSERT_EQ(acc.size(), 8u) << r.output;
  EXPECT_GE(acc.back(), 0.97) << r.output;
  EXPECT_LT(secs, 180) << r.output;  // the bound on this 2-core machine
}

TEST(Lenet, MissingOrBadDataIsAClearError) {
  auto r = RunCommand(BinPath("keel") + " train --model=lenet --epochs=1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--data=mnist:DIR"), std::string::npos) << r.output;
  std::string tmp = MakeTempDir();
  RunCommand("head -c 100 /dev/urandom > " + tmp + "/t10k-images-idx3-ubyte; cp " + tmp +
             "/t10k-images-idx3-ubyte " + tmp + "/t10k-labels-idx1-ubyte");
  r = RunCommand(BinPath("keel") + " train --model=lenet --epochs=1 --data=mnist:" + tmp);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(r.signaled);
  EXPECT_NE(r.output.find(tmp + "/t10k-images-idx3-ubyte"), std::string::npos) << r.output;
  RunCommand("rm -rf " + tmp);
}

TEST(Transformer, SolvesTheReversalTask) {
  auto r = RunCommand(BinPath("keel") +
                      " train --model=transformer --epochs=3 --steps=100 --batch_size=64 --seed=1 "
                      "--fetch_frequency=100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto acc = Column(r.output, "epoch %lld test_accuracy %lf");
  auto loss = Column(r.output, "step %lld loss %lf");
  ASSERT_EQ(acc.size(), 3u) << r.output;
  EXPECT_GE(acc.back(), 0.99) << r.output;
  EXPECT_LT(loss.back(), 0.05) << r.output;
  EXPECT_GT(loss.front(), 2.0) << r.output;  // starts near ln(10)
}

TEST(Resnet20, LossFalls) {
  auto r =
      RunCommand(BinPath("keel") +
                 " train --model=resnet --steps=40 --batch_size=32 --seed=1 --fetch_frequency=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto loss = Column(r.output, "step %lld loss %lf");
  ASSERT_EQ(loss.size(), 40u) << r.output;
  // Steps at lr 0.05 on batches of 32 are noisy (one run's last three steps can sit near 2 while
  // another's sit near 1): the last ten are averaged.
  double first = (loss[0] + loss[1] + loss[2]) / 3, last = 0;
  for (size_t i = 30; i < 40; ++i) last += loss[i] / 10;
  EXPECT_LT(last, first - 0.5) << r.output;
}

// Channels last (--data_format=NHWC) is the same network with the same parameters: the images
// transposed once, every conv, batch norm and the pooling in NHWC. Its first loss (forward) and
// second (after one update: backward too) are NCHW's to rounding, which a wrong layout anywhere
// would not give; later steps part by more (training at batch 16 amplifies rounding: 3e-4 at the
// third step in the sanitizer build, about 1 % by the tenth). An NCHW checkpoint resumes in NHWC
// and gives NCHW's loss on the same parameters, then after one more update.
TEST(Resnet20, ChannelsLastTrainsLikeNchw) {
  std::vector<double> loss[2];
  for (int nhwc = 0; nhwc < 2; ++nhwc) {
    auto r = RunCommand(BinPath("keel") +
                        " train --model=resnet --steps=2 --batch_size=16 --seed=1 "
                        "--fetch_frequency=1 --data_format=" +
                        (nhwc ? "NHWC" : "NCHW"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    loss[nhwc] = Column(r.output, "step %lld loss %lf");
    ASSERT_EQ(loss[nhwc].size(), 2u) << r.output;
  }
  EXPECT_NEAR(loss[1][0], loss[0][0], 1e-5 * loss[0][0]);
  EXPECT_NEAR(loss[1][1], loss[0][1], 1e-4 * loss[0][1]);
  // The parameters are the same in either layout: a checkpoint of NCHW training resumes in NHWC
  // (steps 2 and 3 of 4 against NCHW's own).
  const std::string dir = MakeTempDir();
  const std::string common =
      " train --model=resnet --batch_size=16 --seed=1 --fetch_frequency=1 --save_dir=" + dir;
  auto first = RunCommand(BinPath("keel") + common + " --steps=2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto resumed =
      RunCommand(BinPath("keel") + common + " --steps=4 --auto_resume --data_format=NHWC");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  const std::vector<double> after = Column(resumed.output, "step %lld loss %lf");
  ASSERT_EQ(after.size(), 2u) << resumed.output;
  auto nchw4 = RunCommand(BinPath("keel") +
                          " train --model=resnet --batch_size=16 --seed=1 --fetch_frequency=1 "
                          "--steps=4");
  ASSERT_EQ(nchw4.exit_code, 0) << nchw4.output;
  const std::vector<double> want = Column(nchw4.output, "step %lld loss %lf");
  ASSERT_EQ(want.size(), 4u) << nchw4.output;
  EXPECT_NEAR(after[0], want[2], 1e-5 * want[2]);
  EXPECT_NEAR(after[1], want[3], 1e-4 * want[3]);
  RunCommand("rm -rf " + dir);
  auto r = RunCommand(BinPath("keel") + " train --model=mlp --steps=1 --data_format=NHWC");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--data_format is a setting of the resnet model"), std::string::npos)
      << r.output;
}

// The test program switches batch_norm and dropout to inference: repeatable outputs, moving
// statistics untouched; the training program updates them.
TEST(CloneForTest, BatchNormAndDropoutSwitchToInference) {
  Program main, startup;
  startup.set_random_seed(1);
  main.set_random_seed(1);
  Var out;
  {
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, 2, 4, 4});
    out = layers::dropout(layers::batch_norm(x), 0.5f);
  }
  auto test = main.clone_for_test();
  Executor exe;
  exe.Run(startup);
  std::string mean_name;
  for (auto& op : main.global_block().ops())
    if (op->type() == "batch_norm") mean_name = op->Input("Mean")[0];
  const Tensor& moving = exe.scope().FindVar(mean_name)->tensor();
  std::vector<float> xs(2 * 2 * 4 * 4);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i % 7) + 1.0f;
  FeedMap feed{{"x", Tensor::FromVector(xs, {2, 2, 4, 4})}};
  Tensor a = exe.Run(*test, feed, {out})[0], b = exe.Run(*test, feed, {out})[0];
  EXPECT_EQ(0, std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()));
  EXPECT_EQ(moving.data<float>()[0], 0.0f);  // inference leaves the statistics alone
  Tensor c = exe.Run(main, feed, {out})[0];
  EXPECT_NE(moving.data<float>()[0], 0.0f);  // training updates them
  int zeros = 0;
  for (int64_t i = 0; i < c.numel(); ++i) zeros += c.data<float>()[i] == 0.0f;
  EXPECT_GT(zeros, 0);  // dropout dropped some in training
}

}  // namespace
}  // namespace keel::testing
