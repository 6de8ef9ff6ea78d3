// coalesce_tensor: the vars become views into one buffer (what a kernel writes into them lands in
// the buffer, and the buffer's values are theirs), copy_data and set_constant, the views survive a
// drop of the local scope, and bad programs are build errors naming the var.
#include <gtest/gtest.h>

#include "executor/executor.h"
#include "framework/dsl/program_guard.h"
#include "framework/runtime/float16.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;
using testing::ExpectErrorContainsAll;

struct Fixture {
  Program prog;
  Block& b = prog.global_block();
  Fixture() {
    for (auto [name, shape] :
         {std::pair<const char*, std::vector<int64_t>>{"a", {2, 3}}, {"b", {4}}}) {
      VarDesc* v = b.Var(name);
      v->set_shape(shape);
    }
    b.Var("fused")->set_shape({10});
  }
  OpDesc* Coalesce(std::map<std::string, Attribute> extra = {}) {
    std::map<std::string, Attribute> attrs{{"numels", std::vector<int64_t>{6, 4}},
                                           {"dtype", static_cast<int>(DType::kFloat32)}};
    for (auto& kv : extra) attrs[kv.first] = kv.second;
    return AppendOp(b, "coalesce_tensor", {{"Input", {"a", "b"}}},
                    {{"Output", {"a", "b"}}, {"FusedOutput", {"fused"}}}, attrs);
  }
};

TEST(CoalesceTensor, VarsBecomeViewsOfTheFusedBuffer) {
  Fixture f;
  f.Coalesce();
  // A kernel writing `b` afterwards (scale of a constant) writes into the buffer.
  AppendOp(f.b, "fill_constant", {}, {{"Out", {"b"}}},
           {{"shape", std::vector<int64_t>{4}},
            {"value", 7.0f},
            {"dtype", static_cast<int>(DType::kFloat32)}});
  AppendOp(f.b, "scale", {{"X", {"fused"}}}, {{"Out", {"fused"}}}, {{"scale", 2.0f}});
  Executor exe;
  for (int run = 0; run < 3; ++run) {  // the views are set again every run
    auto out = exe.Run(f.prog, {}, {"fused", "a", "b"});
    ASSERT_EQ(out[0].dims(), DDim({10}));
    for (int i = 6; i < 10; ++i) EXPECT_EQ(out[0].data<float>()[i], 14.0f) << i;
    EXPECT_EQ(out[1].dims(), DDim({6}));  // no shape of its own yet: the slice's
    EXPECT_EQ(out[2].dims(), DDim({4}));
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[2].data<float>()[i], 14.0f);  // scaled through fused
    const Tensor& a = exe.local_scope().FindVar("a")->tensor();
    const Tensor& fused = exe.local_scope().FindVar("fused")->tensor();
    EXPECT_EQ(a.raw_data(), fused.raw_data());
    EXPECT_EQ(static_cast<const float*>(exe.local_scope().FindVar("b")->tensor().raw_data()),
              fused.data<float>() + 6);
  }
}

TEST(CoalesceTensor, CopyDataAndSetConstant) {
  Fixture f;
  f.b.FindVar("a")->set_is_data(true);
  f.b.FindVar("b")->set_is_data(true);
  f.Coalesce({{"copy_data", true}});
  Executor exe;
  Tensor a = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor bt = Tensor::FromVector<float>({7, 8, 9, 10}, {4});
  auto out = exe.Run(f.prog, {{"a", a}, {"b", bt}}, {"fused", "a"});
  for (int i = 0; i < 10; ++i) EXPECT_EQ(out[0].data<float>()[i], i + 1.0f);
  EXPECT_EQ(out[1].dims(), DDim({2, 3}));  // a keeps its own shape

  Fixture g;
  g.Coalesce({{"set_constant", true}, {"constant", 0.5f}});
  Executor exe2;
  auto c = exe2.Run(g.prog, {}, {"fused", "b"});
  for (int i = 0; i < 10; ++i) EXPECT_EQ(c[0].data<float>()[i], 0.5f);
  EXPECT_EQ(c[1].data<float>()[3], 0.5f);
}

// set_constant in the 16-bit types (keel bench allreduce --fp16_allreduce lays out a 16-bit
// buffer of zeros so).
TEST(CoalesceTensor, SetConstantFillsA16BitBuffer) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(dt));
    Fixture f;
    for (const char* v : {"a", "b", "fused"}) f.b.FindVar(v)->set_dtype(dt);
    f.Coalesce({{"set_constant", true}, {"constant", -2.5f}, {"dtype", static_cast<int>(dt)}});
    Executor exe;
    auto c = exe.Run(f.prog, {}, {"fused"});
    ASSERT_EQ(c[0].dtype(), dt);
    for (int i = 0; i < 10; ++i) {
      const float v = dt == DType::kBFloat16 ? static_cast<float>(c[0].data<bfloat16>()[i])
                                             : static_cast<float>(c[0].data<float16>()[i]);
      EXPECT_EQ(v, -2.5f) << i;
    }
  }
}

TEST(CoalesceTensor, BadProgramsAreBuildErrorsNamingTheVar) {
  {
    Fixture f;
    ExpectErrorContainsAll(ErrorOf([&] {
                             f.Coalesce({{"numels", std::vector<int64_t>{6, 5}}});
                           }),
                           {"coalesce_tensor", "'b'", "[4]", "5 elements"});
  }
  {
    Fixture f;
    f.b.FindVar("b")->set_dtype(DType::kFloat64);
    ExpectErrorContainsAll(ErrorOf([&] { f.Coalesce(); }),
                           {"coalesce_tensor", "'b'", "float64", "float32"});
  }
  {
    Fixture f;
    ExpectErrorContainsAll(ErrorOf([&] {
                             AppendOp(f.b, "coalesce_tensor", {{"Input", {"a", "b"}}},
                                      {{"Output", {"b", "a"}}, {"FusedOutput", {"fused"}}},
                                      {{"numels", std::vector<int64_t>{6, 4}},
                                       {"dtype", static_cast<int>(DType::kFloat32)}});
                           }),
                           {"coalesce_tensor", "Output[0] 'b' must be Input[0] 'a'"});
  }
}

}  // namespace
}  // namespace keel
