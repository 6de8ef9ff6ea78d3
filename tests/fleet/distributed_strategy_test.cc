// DistributedStrategy: Paddle's defaults, validation naming the field, refusal of switches whose
// pass does not exist yet, and the FLAGS_ overrides.
#include "fleet/distributed_strategy.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <functional>

#include "framework/error.h"

DECLARE_bool(sync_nccl_allreduce);
DECLARE_int32(comm_timeout_s);
DECLARE_double(fuse_parameter_memory_size);
DECLARE_int32(fuse_parameter_groups_size);

namespace keel {
namespace fleet {
namespace {

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Role World(int world_size, int local_world_size) {
  Role r;
  r.world_size = world_size;
  r.local_world_size = local_world_size;
  return r;
}

TEST(DistributedStrategy, DefaultsArePaddles) {
  DistributedStrategy s;
  EXPECT_EQ(s.nccl_comm_num, 1);
  EXPECT_FALSE(s.fuse_all_reduce_ops);
  EXPECT_EQ(s.fuse_grad_size_in_MB, 32);
  EXPECT_EQ(s.fuse_grad_size_in_num, 8);
  EXPECT_FALSE(s.use_hierarchical_allreduce);
  EXPECT_EQ(s.hierarchical_allreduce_inter_nranks, 0);
  EXPECT_FALSE(s.use_local_sgd);
  EXPECT_EQ(s.local_sgd_steps, 1);
  EXPECT_EQ(s.local_sgd_warmup_steps, 0);
  EXPECT_TRUE(s.sync_nccl_allreduce);
  EXPECT_EQ(s.comm_timeout_s, 300);
  EXPECT_EQ(s.exec_strategy.num_threads, ExecutionStrategy().num_threads);
  EXPECT_NO_THROW(s.Validate(Role()));
  EXPECT_NO_THROW(DistributedStrategy::RequireImplemented(s));
  EXPECT_EQ(s.ToString(),
            "DistributedStrategy{nccl_comm_num=1, fuse_all_reduce_ops=false, "
            "fuse_grad_size_in_MB=32, fuse_grad_size_in_num=8, use_hierarchical_allreduce=false, "
            "hierarchical_allreduce_inter_nranks=0, use_local_sgd=false, local_sgd_steps=1, "
            "local_sgd_warmup_steps=0, sync_nccl_allreduce=true, comm_timeout_s=300, "
            "exec_strategy={num_threads=0, num_iteration_per_drop_scope=100}}");
}

TEST(DistributedStrategy, DefaultsFollowTheFlagsWhenConstructed) {
  gflags::FlagSaver saver;
  FLAGS_sync_nccl_allreduce = false;
  FLAGS_comm_timeout_s = 42;
  DistributedStrategy s;
  EXPECT_FALSE(s.sync_nccl_allreduce);
  EXPECT_EQ(s.comm_timeout_s, 42);
}

TEST(DistributedStrategy, ValidateNamesTheFieldAndValue) {
  struct Case {
    const char* intent;
    std::function<void(DistributedStrategy*)> edit;
    Role role;
    std::string says;  // empty: valid
  };
  const std::vector<Case> cases = {
      {"8 rings", [](DistributedStrategy* s) { s->nccl_comm_num = 8; }, Role(), ""},
      {"0 rings", [](DistributedStrategy* s) { s->nccl_comm_num = 0; }, Role(),
       "nccl_comm_num=0 must be in 1..8"},
      {"9 rings", [](DistributedStrategy* s) { s->nccl_comm_num = 9; }, Role(), "nccl_comm_num=9"},
      {"fuse MB 0", [](DistributedStrategy* s) { s->fuse_grad_size_in_MB = 0; }, Role(),
       "fuse_grad_size_in_MB=0 must be > 0"},
      {"fuse MB fraction", [](DistributedStrategy* s) { s->fuse_grad_size_in_MB = 0.25; }, Role(),
       ""},
      {"fuse num -1", [](DistributedStrategy* s) { s->fuse_grad_size_in_num = -1; }, Role(),
       "fuse_grad_size_in_num=-1"},
      {"hierarchical, local world divides world",
       [](DistributedStrategy* s) { s->use_hierarchical_allreduce = true; }, World(8, 4), ""},
      {"hierarchical, explicit inter_nranks not dividing world",
       [](DistributedStrategy* s) {
         s->use_hierarchical_allreduce = true;
         s->hierarchical_allreduce_inter_nranks = 3;
       },
       World(8, 4), "hierarchical_allreduce_inter_nranks=3 does not divide world_size=8"},
      {"inter_nranks negative",
       [](DistributedStrategy* s) { s->hierarchical_allreduce_inter_nranks = -2; }, Role(),
       "hierarchical_allreduce_inter_nranks=-2"},
      {"inter_nranks ignored when hierarchical is off",
       [](DistributedStrategy* s) { s->hierarchical_allreduce_inter_nranks = 3; }, World(8, 4), ""},
      {"local sgd steps 0", [](DistributedStrategy* s) { s->local_sgd_steps = 0; }, Role(),
       "local_sgd_steps=0 must be >= 1"},
      {"local sgd warmup negative", [](DistributedStrategy* s) { s->local_sgd_warmup_steps = -1; },
       Role(), "local_sgd_warmup_steps=-1"},
      {"timeout 0", [](DistributedStrategy* s) { s->comm_timeout_s = 0; }, Role(),
       "comm_timeout_s=0 must be > 0"},
      {"exec threads negative", [](DistributedStrategy* s) { s->exec_strategy.num_threads = -1; },
       Role(), "exec_strategy.num_threads=-1"},
      {"exec threads 0 is the default", [](DistributedStrategy* s) { s->exec_strategy.num_threads = 0; },
       Role(), ""},
      {"drop scope 0",
       [](DistributedStrategy* s) { s->exec_strategy.num_iteration_per_drop_scope = 0; }, Role(),
       "exec_strategy.num_iteration_per_drop_scope=0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.intent);
    DistributedStrategy s;
    c.edit(&s);
    std::string e = ErrorOf([&] { s.Validate(c.role); });
    if (c.says.empty()) {
      EXPECT_EQ(e, "");
    } else {
      EXPECT_NE(e.find(c.says), std::string::npos) << e;
      EXPECT_NE(e.find("DistributedStrategy."), std::string::npos) << e;
    }
  }
}

TEST(DistributedStrategy, HierarchicalInterNranksZeroMeansLocalWorldSize) {
  DistributedStrategy s;
  EXPECT_EQ(s.HierarchicalInterNranks(World(8, 4)), 4);
  s.hierarchical_allreduce_inter_nranks = 2;
  EXPECT_EQ(s.HierarchicalInterNranks(World(8, 4)), 2);
}

TEST(DistributedStrategy, EverySwitchHasItsPass) {
  DistributedStrategy all;
  all.nccl_comm_num = 4;
  all.sync_nccl_allreduce = false;
  all.fuse_all_reduce_ops = true;
  all.use_hierarchical_allreduce = true;
  all.use_local_sgd = true;
  EXPECT_NO_THROW(DistributedStrategy::RequireImplemented(all));
}

TEST(DistributedStrategy, LocalSgdRefusesTheGradientAllReduceSwitches) {
  DistributedStrategy s;
  s.use_local_sgd = true;
  EXPECT_NO_THROW(s.Validate(World(4, 4)));
  s.fuse_all_reduce_ops = true;
  std::string e = ErrorOf([&] { s.Validate(World(4, 4)); });
  EXPECT_NE(e.find("use_local_sgd=true does not combine with fuse_all_reduce_ops=true"),
            std::string::npos)
      << e;
  s.fuse_all_reduce_ops = false;
  s.use_hierarchical_allreduce = true;
  e = ErrorOf([&] { s.Validate(World(4, 4)); });
  EXPECT_NE(e.find("use_hierarchical_allreduce=true"), std::string::npos) << e;
}

TEST(DistributedStrategy, FlagOverridesSetFusionSizesOnlyWhenSet) {
  gflags::FlagSaver saver;
  DistributedStrategy s;
  s.fuse_grad_size_in_MB = 4;
  s.fuse_grad_size_in_num = 2;
  s.ApplyFlagOverrides();  // both flags unset (-1)
  EXPECT_EQ(s.fuse_grad_size_in_MB, 4);
  EXPECT_EQ(s.fuse_grad_size_in_num, 2);

  // The seed's FLAGS_fuse_parameter_memory_size=16, FLAGS_fuse_parameter_groups_size=50.
  ASSERT_FALSE(gflags::SetCommandLineOption("fuse_parameter_memory_size", "16").empty());
  ASSERT_FALSE(gflags::SetCommandLineOption("fuse_parameter_groups_size", "50").empty());
  s.ApplyFlagOverrides();
  EXPECT_EQ(s.fuse_grad_size_in_MB, 16);
  EXPECT_EQ(s.fuse_grad_size_in_num, 50);

  FLAGS_fuse_parameter_memory_size = 0.5;
  FLAGS_fuse_parameter_groups_size = -1;
  s.ApplyFlagOverrides();
  EXPECT_EQ(s.fuse_grad_size_in_MB, 0.5);
  EXPECT_EQ(s.fuse_grad_size_in_num, 50);

  FLAGS_fuse_parameter_memory_size = 0;
  std::string e = ErrorOf([&] { s.ApplyFlagOverrides(); });
  EXPECT_NE(e.find("FLAGS_fuse_parameter_memory_size=0"), std::string::npos) << e;
  FLAGS_fuse_parameter_memory_size = -1;
  FLAGS_fuse_parameter_groups_size = -3;
  e = ErrorOf([&] { s.ApplyFlagOverrides(); });
  EXPECT_NE(e.find("FLAGS_fuse_parameter_groups_size=-3"), std::string::npos) << e;
}

}  // namespace
}  // namespace fleet
}  // namespace keel
