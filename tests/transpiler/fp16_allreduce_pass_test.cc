// DistributedStrategy::fp16_allreduce in GradAllReducePass: float32 gradients all-reduced in a
// 16-bit type (cast before, cast back and 1/nranks after), one by one and fused, as golden program
// text; and the combinations that cannot work refused naming both settings.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "fleet/distributed_strategy.h"
#include "fleet/role_maker.h"
#include "fleet/transpile.h"
#include "framework/error.h"
#include "tests/util/golden.h"
#include "tests/util/transpiler_fixtures.h"
#include "transpiler/grad_allreduce_pass.h"
#include "transpiler/gradient_merge_pass.h"

namespace keel {
namespace {

using testing::BuildTrainedMlp;
using testing::TwoOfFour;

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

int Count(const Program& p, const std::string& type) {
  int n = 0;
  for (auto& op : p.global_block().ops()) n += op->type() == type;
  return n;
}

// One by one, bfloat16: each gradient is cast to <grad>.cast_bf16 right after its writer, that
// copy is all-reduced and cast back; the loss gradient is scaled by 1/4, as in float32 (bfloat16
// has float32's range, so no gradient falls out of it; float16 scales after, below).
TEST(Fp16AllReducePass, BFloat16GradientsOneByOneMatchGolden) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.fp16_allreduce = true;
  s.fp16_allreduce_configs.dtype = DType::kBFloat16;
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  testing::ExpectGolden(main.ToText(), "fp16_allreduce_bf16_main.txt");
  testing::ExpectGolden(startup.ToText(), "grad_allreduce_1ring_startup.txt");  // unchanged
  const Block& b = main.global_block();
  for (auto& op : b.ops()) {
    if (op->type() != "c_allreduce_sum") continue;
    EXPECT_EQ(b.MustFindVar(op->Input("X")[0])->dtype(), DType::kBFloat16) << op->Input("X")[0];
  }
  EXPECT_EQ(Count(main, "c_allreduce_sum"), 4);
  EXPECT_EQ(Count(main, "cast"), 8);
  // One scale of 1/4: the loss gradient's.
  int scales = 0;
  for (auto& op : b.ops()) {
    if (op->type() != "scale") continue;
    ++scales;
    EXPECT_EQ(op->Input("X")[0], "mean.tmp_0@GRAD");
    EXPECT_FLOAT_EQ(op->Attr<float>("scale"), 0.25f);
  }
  EXPECT_EQ(scales, 1);
}

// Fused, float16, two groups on two rings: the casts act on the fused buffers, so each group is
// still one all-reduce, of a float16 buffer of the group's size.
TEST(Fp16AllReducePass, Float16FusedBuffersMatchGolden) {
  Program main, startup;
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy s;
  s.fp16_allreduce = true;
  s.fuse_all_reduce_ops = true;
  s.fuse_grad_size_in_num = 2;
  s.nccl_comm_num = 2;
  transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, TwoOfFour()))
      .Apply(main, startup);
  testing::ExpectGolden(main.ToText(), "fp16_allreduce_fp16_fused_main.txt");
  EXPECT_EQ(Count(main, "coalesce_tensor"), 2);
  EXPECT_EQ(Count(main, "c_allreduce_sum"), 2);
  const Block& b = main.global_block();
  for (const char* v : {"@FUSED_GRAD@0.cast_fp16", "@FUSED_GRAD@1.cast_fp16"}) {
    ASSERT_NE(b.FindVar(v), nullptr) << v;
    EXPECT_EQ(b.FindVar(v)->dtype(), DType::kFloat16) << v;
  }
}

// Through fleet's Transpile with the strategy: the same rewrite (the switch reaches the pass).
TEST(Fp16AllReducePass, StrategySwitchReachesThePass) {
  Program plain_main, plain_startup, main, startup;
  BuildTrainedMlp(plain_main, plain_startup);
  BuildTrainedMlp(main, startup);
  fleet::DistributedStrategy off, on;
  on.fp16_allreduce = true;
  on.fp16_allreduce_configs.dtype = DType::kBFloat16;
  fleet::Transpile(plain_main, plain_startup, off, TwoOfFour());
  fleet::Transpile(main, startup, on, TwoOfFour());
  EXPECT_EQ(Count(plain_main, "cast"), 0);
  // bfloat16 on a CPU rank: every gradient is made bfloat16 where it is computed
  // (transpiler/narrow_grads_pass.h) and all-reduced as it is, without casts.
  EXPECT_EQ(Count(main, "cast"), 0);
  EXPECT_EQ(Count(main, "c_allreduce_sum"), 4);
  for (auto& op : main.global_block().ops()) {
    if (op->type() == "c_allreduce_sum") {
      EXPECT_EQ(main.global_block().MustFindVar(op->Input("X")[0])->dtype(), DType::kBFloat16);
    }
  }
  // float16 casts each gradient there and back.
  Program fp16_main, fp16_startup;
  BuildTrainedMlp(fp16_main, fp16_startup);
  fleet::DistributedStrategy fp16;
  fp16.fp16_allreduce = true;
  fleet::Transpile(fp16_main, fp16_startup, fp16, TwoOfFour());
  EXPECT_EQ(Count(fp16_main, "cast"), 8);
}

