#include "tests/util/gpu_test_util.h"

#include <algorithm>
#include <cmath>

#include "tests/util/op_test_util.h"

namespace keel::testing {

double MaxRelErr(const Tensor& a, const Tensor& b) {
  std::vector<double> x = ToDouble(a), y = ToDouble(b);
  EXPECT_EQ(x.size(), y.size());
  double err = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (std::isnan(y[i]) && std::isnan(x[i])) continue;
    if (std::isnan(x[i]) || std::isnan(y[i])) return INFINITY;
    err = std::max(err, std::abs(x[i] - y[i]) / std::max(std::abs(y[i]), 1.0));
  }
  return err;
}

Tensor R(const DDim& d, double lo, double hi, uint64_t seed, DType dt) {
  return RandomTensor(d, dt, lo, hi, seed);
}

OpCase Op(std::string name, std::string type,
          std::vector<std::pair<std::string, std::vector<Tensor>>> inputs,
          std::vector<std::pair<std::string, int>> outputs, std::map<std::string, Attribute> attrs) {
  OpCase c;
  c.name = std::move(name);
  c.type = std::move(type);
  c.inputs = std::move(inputs);
  c.outputs = std::move(outputs);
  c.attrs = std::move(attrs);
  return c;
}

}  // namespace keel::testing
