#include "tests/util/named_tensors.h"

#include <gtest/gtest.h>

#include <cstring>

namespace keel::testing {

const Tensor* FindTensor(const NamedTensors& t, const std::string& name) {
  for (auto& kv : t)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

void ExpectHoldsBitForBit(const NamedTensors& got, const NamedTensors& want,
                          const std::string& got_what) {
  for (const auto& [name, t] : want) {
    const Tensor* g = FindTensor(got, name);
    ASSERT_NE(g, nullptr) << name << " is not in " << got_what;
    ASSERT_EQ(g->dims(), t.dims()) << name;
    EXPECT_EQ(0, std::memcmp(g->raw_data(), t.raw_data(), t.nbytes())) << name;
  }
}

}  // namespace keel::testing
