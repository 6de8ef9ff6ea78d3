// Op traits, not names: the executor, the event plan and the CUDA-graph capture learn what they
// need of an op from the traits its schema declares (framework/op/op_registry.h, OpTraits), so
// a new collective or a new op that fuses outputs needs no executor change.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "framework/op/op_registry.h"
#include "tests/util/golden.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

TEST(OpTraits, CollectivesFusedBuffersAndHostDrawsDeclareThemselves) {
  for (const char* t :
       {"c_allreduce_sum", "c_allreduce_max", "c_allreduce_min", "c_allreduce_prod"}) {
    EXPECT_TRUE(OpRegistry::Traits(t).on_ring) << t;
    EXPECT_TRUE(OpRegistry::Traits(t).all_reduces_in_place) << t;
  }
  for (const char* t :
       {"c_broadcast", "c_allgather", "c_reducescatter", "c_barrier", "c_sync_comm_stream"}) {
    EXPECT_TRUE(OpRegistry::Traits(t).on_ring) << t;
    EXPECT_FALSE(OpRegistry::Traits(t).all_reduces_in_place) << t;
  }
  EXPECT_FALSE(OpRegistry::Traits("c_sync_calc_stream").on_ring);
  EXPECT_FALSE(OpRegistry::Traits("c_comm_init").barrier.empty());
  EXPECT_FALSE(OpRegistry::Traits("c_comm_init").not_capturable.empty());
  EXPECT_EQ(OpRegistry::Traits("coalesce_tensor").fused_slot, "FusedOutput");
  EXPECT_EQ(OpRegistry::Traits("coalesce_tensor").slices_slot, "Output");
  for (const char* t : {"uniform_random", "gaussian_random"})
    EXPECT_NE(OpRegistry::Traits(t).not_capturable.find("host"), std::string::npos) << t;
  // Ordinary ops, grad ops (which do not inherit their forward's traits) and unknown types.
  for (const char* t : {"mul", "conv2d", "sgd", "dropout", "mul_grad", "no_such_op"}) {
    const OpTraits& tr = OpRegistry::Traits(t);
    EXPECT_FALSE(tr.on_ring || !tr.barrier.empty() || !tr.fused_slot.empty() ||
                 !tr.not_capturable.empty())
        << t;
  }
}

// Every model-parallel op but the pipeline's transfers has a one-process form (what fleet's
// one-process inference model makes of it), a registered op that takes the same slots.
TEST(OpTraits, ModelParallelOpsDeclareTheirOneProcessForm) {
  int forms = 0;
  for (const std::string& t : OpRegistry::OpTypes()) {
    const OpTraits& tr = OpRegistry::Traits(t);
    if (!tr.shards_model) {
      EXPECT_TRUE(tr.one_process_form.empty()) << t;
      continue;
    }
    if (t == "send_v2" || t == "recv_v2") {  // a pipeline's whole program holds none
      EXPECT_TRUE(tr.one_process_form.empty()) << t;
      continue;
    }
    SCOPED_TRACE(t + " -> " + tr.one_process_form);
    const OpSchema* one = OpRegistry::Find(tr.one_process_form);
    ASSERT_NE(one, nullptr);
    const OpSchema* op = OpRegistry::Find(t);
    auto names = [](const std::vector<ArgDef>& args) {
      std::set<std::string> n;
      for (const ArgDef& a : args) n.insert(a.name);
      return n;
    };
    EXPECT_EQ(names(one->inputs()), names(op->inputs()));
    EXPECT_EQ(names(one->outputs()), names(op->outputs()));
    ++forms;
  }
  // c_identity, mp_allreduce_sum, c_split, c_concat, c_embedding, c_softmax_with_cross_entropy,
  // c_top1
  EXPECT_EQ(forms, 7);
  EXPECT_EQ(OpRegistry::Traits("c_embedding").one_process_form, "lookup_table");
  EXPECT_EQ(OpRegistry::Traits("c_softmax_with_cross_entropy").one_process_form,
            "softmax_with_cross_entropy");
  EXPECT_EQ(OpRegistry::Traits("c_top1").one_process_form, "top_k");
  EXPECT_EQ(OpRegistry::Traits("c_identity").one_process_form, "assign");
}

// No string literal in executor/ is an op type (or the start of one, like "c_allreduce_").
TEST(OpTraits, TheExecutorNamesNoOpType) {
  const std::vector<std::string> types = OpRegistry::OpTypes();
  ASSERT_GT(types.size(), 50u);
  auto files =
      RunCommand("ls " + SourcePath("executor") + "/*.cc " + SourcePath("executor") + "/*.h");
  std::istringstream list(files.output);
  std::string file;
  int read = 0;
  const std::regex literal("\"([a-z0-9_]+)\"");
  while (std::getline(list, file)) {
    std::ifstream in(file);
    ASSERT_TRUE(in) << file;
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    ++read;
    for (auto it = std::sregex_iterator(s.begin(), s.end(), literal); it != std::sregex_iterator();
         ++it) {
      const std::string word = (*it)[1];
      for (const std::string& t : types)
        EXPECT_FALSE(t == word || (word.back() == '_' && t.rfind(word, 0) == 0))
            << file << " names op type " << t << " (\"" << word << "\"): declare a trait instead";
    }
  }
  EXPECT_GE(read, 10);
}

}  // namespace
}  // namespace keel::testing
