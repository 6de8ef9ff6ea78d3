// Tensor, DDim, Scope: memory sharing rules the executor and fused buffers rely on.
#include <gtest/gtest.h>

#include "framework/runtime/scope.h"
#include "framework/runtime/tensor.h"

namespace keel {
namespace {

TEST(DDim, NumelAndUnknownDims) {
  DDim d{2, 3, 4};
  EXPECT_EQ(d.numel(), 24);
  EXPECT_EQ(d.flatten_to_2d(1), (DDim{2, 12}));
  EXPECT_EQ(DDim({-1, 32}).numel(), -1);
  EXPECT_FALSE(DDim({-1, 32}).known());
  EXPECT_EQ(d.str(), "[2, 3, 4]");
  DDim big;
  for (int i = 0; i < DDim::kMaxRank; ++i) big.push_back(1);
  EXPECT_THROW(big.push_back(1), Error);
}

TEST(Tensor, CpuMemoryIs64ByteAligned) {
  for (int64_t n : {1, 3, 17, 1000}) {
    Tensor t(DType::kFloat32, {n});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u) << n;
  }
}

TEST(Tensor, MutableDataReusesAnAllocationThatFits) {
  Tensor t(DType::kFloat32, {10});
  const void* p = t.raw_data();
  t.Resize({5});
  EXPECT_EQ(t.mutable_data<float>(), p);  // smaller: same memory
  t.Resize({20});
  EXPECT_NE(t.mutable_data<float>(), p);  // larger: new memory
}

TEST(Tensor, SliceAndViewShareMemoryAndWriteThrough) {
  Tensor buf = Tensor::FromVector<float>({0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor row = buf.Slice(1, 2);
  EXPECT_EQ(row.dims(), (DDim{1, 2}));
  EXPECT_EQ(row.data<float>()[0], 2.0f);
  Tensor v = buf.View({2}, 4);
  v.mutable_data<float>()[1] = 50.0f;  // fits: stays inside buf
  EXPECT_EQ(buf.data<float>()[5], 50.0f);
  EXPECT_THROW(buf.View({4}, 4), Error);
  EXPECT_THROW(buf.Slice(2, 4), Error);
}

TEST(Tensor, CloneIsDeepAndItemConverts) {
  Tensor a = Tensor::FromVector<double>({2.5}, {1});
  Tensor b = a.Clone();
  b.data<double>()[0] = 1.0;
  EXPECT_EQ(a.item<double>(), 2.5);
  EXPECT_EQ(a.item<int>(), 2);
  EXPECT_THROW(Tensor::FromVector<float>({1, 2}, {2}).item<float>(), Error);
  EXPECT_THROW(a.data<float>(), Error);  // wrong type
}

TEST(Tensor, UninitializedAccessIsAnError) {
  Tensor t;
  t.Resize({2});
  EXPECT_THROW(t.raw_data(), Error);
  Tensor u;
  u.Resize({-1, 3});
  EXPECT_THROW(u.mutable_data<float>(), Error);
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kBool,
                  DType::kFloat16, DType::kBFloat16, DType::kUInt8, DType::kInt8})
    EXPECT_EQ(DTypeFromName(DTypeName(t)), t);
  EXPECT_EQ(SizeOf(DType::kBFloat16), 2u);
  EXPECT_THROW(DTypeFromName("float128"), Error);
}

TEST(Scope, ParentChainLookup) {
  Scope root;
  root.Var("w")->mutable_tensor()->Alloc(DType::kFloat32, {2});
  Scope& kid = root.NewScope();
  kid.Var("tmp");
  EXPECT_EQ(kid.FindVar("w"), root.FindVar("w"));
  EXPECT_EQ(root.FindVar("tmp"), nullptr);
  EXPECT_EQ(kid.FindLocalVar("w"), nullptr);
  EXPECT_EQ(kid.Var("tmp"), kid.FindVar("tmp"));
}

}  // namespace
}  // namespace keel