TEST(Fp16AllReducePass, CombinationsThatCannotWorkAreRefusedNamingBoth) {
  const fleet::Role role = TwoOfFour();
  struct Case {
    std::function<void(fleet::DistributedStrategy*)> set;
    const char* other;
  } cases[] = {
      {[](auto* s) { s->amp = true; }, "DistributedStrategy.amp=true"},
      {[](auto* s) { s->sharding = true; }, "DistributedStrategy.sharding=true"},
      {[](auto* s) { s->use_local_sgd = true; }, "DistributedStrategy.use_local_sgd=true"},
      {[](auto* s) { s->gradient_merge = true; }, "DistributedStrategy.gradient_merge=true"},
      {[](auto* s) { s->use_hierarchical_allreduce = true; },
       "DistributedStrategy.use_hierarchical_allreduce=true"},
  };
  for (const Case& c : cases) {
    fleet::DistributedStrategy s;
    s.fp16_allreduce = true;
    c.set(&s);
    const std::string e = ErrorOf([&] { s.Validate(role); });
    EXPECT_NE(e.find("fp16_allreduce=true does not combine with"), std::string::npos) << e;
    EXPECT_NE(e.find(c.other), std::string::npos) << e;
  }
  fleet::DistributedStrategy bad;
  bad.fp16_allreduce = true;
  bad.fp16_allreduce_configs.dtype = DType::kFloat64;
  EXPECT_NE(ErrorOf([&] {
              bad.Validate(role);
            }).find("fp16_allreduce_configs.dtype must be float16 or bfloat16, got float64"),
            std::string::npos);
  fleet::DistributedStrategy off;
  off.fp16_allreduce_configs.dtype = DType::kBFloat16;
  EXPECT_NE(ErrorOf([&] { off.Validate(role); })
                .find("fp16_allreduce_configs.dtype=bfloat16 is set but "
                      "DistributedStrategy.fp16_allreduce=false"),
            std::string::npos);
  fleet::DistributedStrategy fine;
  fine.fp16_allreduce = true;
  fine.fuse_all_reduce_ops = true;
  fine.nccl_comm_num = 2;
  EXPECT_EQ(ErrorOf([&] { fine.Validate(role); }), "");
}

// The pass itself refuses what the strategy would have (a pass used without fleet), and a
// gradient that is not float32.
TEST(Fp16AllReducePass, PassRefusesHierarchyMergeAndNonFloat32Gradients) {
  {
    Program main, startup;
    BuildTrainedMlp(main, startup);
    transpiler::GradAllReduceOptions o;
    o.rings.nranks = 4;
    o.rings.rank = 1;
    o.comm_dtype = DType::kBFloat16;
    o.hierarchical = true;
    o.ranks_per_node = 2;
    EXPECT_NE(ErrorOf([&] {
                transpiler::GradAllReducePass(o).Apply(main, startup);
              }).find("fp16_allreduce and use_hierarchical_allreduce"),
              std::string::npos);
  }
  {
    Program main, startup;
    BuildTrainedMlp(main, startup);
    transpiler::GradientMergePass(transpiler::GradientMergeOptions{}).Apply(main, startup);
    transpiler::GradAllReduceOptions o;
    o.rings.nranks = 2;
    o.comm_dtype = DType::kFloat16;
    EXPECT_NE(ErrorOf([&] {
                transpiler::GradAllReducePass(o).Apply(main, startup);
              }).find("fp16_allreduce and gradient merge"),
              std::string::npos);
  }
  {
    Program main, startup;
    BuildTrainedMlp(main, startup);
    main.global_block().MustFindVar("fc_0.w_0@GRAD")->set_dtype(DType::kFloat64);
    transpiler::GradAllReduceOptions o;
    o.rings.nranks = 2;
    o.comm_dtype = DType::kBFloat16;
    EXPECT_NE(ErrorOf([&] {
                transpiler::GradAllReducePass(o).Apply(main, startup);
              }).find("gradient 'fc_0.w_0@GRAD' is float64"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace keel
