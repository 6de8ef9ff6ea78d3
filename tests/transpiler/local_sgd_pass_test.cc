// LocalSGDPass as program text before/after (golden files), and its refusals.
#include <gtest/gtest.h>

#include "fleet/distributed_strategy.h"
#include "fleet/role_maker.h"
#include "fleet/transpile.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "tests/util/golden.h"
#include "tests/util/op_test_util.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/local_sgd_pass.h"

namespace keel {
namespace {

using testing::BuildTrainedMlp;
using testing::TwoOfFour;

TEST(LocalSGDPass, MatchesGolden) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.use_local_sgd = true;
  s.local_sgd_steps = 4;
  s.local_sgd_warmup_steps = 10;
  s.nccl_comm_num = 2;
  transpiler::LocalSGDPass(fleet::LocalSGDOptionsFor(s, TwoOfFour())).Apply(main, startup);
  testing::ExpectGolden(main.ToText(), "local_sgd_main.txt");
  testing::ExpectGolden(startup.ToText(), "local_sgd_startup.txt");
  // No gradient all-reduce in block 0; the averaging lives in block 1.
  for (auto& op : main.global_block().ops()) EXPECT_NE(op->type(), "c_allreduce_sum");
  ASSERT_EQ(main.num_blocks(), 2);
  int allreduces = 0;
  for (auto& op : main.block(1).ops()) allreduces += op->type() == "c_allreduce_sum";
  EXPECT_EQ(allreduces, 4);
}

TEST(LocalSGDPass, NeedsAnOptimizerAndSaneSteps) {
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    layers::fc(layers::data("x", {-1, 4}), 3);
  }
  fleet::DistributedStrategy s;
  s.use_local_sgd = true;
  testing::ExpectErrorContainsAll(
      testing::ErrorOf([&] {
        transpiler::LocalSGDPass(fleet::LocalSGDOptionsFor(s, TwoOfFour())).Apply(main, startup);
      }),
      {"local_sgd", "no optimizer ops"});
  Program m2, s2;
  BuildTrainedMlp(m2, s2);
  s.local_sgd_steps = 0;
  testing::ExpectErrorContainsAll(
      testing::ErrorOf([&] {
        transpiler::LocalSGDPass(fleet::LocalSGDOptionsFor(s, TwoOfFour())).Apply(m2, s2);
      }),
      {"local_sgd_steps must be >= 1, got 0"});
}

}  // namespace
}  // namespace keel
