#include "tests/util/image_op_cases.h"

#include <utility>

#include "tests/util/lowp_test_util.h"

namespace keel::testing {

Tensor RandomFloats(const DDim& dims, DType dt, double lo, double hi, uint64_t seed) {
  if (dt == DType::kBFloat16 || dt == DType::kFloat16)
    return ConvertTensor(RandomTensor(dims, DType::kFloat32, lo, hi, seed), dt);
  return RandomTensor(dims, dt, lo, hi, seed);
}

OpCase ConvCase(const ConvParams& p, DType dt) {
  OpCase c;
  c.name = p.name;
  c.type = "conv2d";
  c.inputs = {{"Input", {RandomFloats(p.x, dt, -1, 1, 101)}},
              {"Filter", {RandomFloats(p.filter, dt, -1, 1, 102)}}};
  c.outputs = {{"Output", 1}};
  c.attrs = {{"strides", p.strides},
             {"paddings", p.paddings},
             {"dilations", p.dilations},
             {"groups", p.groups}};
  return c;
}

OpCase PoolCase(std::string name, const DDim& x, const std::string& type, std::vector<int> k,
                std::vector<int> s, std::vector<int> p, bool global, bool exclusive, bool ceil_mode,
                DType dt) {
  OpCase c;
  c.name = std::move(name);
  c.type = "pool2d";
  c.inputs = {{"X", {RandomFloats(x, dt, -2, 2, 21)}}};
  c.attrs = {{"pooling_type", type},
             {"ksize", k},
             {"strides", s},
             {"paddings", p},
             {"global_pooling", global},
             {"exclusive", exclusive},
             {"ceil_mode", ceil_mode}};
  return c;
}

}  // namespace keel::testing
