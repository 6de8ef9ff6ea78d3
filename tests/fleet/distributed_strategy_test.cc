// DistributedStrategy: Paddle's defaults, validation naming the field, refusal of settings keel
// does not implement, Paddle's fusion flags, and walks over the setting table and the field list.
#include "fleet/distributed_strategy.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <functional>

#include "fleet/transpile.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/error.h"
#include "tests/util/op_test_util.h"
#include "transpiler/grad_allreduce_pass.h"
#include "transpiler/gradient_merge_pass.h"
#include "transpiler/local_sgd_pass.h"
#include "transpiler/sharding_pass.h"

DECLARE_bool(sync_nccl_allreduce);
DECLARE_int32(comm_timeout_s);
DECLARE_double(fuse_parameter_memory_size);
DECLARE_int32(fuse_parameter_groups_size);

namespace keel {
namespace fleet {
namespace {

using testing::ErrorOf;

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
  EXPECT_FALSE(s.exec_strategy.use_cuda_graph);
  EXPECT_NO_THROW(s.Validate(Role()));
  EXPECT_NO_THROW(DistributedStrategy::RequireImplemented(s));
  EXPECT_EQ(
      s.ToString(),
      "DistributedStrategy{nccl_comm_num=1, fuse_all_reduce_ops=false, "
      "fuse_grad_size_in_MB=32, fuse_grad_size_in_num=8, fuse_by_ring_model=true, "
      "paddle_fuse={given=false, "
      "memory_size_mb=-1, groups_size=1}, use_hierarchical_allreduce=false, "
      "hierarchical_allreduce_inter_nranks=0, use_local_sgd=false, local_sgd_steps=1, "
      "local_sgd_warmup_steps=0, local_sgd_is_warm_steps=-1, sync_nccl_allreduce=true, "
      "comm_timeout_s=300, "
      "exec_strategy={num_threads=0, num_iteration_per_drop_scope=100, use_cuda_graph=false}, "
      "amp=false, amp_configs={dtype=bfloat16, level=O1, use_dynamic_loss_scaling=unset, "
      "init_loss_scaling=unset, incr_every_n_steps=2000, decr_every_n_nan_or_inf=1, "
      "incr_ratio=2, decr_ratio=0.5, custom_white_list=[], custom_black_list=[], "
      "check_kernels=true}, recompute=false, recompute_configs={checkpoints=[]}, "
      "gradient_merge=false, gradient_merge_configs={k_steps=1, avg=true}, "
      "sharding=false, sharding_configs={stage=1, sharding_degree=0}, tensor_parallel=false, "
      "tensor_parallel_configs={tensor_parallel_degree=1}, sync_batch_norm=false, "
      "fuse_gemm_epilogue=false, "
      "fp16_allreduce=false, fp16_allreduce_configs={dtype=float16}, "
      "pipeline=false, pipeline_configs={pp_degree=1, accumulate_steps=1, micro_batch_size=0, "
      "schedule_mode=1F1B}, a_sync=true, a_sync_configs={k_steps=-1, send_queue_size=16, "
      "max_merge_var_num=1, max_staleness=0}, ps_worker_memory_mb=0}");
}

// Parameter-server mode: a_sync=false is sync (built); async and GEO are refused as not built;
// collective settings are refused naming them; in a collective job the PS fields are refused.
TEST(ParameterServerStrategy, ModesAndRefusals) {
  Role ps;
  ps.training_role = "TRAINER";
  ps.server_num = 2;
  ps.trainer_num = 2;
  ps.world_size = 4;
  ps.rank = 2;
  ps.master_port = 1;
  auto error = [&](const std::function<void(DistributedStrategy*)>& set, const Role& role) {
    DistributedStrategy s;
    set(&s);
    try {
      s.Validate(role);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error([](auto* s) { s->a_sync = false; }, ps), "");
  // Paddle's default (a_sync=true) is asynchronous mode; k_steps > 0 with it is GEO.
  EXPECT_EQ(error([](auto*) {}, ps), "");
  EXPECT_EQ(error([](auto* s) { s->a_sync_configs.k_steps = 4; }, ps), "");
  // The asynchronous communicator's queue and merging: async mode only, in range.
  EXPECT_EQ(error(
                [](auto* s) {
                  s->a_sync_configs.send_queue_size = 0;
                  s->a_sync_configs.max_merge_var_num = 4;
                },
                ps),
            "");
  EXPECT_NE(error([](auto* s) { s->a_sync_configs.send_queue_size = -1; }, ps)
                .find("a_sync_configs.send_queue_size=-1 must be >= 0"),
            std::string::npos);
  EXPECT_NE(error([](auto* s) { s->a_sync_configs.max_merge_var_num = 0; }, ps)
                .find("max_merge_var_num=0 >= 1"),
            std::string::npos);
  // max_staleness (keel's): -1 (never wait) or more; only with a communicator.
  EXPECT_EQ(error([](auto* s) { s->a_sync_configs.max_staleness = -1; }, ps), "");
  EXPECT_EQ(error([](auto* s) { s->a_sync_configs.max_staleness = 3; }, ps), "");
  EXPECT_NE(error([](auto* s) { s->a_sync_configs.max_staleness = -2; }, ps)
                .find("a_sync_configs.max_staleness=-2 must be >= 0"),
            std::string::npos);
  EXPECT_NE(error(
                [](auto* s) {
                  s->a_sync_configs.send_queue_size = 0;
                  s->a_sync_configs.max_staleness = 1;
                },
                ps)
                .find("a_sync_configs.max_staleness=1 bounds the communicator's staleness, but "
                      "send_queue_size=0"),
            std::string::npos);
  for (bool geo : {false, true})
    EXPECT_NE(error(
                  [geo](auto* s) {
                    s->a_sync = geo;
                    if (geo) s->a_sync_configs.k_steps = 4;
                    s->a_sync_configs.send_queue_size = 2;
                  },
                  ps)
                  .find(std::string("configure the asynchronous communicator, but this job is ") +
                        (geo ? "GEO" : "synchronous")),
              std::string::npos);
  EXPECT_NE(error(
                [](auto* s) {
                  s->a_sync = false;
                  s->a_sync_configs.k_steps = 4;
                },
                ps)
                .find("a_sync_configs.k_steps=4 asks for GEO but"),
            std::string::npos);
  EXPECT_NE(error(
                [](auto* s) {
                  s->a_sync = false;
                  s->fuse_all_reduce_ops = true;
                },
                ps)
                .find("fuse_all_reduce_ops=true is a collective"),
            std::string::npos);
  EXPECT_NE(error(
                [](auto* s) {
                  s->a_sync = false;
                  s->nccl_comm_num = 2;
                },
                ps)
                .find("nccl_comm_num=2"),
            std::string::npos);
  EXPECT_NE(error(
                [](auto* s) {
                  s->a_sync = false;
                  s->use_local_sgd = true;
                },
                ps)
                .find("use_local_sgd=true"),
            std::string::npos);
  EXPECT_NE(error(
                [](auto* s) {
                  s->a_sync = false;
                  s->amp = true;
                },
                ps)
                .find("amp=true"),
            std::string::npos);
  EXPECT_NE(error([](auto* s) { s->a_sync = false; }, Role()).find("a_sync=false"),
            std::string::npos);
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
      {"fuse MB 0",
       [](DistributedStrategy* s) {
         s->fuse_all_reduce_ops = true;
         s->fuse_grad_size_in_MB = 0;
       },
       Role(), "fuse_grad_size_in_MB=0 must be > 0"},
      {"fuse MB fraction",
       [](DistributedStrategy* s) {
         s->fuse_all_reduce_ops = true;
         s->fuse_grad_size_in_MB = 0.25;
       },
       Role(), ""},
      {"fuse MB without fusion", [](DistributedStrategy* s) { s->fuse_grad_size_in_MB = 0.25; },
       Role(),
       "fuse_grad_size_in_MB=0.25 is set but DistributedStrategy.fuse_all_reduce_ops=false"},
      {"fuse num -1", [](DistributedStrategy* s) { s->fuse_grad_size_in_num = -1; }, Role(),
       "fuse_grad_size_in_num=-1"},
      {"fuse num without fusion", [](DistributedStrategy* s) { s->fuse_grad_size_in_num = 2; },
       Role(), "fuse_grad_size_in_num=2 is set but DistributedStrategy.fuse_all_reduce_ops=false"},
      {"ring model off without fusion",
       [](DistributedStrategy* s) { s->fuse_by_ring_model = false; }, Role(),
       "fuse_by_ring_model=false is set but DistributedStrategy.fuse_all_reduce_ops=false"},
      {"ring model off beside Paddle's flags",
       [](DistributedStrategy* s) {
         s->fuse_all_reduce_ops = true;
         s->paddle_fuse.given = true;
         s->fuse_by_ring_model = false;
       },
       Role(), "fuse_by_ring_model=false would have no effect"},
      {"hierarchical, local world divides world",
       [](DistributedStrategy* s) { s->use_hierarchical_allreduce = true; }, World(8, 4), ""},
      {"hierarchical, explicit inter_nranks not dividing world",
       [](DistributedStrategy* s) {
         s->use_hierarchical_allreduce = true;
         s->hierarchical_allreduce_inter_nranks = 3;
       },
       World(8, 4), "hierarchical_allreduce_inter_nranks=3 does not divide world_size=8"},
      {"inter_nranks negative",
       [](DistributedStrategy* s) {
         s->use_hierarchical_allreduce = true;
         s->hierarchical_allreduce_inter_nranks = -2;
       },
       Role(), "hierarchical_allreduce_inter_nranks=-2"},
      {"inter_nranks without hierarchy is refused, not ignored",
       [](DistributedStrategy* s) { s->hierarchical_allreduce_inter_nranks = 3; }, World(8, 4),
       "hierarchical_allreduce_inter_nranks=3 is set but "
       "DistributedStrategy.use_hierarchical_allreduce=false"},
      {"local sgd steps without local sgd", [](DistributedStrategy* s) { s->local_sgd_steps = 4; },
       Role(), "local_sgd_steps=4 is set but DistributedStrategy.use_local_sgd=false"},
      {"local sgd warm-up without local sgd",
       [](DistributedStrategy* s) { s->local_sgd_warmup_steps = 4; }, Role(),
       "local_sgd_warmup_steps=4 is set but DistributedStrategy.use_local_sgd=false"},
      {"Paddle's warm-up name without local sgd",
       [](DistributedStrategy* s) { s->local_sgd_is_warm_steps = 4; }, Role(),
       "local_sgd_is_warm_steps=4 is set but DistributedStrategy.use_local_sgd=false"},
      {"both warm-up names, different",
       [](DistributedStrategy* s) {
         s->use_local_sgd = true;
         s->local_sgd_is_warm_steps = 4;
         s->local_sgd_warmup_steps = 3;
       },
       Role(),
       "local_sgd_is_warm_steps=4 and DistributedStrategy.local_sgd_warmup_steps=3 disagree"},
      {"both warm-up names, equal",
       [](DistributedStrategy* s) {
         s->use_local_sgd = true;
         s->local_sgd_is_warm_steps = 4;
         s->local_sgd_warmup_steps = 4;
       },
       Role(), ""},
      {"Paddle's fusion flags without fusion",
       [](DistributedStrategy* s) {
         s->paddle_fuse = {true, 16, 1};
       },
       Role(), "are given but DistributedStrategy.fuse_all_reduce_ops=false"},
      {"Paddle's fusion flags beside keel's sizes",
       [](DistributedStrategy* s) {
         s->fuse_all_reduce_ops = true;
         s->fuse_grad_size_in_MB = 4;
         s->paddle_fuse = {true, 16, 1};
       },
       Role(), "fuse_grad_size_in_MB=4 / fuse_grad_size_in_num=8 would be ignored"},
      {"Paddle's groups_size without a memory size has no effect",
       [](DistributedStrategy* s) {
         s->fuse_all_reduce_ops = true;
         s->paddle_fuse = {true, -1, 50};
       },
       Role(), "FLAGS_fuse_parameter_groups_size=50 has no effect unless"},
      {"Paddle's memory size 0 (one group) and groups_size -1",
       [](DistributedStrategy* s) {
         s->fuse_all_reduce_ops = true;
         s->paddle_fuse = {true, 0, -1};
       },
       Role(), ""},
      {"Paddle's groups_size 0 is undefined",
       [](DistributedStrategy* s) {
         s->fuse_all_reduce_ops = true;
         s->paddle_fuse = {true, 16, 0};
       },
       Role(), "FLAGS_fuse_parameter_groups_size=0 must be"},
      {"Paddle's memory size -2",
       [](DistributedStrategy* s) {
         s->fuse_all_reduce_ops = true;
         s->paddle_fuse = {true, -2, 1};
       },
       Role(), "FLAGS_fuse_parameter_memory_size=-2 must be"},
      {"local sgd steps 0",
       [](DistributedStrategy* s) {
         s->use_local_sgd = true;
         s->local_sgd_steps = 0;
       },
       Role(), "local_sgd_steps=0 must be >= 1"},
      {"local sgd warmup negative",
       [](DistributedStrategy* s) {
         s->use_local_sgd = true;
         s->local_sgd_warmup_steps = -1;
       },
       Role(), "local_sgd_warmup_steps=-1"},
      {"timeout 0", [](DistributedStrategy* s) { s->comm_timeout_s = 0; }, Role(),
       "comm_timeout_s=0 must be > 0"},
      {"exec threads negative", [](DistributedStrategy* s) { s->exec_strategy.num_threads = -1; },
       Role(), "exec_strategy.num_threads=-1"},
      {"exec threads 0 is the default",
       [](DistributedStrategy* s) { s->exec_strategy.num_threads = 0; }, Role(), ""},
      {"drop scope 0",
       [](DistributedStrategy* s) { s->exec_strategy.num_iteration_per_drop_scope = 0; }, Role(),
       "exec_strategy.num_iteration_per_drop_scope=0"},
      {"gradient merge k 4",
       [](DistributedStrategy* s) {
         s->gradient_merge = true;
         s->gradient_merge_configs.k_steps = 4;
       },
       Role(), ""},
      {"gradient merge k 0",
       [](DistributedStrategy* s) {
         s->gradient_merge = true;
         s->gradient_merge_configs.k_steps = 0;
       },
       Role(), "gradient_merge_configs.k_steps must be >= 1, got 0"},
      {"gradient merge k without gradient merge",
       [](DistributedStrategy* s) { s->gradient_merge_configs.k_steps = 4; }, Role(),
       "gradient_merge_configs.k_steps=4 is set but DistributedStrategy.gradient_merge=false"},
      {"gradient merge avg without gradient merge",
       [](DistributedStrategy* s) { s->gradient_merge_configs.avg = false; }, Role(),
       "gradient_merge_configs.avg=false is set but DistributedStrategy.gradient_merge=false"},
      {"gradient merge with LocalSGD",
       [](DistributedStrategy* s) {
         s->gradient_merge = true;
         s->use_local_sgd = true;
       },
       Role(),
       "DistributedStrategy.gradient_merge=true does not combine with "
       "DistributedStrategy.use_local_sgd=true"},
      {"gradient merge with fusion",
       [](DistributedStrategy* s) {
         s->gradient_merge = true;
         s->fuse_all_reduce_ops = true;
       },
       Role(),
       "DistributedStrategy.gradient_merge=true does not combine with "
       "DistributedStrategy.fuse_all_reduce_ops=true"},
      {"gradient merge with hierarchy",
       [](DistributedStrategy* s) {
         s->gradient_merge = true;
         s->use_hierarchical_allreduce = true;
       },
       World(4, 2),
       "DistributedStrategy.gradient_merge=true does not combine with "
       "DistributedStrategy.use_hierarchical_allreduce=true"},
      {"gradient merge with CUDA graphs",
       [](DistributedStrategy* s) {
         s->gradient_merge = true;
         s->exec_strategy.use_cuda_graph = true;
       },
       Role(),
       "DistributedStrategy.gradient_merge=true does not combine with "
       "DistributedStrategy.exec_strategy.use_cuda_graph=true"},
      {"gradient merge with amp",
       [](DistributedStrategy* s) {
         s->gradient_merge = true;
         s->amp = true;
         s->amp_configs.dtype = DType::kFloat16;
       },
       Role(), ""},
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
      // Named as the user set it: the field, or Paddle's flag.
      EXPECT_TRUE(e.find("DistributedStrategy.") != std::string::npos ||
                  e.find("FLAGS_fuse_parameter_") != std::string::npos)
          << e;
    }
  }
}

TEST(DistributedStrategy, HierarchicalInterNranksZeroMeansLocalWorldSize) {
  DistributedStrategy s;
  EXPECT_EQ(s.HierarchicalInterNranks(World(8, 4)), 4);
  s.hierarchical_allreduce_inter_nranks = 2;
  EXPECT_EQ(s.HierarchicalInterNranks(World(8, 4)), 2);
}

// x -> fc(5, tanh) -> fc(4, tanh) -> fc(3, softmax) -> cross_entropy -> mean, SGD: three layers,
// so that groupings of layers show.
void BuildThreeLayers(Program& main, Program& startup) {
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 4});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(layers::fc(x, 5, "tanh"), 4, "tanh");
  optimizer::SGD(0.1f).minimize(layers::mean(layers::cross_entropy(layers::fc(h, 3, "softmax"), y)),
                                &startup);
}

