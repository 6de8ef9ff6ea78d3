// TensorDataset (framework/data/tensor_dataset.h): example i is row i of every column, and
// columns that disagree are refused naming the column.
#include "framework/data/tensor_dataset.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;
using testing::ExpectErrorContainsAll;

TEST(TensorDataset, ExampleIIsRowIOfEveryColumn) {
  Tensor x = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor y = Tensor::FromVector<int64_t>({7, 8, 9}, {3});
  TensorDataset ds({"x", "y"}, {x, y});
  EXPECT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.names(), (std::vector<std::string>{"x", "y"}));
  Example ex = ds.Get(1);
  ASSERT_EQ(ex[0].dims(), (DDim{2}));
  EXPECT_EQ(ex[0].data<float>()[0], 3);
  EXPECT_EQ(ex[0].data<float>()[1], 4);
  EXPECT_EQ(ex[1].dims(), (DDim{1}));  // a column [n] gives fields [1]
  EXPECT_EQ(ex[1].data<int64_t>()[0], 8);
  ExpectErrorContainsAll(ErrorOf([&] { ds.Get(3); }), {"TensorDataset: index 3 outside [0, 3)"});
}

TEST(TensorDataset, RefusesColumnsThatDisagree) {
  Tensor a = Tensor::FromVector<float>({1, 2, 3}, {3});
  Tensor b = Tensor::FromVector<float>({1, 2}, {2});
  ExpectErrorContainsAll(ErrorOf([&] {
                           TensorDataset({"a", "b"}, {a, b});
                         }),
                         {"column 'b' holds 2 examples"});
  ExpectErrorContainsAll(ErrorOf([&] { TensorDataset({"a"}, {a, b}); }), {"1 names for 2 columns"});
  ExpectErrorContainsAll(ErrorOf([&] { TensorDataset({"a"}, {Tensor()}); }),
                         {"column 'a' must be a CPU tensor"});
}

}  // namespace
}  // namespace keel
