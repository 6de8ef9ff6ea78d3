// transpiler::VarUses, the readers-and-writers index the passes decide from: an entry per (op,
// slot, argument) with its block, op and slot, in program order; uses in a sub-block; the fused
// buffers a slice belongs to (coalesce_tensor's traits); OnlyBy.
#include "transpiler/var_uses.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace keel {
namespace {

OpDesc* Op(Block& b, const std::string& type, const OpDesc::VarMap& in, const OpDesc::VarMap& out) {
  OpDesc* op = b.AppendOp(type);
  for (const auto& [slot, args] : in) op->SetInput(slot, args);
  for (const auto& [slot, args] : out) op->SetOutput(slot, args);
  return op;
}

std::string Text(const std::vector<transpiler::VarUse>& uses) {
  std::string s;
  for (const auto& u : uses)
    s += std::to_string(u.block) + ":" + std::to_string(u.op) + ":" + u.slot + " ";
  return s;
}

TEST(VarUses, ListsEachOpSlotAndArgumentInProgramOrder) {
  Program p;
  Block& g = p.global_block();
  Op(g, "coalesce_tensor", {{"Input", {"a", "b"}}},
     {{"Output", {"a", "b"}}, {"FusedOutput", {"f"}}});
  Op(g, "elementwise_add", {{"X", {"a"}}, {"Y", {"a"}}}, {{"Out", {"c"}}});
  Op(g, "scale", {{"X", {"c"}}}, {{"Out", {"c"}}});
  Block& sub = p.AppendBlock(0);
  Op(sub, "scale", {{"X", {"b"}}}, {{"Out", {"d"}}});
  const transpiler::VarUses uses(p);

  // An op reading a var through two slots counts twice, as its argument lists do.
  EXPECT_EQ(Text(uses.Readers("a")), "0:0:Input 0:1:X 0:1:Y ");
  EXPECT_EQ(Text(uses.Writers("a")), "0:0:Output ");
  EXPECT_EQ(Text(uses.Writers("c")), "0:1:Out 0:2:Out ");
  EXPECT_EQ(Text(uses.Readers("b")), "0:0:Input 1:0:X ");
  EXPECT_EQ(Text(uses.Readers("nothing")), "");

  EXPECT_FALSE(uses.InSubBlock("a"));
  EXPECT_TRUE(uses.InSubBlock("b"));  // read there
  EXPECT_TRUE(uses.InSubBlock("d"));  // written there
  EXPECT_FALSE(uses.InSubBlock("nothing"));

  EXPECT_EQ(uses.Buffers("a"), std::vector<std::string>{"f"});
  EXPECT_EQ(uses.Buffers("b"), std::vector<std::string>{"f"});
  EXPECT_TRUE(uses.Buffers("c").empty());

  EXPECT_TRUE(transpiler::OnlyBy(uses.Writers("a"), 0, 0));
  EXPECT_FALSE(transpiler::OnlyBy(uses.Writers("a"), 0, 1));
  EXPECT_FALSE(transpiler::OnlyBy(uses.Writers("c"), 0, 1));  // two writers
  EXPECT_FALSE(transpiler::OnlyBy(uses.Writers("d"), 0, 0));  // op 0 of block 1
  EXPECT_TRUE(transpiler::OnlyBy(uses.Writers("d"), 1, 0));
  EXPECT_FALSE(transpiler::OnlyBy(uses.Writers("nothing"), 0, 0));
}

}  // namespace
}  // namespace keel