// Rank 1 of 4, two ranks per node.
Role TwoNodes() {
  Role r = World(4, 2);
  r.rank = 1;
  r.local_rank = 1;
  return r;
}

// The main and startup program text after minimize's checks and pass for `s` (as fleet runs them).
std::string Transpiled(const DistributedStrategy& s, const Role& role = TwoNodes()) {
  Program main, startup;
  BuildThreeLayers(main, startup);
  s.Validate(role);
  DistributedStrategy::RequireImplemented(s);
  if (s.gradient_merge)
    transpiler::GradientMergePass(gradient_merge::PassOptions(s.gradient_merge_configs))
        .Apply(main, startup);
  if (s.sharding)
    transpiler::ShardingPass({fleet::RingOptionsFor(s, role)}).Apply(main, startup);
  else if (s.use_local_sgd)
    transpiler::LocalSGDPass(fleet::LocalSGDOptionsFor(s, role)).Apply(main, startup);
  else
    transpiler::GradAllReducePass(fleet::GradAllReduceOptionsFor(s, role)).Apply(main, startup);
  return main.ToText() + startup.ToText();
}

// Every setting in the table: an implemented one changes the transpiled program (its pass acts),
// one that is not is refused naming it.
TEST(DistributedStrategy, EverySettingInItsTableActsOrIsRefused) {
  const std::string plain = Transpiled(DistributedStrategy());
  ASSERT_FALSE(DistributedStrategy::Settings().empty());
  for (const DistributedStrategy::Setting& setting : DistributedStrategy::Settings()) {
    SCOPED_TRACE(setting.name);
    DistributedStrategy s;
    EXPECT_FALSE(setting.requested(s)) << "on by default";
    setting.request(&s);
    ASSERT_TRUE(setting.requested(s));
    if (setting.implemented) {
      std::string text;
      ASSERT_EQ(ErrorOf([&] { text = Transpiled(s); }), "");
      EXPECT_NE(text, plain) << "the setting changed nothing in the transpiled program";
    } else {
      std::string e = ErrorOf([&] { DistributedStrategy::RequireImplemented(s); });
      EXPECT_NE(e.find(std::string("DistributedStrategy.") + setting.name), std::string::npos) << e;
      EXPECT_NE(e.find("not implemented"), std::string::npos) << e;
    }
  }
}

