// keel train's mixed-precision and recompute flags: --amp=bf16|fp16 train the MLP (finite, falling
// losses, the strategy logged with amp=true and the dtype), --recompute runs ResNet-20 with the
// checkpoints its builder marks and is refused for a model that marks none, bad values are
// refused naming the flag.
#include <gtest/gtest.h>

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

TEST(KeelTrainAmp, BadValuesAreRefusedNamingTheFlag) {
  auto bad = RunCommand(Keel() + " train --model=mlp --steps=1 --amp=fp8");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--amp must be off, bf16 or fp16"), std::string::npos) << bad.output;
  auto o2 = RunCommand(Keel() + " train --model=mlp --steps=1 --amp=bf16 --amp_level=O2");
  EXPECT_NE(o2.exit_code, 0);
  EXPECT_NE(o2.output.find("amp_configs.level=O2"), std::string::npos) << o2.output;
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
