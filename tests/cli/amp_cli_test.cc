// keel train's mixed-precision and recompute flags: --amp=bf16|fp16 train the MLP (finite, falling
// losses, the strategy logged with amp=true and the dtype; with --logdir and fp16 the loss scale
// and skipped steps in TensorBoard), --recompute runs ResNet-20 with the
// checkpoints its builder marks and is refused for a model that marks none, bad values are
// refused naming the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
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

// The losses keel train printed ("step N loss X"), in order.
std::vector<std::string> Losses(const std::string& out) {
  std::vector<std::string> losses;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("step ", 0) == 0 && line.find(" loss ") != std::string::npos)
      losses.push_back(line.substr(0, line.find(" samples")));
  return losses;
}

// --amp=bf16 (O1) keeps each weight's bfloat16 copy from step to step
// (transpiler/amp_weight_copy_pass.h). The copies are made by the pass: checkpoints hold the
// float32 weights only, as O1's always did, and a resume makes the copies again from the loaded
// weights. 4 steps + a checkpoint + a resumed run to step 8 equal 8 steps in one go, losses and
// every saved tensor bit for bit (fails when the resumed run keeps copies of the initial weights);
// a float32 checkpoint resumes under O1.
TEST(KeelTrainAmp, O1ResumesBitForBitWithoutCheckpointingTheWeightCopies) {
  const std::string dir = MakeTempDir();
  const std::string base = Keel() + " train --model=mlp --mlp_hidden=64 --seed=3 " +
                           "--fetch_frequency=1 --cpu_math_threads=1 --amp=bf16";
  auto whole = RunCommand(base + " --steps=8 --save_dir=" + dir +
                          "/whole --save_inference_dir=" + dir + "/infer");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  auto half = RunCommand(base + " --steps=4 --save_dir=" + dir + "/half");
  ASSERT_EQ(half.exit_code, 0) << half.output;
  auto resumed =
      RunCommand(base + " --steps=8 --load_dir=" + dir + "/half --save_dir=" + dir + "/resumed");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<std::string> lw = Losses(whole.output), lr = Losses(resumed.output);
  ASSERT_EQ(lw.size(), 8u) << whole.output;
  ASSERT_EQ(lr.size(), 4u) << resumed.output;
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(lr[k], lw[4 + k]);
  const NamedTensors saved = LoadSafetensors(dir + "/half/" + kPersistablesFile);
  bool has_weight = false;
  for (const auto& [name, t] : saved) {
    EXPECT_EQ(name.find(".cast_bf16"), std::string::npos) << name;
    if (name == "fc_0.w_0") has_weight = t.dtype() == DType::kFloat32;
  }
  EXPECT_TRUE(has_weight);
  const NamedTensors a = LoadSafetensors(dir + "/whole/" + kPersistablesFile);
  const NamedTensors b = LoadSafetensors(dir + "/resumed/" + kPersistablesFile);
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].first, b[k].first);
    ASSERT_EQ(a[k].second.nbytes(), b[k].second.nbytes()) << a[k].first;
    EXPECT_EQ(std::memcmp(a[k].second.raw_data(), b[k].second.raw_data(), a[k].second.nbytes()), 0)
        << a[k].first;
  }
  // The inference model reads the float32 weights (through its casts), not the copies.
  const NamedTensors infer = LoadSafetensors(dir + "/infer/" + kParamsFile);
  bool infer_weight = false;
  for (const auto& [name, t] : infer) {
    EXPECT_EQ(name.find(".cast_bf16"), std::string::npos) << name;
    if (name == "fc_0.w_0") infer_weight = t.dtype() == DType::kFloat32;
  }
  EXPECT_TRUE(infer_weight);
  // The copies are in use: keel inspect shows updates writing them beside their weights.
  auto program = RunCommand(Keel() + " inspect --strategy --model=mlp --mlp_hidden=64 " +
                            "--program=main --amp=bf16");
  ASSERT_EQ(program.exit_code, 0) << program.output;
  EXPECT_NE(program.output.find("MasterParam: fc_0.w_0)"), std::string::npos) << program.output;
  const std::string f32 = Keel() + " train --model=mlp --mlp_hidden=64 --seed=3 --steps=4";
  ASSERT_EQ(RunCommand(f32 + " --save_dir=" + dir + "/f32").exit_code, 0);
  auto from_f32 = RunCommand(base + " --steps=5 --load_dir=" + dir + "/f32");
  ASSERT_EQ(from_f32.exit_code, 0) << from_f32.output;
  EXPECT_EQ(Losses(from_f32.output).size(), 1u) << from_f32.output;
  RunCommand("rm -rf " + dir);
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
