// keel::Trainer's TensorBoard scalars of loss scaling, read back with tensorboard's own reader:
// amp/loss_scale halves on each overflowed step and amp/skipped_steps counts every skipped step
// (those between fetches too), exactly as update_loss_scaling's rule says; a run without loss
// scaling writes neither.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "fleet/fleet.h"
#include "framework/dsl/amp.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "tests/util/files.h"
#include "tests/util/subprocess.h"
#include "trainer/trainer.h"

namespace keel::testing {
namespace {

class TrainerAmpLogTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    fleet::reset();
    fleet::init(fleet::UserDefinedRoleMaker(0, 1));
  }

  // loss = mean(fc(x, 1)) on two rows of x = 1024: the weight's scaled gradient is
  // 1024 * scale, a power of two that overflows (to inf) exactly while scale >= 2^118.
  // Trains `steps` steps into dir_/tb and returns what tensorboard reads back.
  std::map<std::string, std::map<int64_t, double>> Train(const amp::AmpConfig& config, int steps,
                                                         int fetch_frequency) {
    Program main, startup;
    main.set_random_seed(1);
    startup.set_random_seed(1);
    std::string loss_name;
    {
      ProgramGuard guard(main, startup);
      Var x = layers::data("x", {-1, 1});
      Var loss = layers::mean(layers::fc(x, 1));
      amp::decorate(optimizer::SGD(1e-3f), config).minimize(loss, &startup);
      loss_name = loss.name();
    }
    TrainerModel model;
    model.main = &main;
    model.startup = &startup;
    model.loss = loss_name;
    model.next_batch = [](FeedMap* feed) {
      Tensor x(DType::kFloat32, {2, 1});
      x.data<float>()[0] = x.data<float>()[1] = 1024.0f;
      (*feed)["x"] = x;
    };
    TrainerOptions o;
    o.progress = "none";
    o.steps = steps;
    o.fetch_frequency = fetch_frequency;
    o.logdir = Path("tb");
    Trainer(o).fit(model);
    return ReadTensorboardScalars(Path("tb"));
  }
};

TEST_F(TrainerAmpLogTest, LossScaleHalvesAndSkippedStepsCountOverflows) {
  if (!HaveTensorboard()) GTEST_SKIP() << "python tensorboard not installed (tools/setup.sh)";
  amp::AmpConfig c;
  c.dtype = DType::kBFloat16;
  c.use_dynamic_loss_scaling = true;
  c.init_loss_scaling = std::ldexp(1.0f, 120);
  // Steps 0, 1, 2 run at 2^120, 2^119, 2^118 and overflow (each halves the scale); step 3 runs
  // at 2^117 and every later step is finite. Fetched every second step: steps 0, 2, 4, 6.
  auto got = Train(c, 7, 2);
  const std::map<int64_t, double> scale = {{0, std::ldexp(1.0, 119)},
                                           {2, std::ldexp(1.0, 117)},
                                           {4, std::ldexp(1.0, 117)},
                                           {6, std::ldexp(1.0, 117)}};
  const std::map<int64_t, double> skipped = {{0, 1}, {2, 3}, {4, 3}, {6, 3}};
  ASSERT_EQ(got["amp/loss_scale"].size(), scale.size());
  for (const auto& [step, want] : scale)
    EXPECT_NEAR(got["amp/loss_scale"][step] / want, 1.0, 1e-5) << "step " << step;
  EXPECT_EQ(got["amp/skipped_steps"], skipped);
  EXPECT_EQ(got["train/loss"].size(), 4u);
}

TEST_F(TrainerAmpLogTest, ScaleGrowsAfterIncrEveryNFiniteSteps) {
  if (!HaveTensorboard()) GTEST_SKIP() << "python tensorboard not installed (tools/setup.sh)";
  amp::AmpConfig c;
  c.dtype = DType::kBFloat16;
  c.use_dynamic_loss_scaling = true;
  c.init_loss_scaling = 8.0f;
  c.incr_every_n_steps = 2;
  auto got = Train(c, 4, 1);
  EXPECT_EQ(got["amp/loss_scale"], (std::map<int64_t, double>{{0, 8}, {1, 16}, {2, 16}, {3, 32}}));
  EXPECT_EQ(got["amp/skipped_steps"], (std::map<int64_t, double>{{0, 0}, {1, 0}, {2, 0}, {3, 0}}));
}

TEST_F(TrainerAmpLogTest, NoLossScalingWritesNoAmpScalars) {
  if (!HaveTensorboard()) GTEST_SKIP() << "python tensorboard not installed (tools/setup.sh)";
  amp::AmpConfig c;
  c.dtype = DType::kBFloat16;  // bfloat16 scales no loss unless asked
  auto got = Train(c, 2, 1);
  EXPECT_EQ(got["train/loss"].size(), 2u);
  EXPECT_EQ(got.count("amp/loss_scale"), 0u);
  EXPECT_EQ(got.count("amp/skipped_steps"), 0u);
}

}  // namespace
}  // namespace keel::testing
