// Crafted programs never crash the process: ValidateProgram refuses them at load (unknown ops,
// slots, attributes and variables, bad dims, block calls that recurse), shape inference refuses
// axis-like attributes out of range, and DDim's element counts are checked for overflow. The
// fuzz-like cases set every integer attribute of real models' programs to extreme values and run
// what loads: the outcome is a run or a keel::Error, never a signal or another exception.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <functional>
#include <map>
#include <variant>

#include "executor/executor.h"
#include "executor/executor_io.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/program_guard.h"
#include "framework/io/atomic_file.h"
#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "framework/op/op_registry.h"
#include "framework/op/validate_program.h"
#include "models/model_zoo.h"
#include "tests/util/subprocess.h"

namespace keel {
namespace {

using testing::Contains;

class ProgramValidation : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir(); }
  void TearDown() override { testing::RunCommand("rm -rf " + dir_); }

  // An MLP inference model saved to dir_/model: x [-1, 4] -> fc -> relu -> fc -> softmax.
  void SaveMlpInferenceModel() {
    Program main, startup;
    startup.set_random_seed(1);
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, 4});
    Var h = layers::fc(x, 3, "relu");
    Var out = layers::fc(h, 2, "softmax");
    Executor exe;
    exe.Run(startup);
    save_inference_model(dir_ + "/model", {"x"}, {out.name()}, exe, main);
    target_ = out.name();
  }

  // Rewrites dir_/model/__model__ through `edit` (parsed without validation, as a crafted file).
  void CraftModel(const std::function<void(Program*)>& edit) {
    const std::string path = dir_ + "/model/" + kModelFile;
    std::unique_ptr<Program> p = Program::ParseFromString(ReadFile(path), path);
    edit(p.get());
    SaveProgram(*p, path);
    // An attacker rewrites the pair: the params file's record of __model__ matches the new one,
    // so the crafted program reaches validation (the pair check alone would refuse it).
    const std::string params = dir_ + "/model/params.safetensors";
    std::map<std::string, std::string> metadata;
    NamedTensors tensors = LoadSafetensors(params, &metadata);
    metadata["keel.model_crc32"] = Crc32Hex(ReadFile(path));
    SaveSafetensors(params, tensors, metadata);
  }

  // zlib's CRC-32 (reflected polynomial 0xEDB88320), as lowercase hex.
  static std::string Crc32Hex(const std::string& bytes) {
    uint32_t crc = 0xFFFFFFFFu;
    for (unsigned char b : bytes) {
      crc ^= b;
      for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%08x", crc ^ 0xFFFFFFFFu);
    return hex;
  }

  // load_inference_model + Run on a [2, 4] batch; returns the keel::Error's text ("" when it ran).
  std::string LoadAndRun() {
    try {
      Executor exe;
      InferenceModel m = load_inference_model(dir_ + "/model", exe);
      Tensor x(DType::kFloat32, DDim({2, 4}));
      for (int i = 0; i < 8; ++i) x.data<float>()[i] = 0.1f * i;
      exe.Run(*m.program, {{"x", x}}, m.targets);
      return "";
    } catch (const Error& e) {
      return e.what();
    }
  }

  OpDesc* FirstOp(Program* p, const std::string& type) {
    for (auto& op : p->global_block().ops())
      if (op->type() == type) return op.get();
    ADD_FAILURE() << "no " << type << " op";
    return nullptr;
  }

  std::string dir_, target_;
};

