// keel train's mixed-precision and recompute flags: --amp=bf16|fp16 train the MLP (finite, falling
// losses, the strategy logged with amp=true and the dtype; with --logdir and fp16 the loss scale
// and skipped steps in TensorBoard), --recompute runs ResNet-20 with the
// checkpoints its builder marks and is refused for a model that marks none, bad values are
// refused naming the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

TEST(KeelTrainAmp, Bf16AndFp16TrainTheMlpAndReachTheStrategy) {
  for (const char* dtype : {"bf16", "fp16"}) {
    SCOPED_TRACE(dtype);
    auto r = RunCommand(Keel() + " train --model=mlp --mlp_hidden=64 --steps=40 --seed=3 " +
                        "--fetch_frequency=10 --amp=" + dtype);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string want = std::string("amp=true, amp_configs={dtype=") +
                             (std::string(dtype) == "bf16" ? "bfloat16" : "float16");
    EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("step 30 loss 0."), std::string::npos) << r.output;  // finite, < 1
    EXPECT_EQ(r.output.find("loss nan"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("loss -nan"), std::string::npos) << r.output;
  }
}

// --logdir with --amp=fp16: amp/loss_scale and amp/skipped_steps at every fetched step, read back
// with tensorboard. No growth within 2000 steps, so each skipped step has halved the scale once:
// scale = 2^16 * 0.5^skipped. --amp=bf16 (no loss scaling) writes neither.
TEST(KeelTrainAmp, LossScaleAndSkippedStepsReachTensorboard) {
  if (!HaveTensorboard()) GTEST_SKIP() << "python tensorboard not installed (tools/setup.sh)";
  const std::string dir = MakeTempDir();
  auto r = RunCommand(Keel() + " train --model=mlp --mlp_hidden=64 --steps=6 --seed=3 " +
                      "--fetch_frequency=2 --progress=none --amp=fp16 --logdir=" + dir + "/fp16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto got = ReadTensorboardScalars(dir + "/fp16");
  ASSERT_EQ(got["amp/loss_scale"].size(), 3u) << r.output;
  ASSERT_EQ(got["amp/skipped_steps"].size(), 3u);
  double last = 0;
  for (const auto& [step, scale] : got["amp/loss_scale"]) {
    const double skipped = got["amp/skipped_steps"][step];
    EXPECT_GE(skipped, last) << step;
    EXPECT_LE(skipped, step + 1) << step;
    EXPECT_EQ(scale, std::ldexp(65536.0, -static_cast<int>(skipped))) << step;
    last = skipped;
  }
  auto bf16 = RunCommand(Keel() + " train --model=mlp --mlp_hidden=64 --steps=2 --seed=3 " +
                         "--progress=none --amp=bf16 --logdir=" + dir + "/bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  auto plain = ReadTensorboardScalars(dir + "/bf16");
  EXPECT_EQ(plain["train/loss"].size(), 2u);
  EXPECT_EQ(plain.count("amp/loss_scale") + plain.count("amp/skipped_steps"), 0u);
  RunCommand("rm -rf " + dir);
}

TEST(KeelTrainAmp, BadValuesAreRefusedNamingTheFlag) {
  auto bad = RunCommand(Keel() + " train --model=mlp --steps=1 --amp=fp8");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--amp must be off, bf16 or fp16"), std::string::npos) << bad.output;
  auto o3 = RunCommand(Keel() + " train --model=mlp --steps=1 --amp=bf16 --amp_level=O3");
  EXPECT_NE(o3.exit_code, 0);
  EXPECT_NE(o3.output.find("amp_configs.level=O3 must be O1"), std::string::npos) << o3.output;
  auto level = RunCommand(Keel() + " train --model=mlp --steps=1 --amp_level=O1");
  EXPECT_NE(level.exit_code, 0);
  EXPECT_NE(level.output.find("--amp_level applies only to mixed precision"), std::string::npos)
      << level.output;
}

TEST(KeelTrainAmp, RecomputeRunsResnetAndNeedsMarkedCheckpoints) {
  auto r = RunCommand(Keel() + " train --model=resnet --batch_size=8 --steps=2 --seed=1 " +
                      "--recompute");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("recompute=true"), std::string::npos) << r.output;
  auto mlp = RunCommand(Keel() + " train --model=mlp --steps=1 --recompute");
  EXPECT_NE(mlp.exit_code, 0);
  EXPECT_NE(mlp.output.find("no checkpoint"), std::string::npos) << mlp.output;
}

}  // namespace
}  // namespace keel::testing
