// GradAllReducePass as before/after program text (golden files), for 1 and 2 rings.
#include <gtest/gtest.h>

#include "fleet/distributed_strategy.h"
#include "fleet/role_maker.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "tests/util/golden.h"
#include "transpiler/grad_allreduce_pass.h"

namespace keel {
namespace {

void BuildTrainedMlp(Program& main, Program& startup) {
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 4});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 3, "tanh");
  Var cost = layers::mean(layers::cross_entropy(layers::fc(h, 2, "softmax"), y));
  optimizer::SGD(0.1f).minimize(cost, &startup);
}

fleet::Role TwoOfFour() {
  fleet::Role r;
  r.rank = 1;
  r.world_size = 4;
  r.local_world_size = 4;
  r.local_rank = 1;
  return r;
}

TEST(GradAllReducePass, OneRingMatchesGolden) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  testing::ExpectGolden(main.ToText(), "grad_allreduce_before_main.txt");
  fleet::DistributedStrategy s;
  transpiler::GradAllReducePass().Apply(main, startup, s, TwoOfFour());
  testing::ExpectGolden(main.ToText(), "grad_allreduce_1ring_main.txt");
  testing::ExpectGolden(startup.ToText(), "grad_allreduce_1ring_startup.txt");
}

TEST(GradAllReducePass, TwoRingsAlternateGradients) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.nccl_comm_num = 2;
  transpiler::GradAllReducePass().Apply(main, startup, s, TwoOfFour());
  testing::ExpectGolden(main.ToText(), "grad_allreduce_2ring_main.txt");
  testing::ExpectGolden(startup.ToText(), "grad_allreduce_2ring_startup.txt");
  int rings[2] = {0, 0};
  for (auto& op : main.global_block().ops())
    if (op->type() == "c_allreduce_sum") ++rings[op->Attr<int>("ring_id")];
  EXPECT_EQ(rings[0], 2);
  EXPECT_EQ(rings[1], 2);
}

TEST(GradAllReducePass, NeedsBackward) {
  Program main, startup;
  {
    ProgramGuard guard(main, startup);
    layers::mean(layers::fc(layers::data("x", {-1, 4}), 2));
  }
  fleet::DistributedStrategy s;
  EXPECT_THROW(transpiler::GradAllReducePass().Apply(main, startup, s, TwoOfFour()), Error);
}

}  // namespace
}  // namespace keel