// The field names ToString prints ("a", "exec_strategy.num_threads", ...), in order.
std::vector<std::string> FieldNames(const std::string& text) {
  std::vector<std::string> names, prefix;
  std::string word;
  for (size_t i = text.find('{') + 1; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '=') {
      if (i + 1 < text.size() && text[i + 1] == '{') {
        prefix.push_back(word + ".");
        ++i;
      } else {
        std::string full;
        for (const auto& p : prefix) full += p;
        names.push_back(full + word);
      }
      word.clear();
    } else if (c == '}') {
      if (!prefix.empty()) prefix.pop_back();
    } else if (c == ',' || c == ' ') {
      word.clear();
    } else {
      word += c;
    }
  }
  // Values were collected as words too; keep only names (those followed by '=').
  return names;
}

// Every field of DistributedStrategy (as ToString lists them) has an effect or is refused; a new
// field fails here until it is given a row.
TEST(DistributedStrategy, EveryFieldHasAnEffectOrIsRefused) {
  enum Kind {
    kChangesProgram,  // `change` on top of `base` transpiles differently from `base`
    kRefused,         // `change` alone is refused naming the field
    kPinnedBy,        // a multi-process or executor test pins it: `test`
  };
  struct Row {
    const char* field;
    Kind kind;
    std::function<void(DistributedStrategy*)> base, change;
    const char* test = "";
  };
  auto none = [](DistributedStrategy*) {};
  auto fuse = [](DistributedStrategy* s) { s->fuse_all_reduce_ops = true; };
  auto local = [](DistributedStrategy* s) { s->use_local_sgd = true; };
  auto merge = [](DistributedStrategy* s) { s->gradient_merge = true; };
  const std::vector<Row> rows = {
      {"nccl_comm_num", kChangesProgram, none, [](auto* s) { s->nccl_comm_num = 2; }},
      {"fuse_all_reduce_ops", kChangesProgram, none, fuse},
      {"fuse_grad_size_in_MB", kChangesProgram, fuse,
       [](auto* s) { s->fuse_grad_size_in_MB = 1e-6; }},
      {"fuse_grad_size_in_num", kChangesProgram, fuse,
       [](auto* s) { s->fuse_grad_size_in_num = 1; }},
      // Its effect needs a ring to measure: a 2-worker job and the pass's golden pin it.
      {"fuse_by_ring_model", kPinnedBy, none, none,
       "RingModel.TwoWorkersMeasureOnceThenReadTheCache, "
       "GradAllReducePass.RingModelGroupsLeaveWhileBackwardRuns"},
      {"paddle_fuse.given", kChangesProgram, fuse, [](auto* s) { s->paddle_fuse.given = true; }},
      {"paddle_fuse.memory_size_mb", kChangesProgram,
       [](auto* s) {
         s->fuse_all_reduce_ops = true;
         s->paddle_fuse.given = true;
       },
       [](auto* s) { s->paddle_fuse.memory_size_mb = 0; }},
      {"paddle_fuse.groups_size", kChangesProgram,
       [](auto* s) {
         s->fuse_all_reduce_ops = true;
         s->paddle_fuse = {true, 1, 1};
       },
       [](auto* s) { s->paddle_fuse.groups_size = 2; }},
      {"use_hierarchical_allreduce", kChangesProgram, none,
       [](auto* s) { s->use_hierarchical_allreduce = true; }},
      {"hierarchical_allreduce_inter_nranks", kChangesProgram,
       [](auto* s) { s->use_hierarchical_allreduce = true; },
       [](auto* s) { s->hierarchical_allreduce_inter_nranks = 1; }},
      {"use_local_sgd", kChangesProgram, none, local},
      {"local_sgd_steps", kChangesProgram, local, [](auto* s) { s->local_sgd_steps = 3; }},
      {"local_sgd_warmup_steps", kChangesProgram, local,
       [](auto* s) { s->local_sgd_warmup_steps = 2; }},
      {"local_sgd_is_warm_steps", kChangesProgram, local,
       [](auto* s) { s->local_sgd_is_warm_steps = 2; }},
      {"sync_nccl_allreduce", kRefused, none, [](auto* s) { s->sync_nccl_allreduce = false; }},
      {"comm_timeout_s", kPinnedBy, none, none,
       "FleetFaults.StrategyCommTimeoutBoundsEveryCollective"},
      // The executor that runs fleet::main_program() takes exec_strategy.
      {"exec_strategy.num_threads", kPinnedBy, none, none,
       "Executor.ExecStrategyOfTheDistributedStrategyReachesTheExecutorOfMainProgram"},
      {"exec_strategy.num_iteration_per_drop_scope", kPinnedBy, none, none,
       "Executor.ExecStrategyOfTheDistributedStrategyReachesTheExecutorOfMainProgram"},
      {"exec_strategy.use_cuda_graph", kPinnedBy, none, none,
       "ExecutorCudaGraph.IsRefusedOnACpuPlaceBeforeAnyOpRuns (attached), "
       "CudaGraph.OneNcclRankReplaysTheTranspiledProgramExactly (GPU)"},
      // amp acts at minimize (before the passes): its rewrite is pinned by the fleet test.
      {"amp", kPinnedBy, none, none, "FleetAmp.MinimizeRewritesTheForwardAndScalesTheLoss"},
      {"amp_configs.dtype", kRefused, none,
       [](auto* s) { s->amp_configs.dtype = DType::kFloat16; }},
      {"amp_configs.level", kRefused, none, [](auto* s) { s->amp_configs.level = "O2"; }},
      {"amp_configs.use_dynamic_loss_scaling", kRefused, none,
       [](auto* s) { s->amp_configs.use_dynamic_loss_scaling = true; }},
      {"amp_configs.init_loss_scaling", kRefused, none,
       [](auto* s) { s->amp_configs.init_loss_scaling = 8.0f; }},
      {"amp_configs.incr_every_n_steps", kRefused, none,
       [](auto* s) { s->amp_configs.incr_every_n_steps = 10; }},
      {"amp_configs.decr_every_n_nan_or_inf", kRefused, none,
       [](auto* s) { s->amp_configs.decr_every_n_nan_or_inf = 2; }},
      {"amp_configs.incr_ratio", kRefused, none, [](auto* s) { s->amp_configs.incr_ratio = 3; }},
      {"amp_configs.decr_ratio", kRefused, none,
       [](auto* s) { s->amp_configs.decr_ratio = 0.25f; }},
      {"amp_configs.custom_white_list", kRefused, none,
       [](auto* s) { s->amp_configs.custom_white_list = {"relu"}; }},
      {"amp_configs.custom_black_list", kRefused, none,
       [](auto* s) { s->amp_configs.custom_black_list = {"relu"}; }},
      {"amp_configs.check_kernels", kRefused, none,
       [](auto* s) { s->amp_configs.check_kernels = false; }},
      // recompute acts in backward (before the passes): pinned by the fleet test.
      {"recompute", kPinnedBy, none, none, "FleetRecompute.MinimizeReplaysTheMarkedSegments"},
      {"recompute_configs.checkpoints", kRefused, none,
       [](auto* s) { s->recompute_configs.checkpoints = {"h"}; }},
      {"gradient_merge", kChangesProgram, none, merge},
      {"gradient_merge_configs.k_steps", kChangesProgram, merge,
       [](auto* s) { s->gradient_merge_configs.k_steps = 3; }},
      {"gradient_merge_configs.avg", kChangesProgram, merge,
       [](auto* s) { s->gradient_merge_configs.avg = false; }},
      {"sharding", kChangesProgram, none, [](auto* s) { s->sharding = true; }},
      {"sharding_configs.stage", kRefused, none, [](auto* s) { s->sharding_configs.stage = 2; }},
      {"sharding_configs.sharding_degree", kRefused, none,
       [](auto* s) { s->sharding_configs.sharding_degree = 3; }},
      // The model is built tensor-parallel by the DSL; its equality with TP=1 is pinned by the
      // multi-process test, the pass's rings by its golden (tests/fleet/topology_test.cc).
      {"tensor_parallel", kPinnedBy, none, none,
       "TensorParallel.Tp2EqualsTp1OnTheTransformer, TensorParallelPass.StartupGolden"},
      {"tensor_parallel_configs.tensor_parallel_degree", kRefused, none,
       [](auto* s) { s->tensor_parallel_configs.tensor_parallel_degree = 2; }},
      // Rewrites at minimize, on any number of workers: pinned by its pass and fleet tests.
      {"sync_batch_norm", kPinnedBy, none, none,
       "SyncBatchNormPass.RewritesTrainingBatchNormsOfAConvNetMatchesGolden, "
       "SyncBatchNormDataParallel.StrategySwitchTrainsTwoRanksAsOneProcess"},
      // Fuses layers at minimize, the values unchanged bit for bit: pinned by its pass tests.
      {"fuse_gemm_epilogue", kPinnedBy, none, none,
       "FuseGemmEpiloguePass.StrategySwitchReachesTheProgramThroughFleet, "
       "FuseGemmEpiloguePass.TrainingGivesTheSameParametersBitForBit"},
      {"fp16_allreduce", kChangesProgram, none, [](auto* s) { s->fp16_allreduce = true; }},
      {"fp16_allreduce_configs.dtype", kRefused, none,
       [](auto* s) { s->fp16_allreduce_configs.dtype = DType::kBFloat16; }},
      // Cuts the program into stages at minimize: pinned by its pass and multi-process tests.
      {"pipeline", kPinnedBy, none, none,
       "PipelinePass.Pp2MlpStagesMatchGolden, PipelineParallel.Pp2EqualsOneProcess"},
      {"pipeline_configs.pp_degree", kRefused, none,
       [](auto* s) { s->pipeline_configs.pp_degree = 2; }},
      {"pipeline_configs.accumulate_steps", kRefused, none,
       [](auto* s) { s->pipeline_configs.accumulate_steps = 2; }},
      {"pipeline_configs.micro_batch_size", kRefused, none,
       [](auto* s) { s->pipeline_configs.micro_batch_size = 2; }},
      {"pipeline_configs.schedule_mode", kRefused, none,
       [](auto* s) { s->pipeline_configs.schedule_mode = "F-then-B"; }},
      // Parameter-server mode only: refused in a collective job (the parameter-server tests pin
      // them: ParameterServerStrategy.*).
      {"a_sync", kRefused, none, [](auto* s) { s->a_sync = false; }},
      {"a_sync_configs.k_steps", kRefused, none, [](auto* s) { s->a_sync_configs.k_steps = 2; }},
      {"a_sync_configs.send_queue_size", kRefused, none,
       [](auto* s) { s->a_sync_configs.send_queue_size = 2; }},
      {"a_sync_configs.max_merge_var_num", kRefused, none,
       [](auto* s) { s->a_sync_configs.max_merge_var_num = 2; }},
      {"a_sync_configs.max_staleness", kRefused, none,
       [](auto* s) { s->a_sync_configs.max_staleness = 1; }},
      {"ps_worker_memory_mb", kRefused, none, [](auto* s) { s->ps_worker_memory_mb = 1; }},
  };
  const std::vector<std::string> fields = FieldNames(DistributedStrategy().ToString());
  std::vector<std::string> table;
  for (const Row& r : rows) table.push_back(r.field);
  EXPECT_EQ(fields, table) << "DistributedStrategy's fields and this test's rows differ: give a "
                              "new field its row (an effect, a refusal, or the test pinning it)";
  // A field ToString does not print would escape the walk: its size is pinned too.
  EXPECT_EQ(sizeof(DistributedStrategy), 432u)
      << "DistributedStrategy changed: print the new field in ToString and give it a row here";

  for (const Row& r : rows) {
    SCOPED_TRACE(r.field);
    DistributedStrategy base;
    r.base(&base);
    DistributedStrategy changed = base;
    r.change(&changed);
    switch (r.kind) {
      case kChangesProgram: {
        // Two nodes of two ranks; hierarchy's inter_nranks row: one node of four (flat) vs 1 per
        // node.
        Role role = r.field == std::string("hierarchical_allreduce_inter_nranks") ? World(4, 4)
                                                                                  : TwoNodes();
        std::string a, b;
        ASSERT_EQ(ErrorOf([&] { a = Transpiled(base, role); }), "");
        ASSERT_EQ(ErrorOf([&] { b = Transpiled(changed, role); }), "");
        EXPECT_NE(a, b) << "setting the field changed nothing in the transpiled program";
        break;
      }
      case kRefused: {
        std::string e = ErrorOf([&] {
          changed.Validate(TwoNodes());
          DistributedStrategy::RequireImplemented(changed);
        });
        EXPECT_NE(e.find(r.field), std::string::npos) << e;
        break;
      }
      case kPinnedBy:
        EXPECT_STRNE(r.test, "");
        break;
    }
  }
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

// Paddle's fusion flags fill paddle_fuse only when given (keel's own sizes are left alone), and
// Validate refuses the combinations Paddle does not define or that would do nothing.
TEST(DistributedStrategy, PaddleFusionFlagsAreCopiedOnlyWhenGiven) {
  gflags::FlagSaver saver;
  DistributedStrategy s;
  s.fuse_all_reduce_ops = true;
  s.fuse_grad_size_in_MB = 4;
  s.fuse_grad_size_in_num = 2;
  s.ApplyFlagOverrides();  // neither flag given
  EXPECT_FALSE(s.paddle_fuse.given);
  EXPECT_EQ(s.fuse_grad_size_in_MB, 4);
  EXPECT_EQ(s.fuse_grad_size_in_num, 2);
  EXPECT_NO_THROW(s.Validate(Role()));

  // The seed's FLAGS_fuse_parameter_memory_size=16, FLAGS_fuse_parameter_groups_size=50.
  ASSERT_FALSE(gflags::SetCommandLineOption("fuse_parameter_memory_size", "16").empty());
  ASSERT_FALSE(gflags::SetCommandLineOption("fuse_parameter_groups_size", "50").empty());
  DistributedStrategy p;
  p.fuse_all_reduce_ops = true;
  p.ApplyFlagOverrides();
  EXPECT_TRUE(p.paddle_fuse.given);
  EXPECT_EQ(p.paddle_fuse.memory_size_mb, 16);
  EXPECT_EQ(p.paddle_fuse.groups_size, 50);
  EXPECT_EQ(p.fuse_grad_size_in_MB, 32);  // keel's own field is not touched
  EXPECT_NO_THROW(p.Validate(Role()));
  // Beside keel's own sizes they are refused (one of them would be ignored).
  s.ApplyFlagOverrides();
  EXPECT_NE(ErrorOf([&] { s.Validate(Role()); }).find("would be ignored"), std::string::npos);
  // Without fusion they would do nothing.
  DistributedStrategy off;
  off.ApplyFlagOverrides();
  EXPECT_NE(ErrorOf([&] { off.Validate(Role()); })
                .find("FLAGS_fuse_parameter_memory_size=16 / FLAGS_fuse_parameter_groups_size=50 "
                      "are given but DistributedStrategy.fuse_all_reduce_ops=false"),
            std::string::npos);
}

}  // namespace
}  // namespace fleet
}  // namespace keel