TEST_F(ProgramValidation, TheIssuesCraftedProgramsAreErrorsNotCrashes) {
  SaveMlpInferenceModel();
  ASSERT_EQ(LoadAndRun(), "");
  const std::string model = dir_ + "/model/" + kModelFile;
  struct Case {
    const char* name;
    std::function<void(Program*)> edit;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"shape_overflow_2^62",
       [](Program* p) {
         p->global_block().Var("x")->set_shape({4611686018427387905LL, 4});
       },
       {model, "variable 'x'", "overflows int64"}},
      {"shape_overflow_2^64",
       [](Program* p) {
         p->global_block().Var("x")->set_shape({1LL << 32, 1LL << 32});
       },
       {"variable 'x'", "[4294967296, 4294967296]", "overflows int64"}},
      {"negative_dim",
       [](Program* p) {
         p->global_block().Var("x")->set_shape({-2, 4});
       },
       {"variable 'x'", "dim -2"}},
      {"mul_x_num_col_dims_int_min",
       [this](Program* p) { FirstOp(p, "mul")->SetAttr("x_num_col_dims", INT_MIN); },
       {"op mul", "x_num_col_dims=-2147483648"}},
      {"mul_x_num_col_dims_int_max",
       [this](Program* p) { FirstOp(p, "mul")->SetAttr("x_num_col_dims", INT_MAX); },
       {"mul", "x_num_col_dims"}},
      {"elementwise_add_axis_int_max",
       [this](Program* p) { FirstOp(p, "elementwise_add")->SetAttr("axis", INT_MAX); },
       {"elementwise_add", "axis 2147483647"}},
      {"elementwise_add_axis_int_min",
       [this](Program* p) { FirstOp(p, "elementwise_add")->SetAttr("axis", INT_MIN); },
       {"elementwise_add", "axis -2147483648"}},
      {"softmax_axis_int_max",
       [this](Program* p) { FirstOp(p, "softmax")->SetAttr("axis", INT_MAX); },
       {"softmax", "axis 2147483647"}},
      {"conditional_block_calls_itself",
       [](Program* p) {
         p->global_block().Var("c")->set_dtype(DType::kBool);
         Block& sub = p->AppendBlock(0);
         OpDesc* inner = sub.AppendOp("conditional_block");
         inner->SetInput("Cond", {"c"});
         inner->SetAttr("sub_block", BlockRef{1});
         OpDesc* outer = p->global_block().AppendOp("conditional_block");
         outer->SetInput("Cond", {"c"});
         outer->SetAttr("sub_block", BlockRef{1});
       },
       {"block 1 op #0", "names block 1, whose parent is block 0", "no recursion"}},
      {"block_out_of_range",
       [](Program* p) {
         p->global_block().Var("c")->set_dtype(DType::kBool);
         OpDesc* op = p->global_block().AppendOp("conditional_block");
         op->SetInput("Cond", {"c"});
         op->SetAttr("sub_block", BlockRef{7});
       },
       {"names block 7"}},
      {"unknown_op",
       [](Program* p) { p->global_block().AppendOp("frobnicate"); },
       {"unknown op type 'frobnicate'"}},
      {"unknown_slot",
       [this](Program* p) { FirstOp(p, "relu")->SetInput("Bias", {"x"}); },
       {"op relu has no input slot 'Bias'"}},
      {"undeclared_var",
       [this](Program* p) { FirstOp(p, "relu")->SetInput("X", {"ghost"}); },
       {"variable 'ghost'", "not declared"}},
      {"missing_input",
       [this](Program* p) { FirstOp(p, "mul")->SetInput("Y", {}); },
       {"op mul: input Y is not set"}},
      {"unknown_attr",
       [this](Program* p) { FirstOp(p, "softmax")->SetAttr("use_cudnn_magic", true); },
       {"op softmax has no attribute 'use_cudnn_magic'", "knows: axis"}},
      {"attr_of_wrong_type",
       [this](Program* p) { FirstOp(p, "softmax")->SetAttr("axis", std::string("last")); },
       {"attribute 'axis' must be int, got string"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SaveMlpInferenceModel();
    CraftModel(c.edit);
    std::string err = LoadAndRun();
    ASSERT_FALSE(err.empty()) << "the crafted program loaded and ran";
    for (const auto& e : c.expected) EXPECT_TRUE(Contains(err, e)) << err;
  }
}

TEST_F(ProgramValidation, DDimElementCountsAreChecked) {
  EXPECT_EQ(DDim({1LL << 31, 1LL << 31}).numel(), 1LL << 62);
  EXPECT_EQ(DDim({-1, 4}).numel(), -1);
  for (const DDim& d :
       {DDim({4611686018427387905LL, 4}), DDim({1LL << 32, 1LL << 32}), DDim({3, 1LL << 62})}) {
    try {
      d.numel();
      ADD_FAILURE() << d.str() << " gave a count";
    } catch (const Error& e) {
      EXPECT_TRUE(Contains(e.what(), "overflows int64")) << e.what();
      EXPECT_TRUE(Contains(e.what(), d.str())) << e.what();
    }
  }
  // Bytes past 2^63 are refused before any allocation.
  Tensor t;
  try {
    t.Alloc(DType::kFloat64, DDim({1LL << 60, 2}));
    ADD_FAILURE() << "allocated 2^67 bytes";
  } catch (const Error& e) {
    EXPECT_TRUE(Contains(e.what(), "more than 2^63 bytes")) << e.what();
  }
}

// Paddle attributes keel does not implement are refused, naming op, attribute and the known ones,
// whether the program is built through the DSL's checks or handed to the executor as is.
TEST_F(ProgramValidation, UndeclaredAttributesAreRefusedNamingOpAttrAndKnownOnes) {
  struct Case {
    const char* op;
    const char* attr;
    Attribute value;
    const char* known;  // one of the attributes the message lists
  };
  const std::vector<Case> cases = {
      {"pool2d", "adaptive", true, "ksize"},
      {"conv2d", "padding_algorithm", std::string("SAME"), "paddings"},
      {"batch_norm", "trainable_statistics", true, "use_global_stats"},
      {"softmax_with_cross_entropy", "use_softmax", false, "axis"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    Program main, startup;
    ProgramGuard g(main, startup);
    Var img = layers::data("img", {-1, 2, 4, 4});
    Var label = layers::data("label", {-1, 1}, DType::kInt64);
    Var conv = layers::conv2d(img, 2, 3, 1, 1);
    Var bn = layers::batch_norm(conv);
    Var pool = layers::pool2d(bn, 2, "max", 2);
    Var logits = layers::fc(pool, 3);
    Var loss = layers::mean(layers::softmax_with_cross_entropy(logits, label));
    OpDesc* op = nullptr;
    for (auto& o : main.global_block().ops())
      if (o->type() == c.op) op = o.get();
    ASSERT_NE(op, nullptr);
    op->SetAttr(c.attr, c.value);
    const std::string want = std::string("op ") + c.op + " has no attribute '" + c.attr + "'";
    // The executor, on a program built by hand.
    Executor exe;
    exe.Run(startup);
    Tensor x(DType::kFloat32, DDim({1, 2, 4, 4}));
    for (int i = 0; i < 32; ++i) x.data<float>()[i] = 0.01f * i;
    Tensor y(DType::kInt64, DDim({1, 1}));
    *y.data<int64_t>() = 1;
    try {
      exe.Run(main, {{"img", x}, {"label", y}}, {loss.name()});
      ADD_FAILURE() << "ran with " << c.attr;
    } catch (const Error& e) {
      EXPECT_TRUE(Contains(e.what(), want)) << e.what();
      EXPECT_TRUE(Contains(e.what(), c.known)) << e.what();
    }
    // The schema check every DSL-built op passes through.
    try {
      InferShapeAtBuild(op, &main.global_block());
      ADD_FAILURE() << "completed with " << c.attr;
    } catch (const Error& e) {
      EXPECT_TRUE(Contains(e.what(), want)) << e.what();
    }
    // op_role and op_role_var are every op's.
    op->RemoveAttr(c.attr);
    op->SetAttr(kOpRoleVarAttr, std::vector<std::string>{"a", "b"});
    EXPECT_NO_THROW(ValidateProgram(main, "program"));
  }
}

// Every integer attribute of the built-in models' programs set to extreme values; each mutant is
// saved, loaded and run: a keel::Error or a run, never a crash or a foreign exception.
struct Subject {
  const char* model;
  bool train;  // the training program (forward, backward, update) or the test one
  int64_t batch;
};

class ProgramFuzz : public ::testing::TestWithParam<Subject> {};

std::vector<Attribute> Mutants(const Attribute& a) {
  std::vector<Attribute> out;
  if (std::holds_alternative<int>(a)) {
    for (int v : {INT_MIN, -1000000, -7, 7, 1000000, INT_MAX}) out.push_back(v);
  } else if (const auto* v = std::get_if<std::vector<int>>(&a)) {
    out.push_back(std::vector<int>{});
    out.push_back(std::vector<int>(DDim::kMaxRank + 2, 1));
    for (int x : {INT_MIN, -7, INT_MAX})
      for (size_t i = 0; i < std::max<size_t>(v->size(), 1); ++i) {
        std::vector<int> m = v->empty() ? std::vector<int>{0} : *v;
        m[i] = x;
        out.push_back(m);
      }
  } else if (std::holds_alternative<int64_t>(a)) {
    for (int64_t v : {INT64_MIN, int64_t{-7}, INT64_MAX}) out.push_back(v);
  }
  return out;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

TEST_P(ProgramFuzz, ExtremeIntegerAttributesAreRunsOrErrors) {
  const Subject s = GetParam();
  // A mutant may ask for a legal but huge tensor: let it fail to allocate (a keel::Error) well
  // before it could push a shared machine into swap.
  // (Under AddressSanitizer, whose shadow memory needs terabytes of address space, its own
  // allocation cap does this: tools/sanitize.sh.)
  if (!kAddressSanitizer) {
    struct rlimit as;
    ASSERT_EQ(getrlimit(RLIMIT_AS, &as), 0);
    const rlim_t cap = rlim_t{8} << 30;
    if (as.rlim_cur == RLIM_INFINITY || as.rlim_cur > cap) {
      as.rlim_cur = cap;
      ASSERT_EQ(setrlimit(RLIMIT_AS, &as), 0);
    }
  }
  models::ModelConfig cfg;
  cfg.name = s.model;
  cfg.seed = 1;
  cfg.hidden = 8;
  cfg.batch_size = s.batch;
  models::TrainableModel m = models::BuildModel(cfg);
  FeedMap feed;
  m.next_batch(s.batch, &feed);
  const Program& program = s.train ? *m.main : *m.test;
  const std::string fetch = s.train ? m.loss : m.prediction;
  const std::string dir = testing::MakeTempDir(), path = dir + "/__model__";
  {
    Executor exe;
    exe.Run(*m.startup);
    exe.Run(program, feed, {fetch});  // the unmutated program runs
  }

  int runs = 0, errors = 0;
  for (int b = 0; b < program.num_blocks(); ++b) {
    for (size_t i = 0; i < program.block(b).num_ops(); ++i) {
      const OpDesc& op = *program.block(b).op(i);
      for (const auto& [name, value] : op.attrs()) {
        if (IsFrameworkAttr(name)) continue;
        for (const Attribute& mutant : Mutants(value)) {
          SCOPED_TRACE("block " + std::to_string(b) + " op #" + std::to_string(i) + " " +
                       op.type() + " " + name + "=" + AttrToString(mutant));
          std::unique_ptr<Program> p = program.Clone();
          p->block(b).op(i)->SetAttr(name, mutant);
          SaveProgram(*p, path);
          try {
            std::unique_ptr<Program> loaded = LoadProgram(path);
            Executor exe;  // each mutant's plan and workspaces go with it
            exe.Run(*m.startup);
            exe.Run(*loaded, feed, {fetch});
            ++runs;
          } catch (const Error&) {
            ++errors;
          } catch (const std::exception& e) {
            ADD_FAILURE() << "not a keel::Error: " << e.what();
          }
        }
      }
    }
  }
  EXPECT_GT(errors, 0);
  testing::RunCommand("rm -rf " + dir);
  std::printf("%s %s: %d mutants ran, %d refused\n", s.model, s.train ? "train" : "test", runs,
              errors);
}

INSTANTIATE_TEST_SUITE_P(Models, ProgramFuzz,
                         ::testing::Values(Subject{"mlp", true, 4}, Subject{"transformer", true, 2},
                                           Subject{"resnet", false, 1}),
                         [](const ::testing::TestParamInfo<Subject>& info) {
                           return std::string(info.param.model) +
                                  (info.param.train ? "_train" : "_test");
                         });

}  // namespace
}  // namespace keel
