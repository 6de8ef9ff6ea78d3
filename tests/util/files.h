// Files in tests: a fixture with a fresh temporary directory, whole files read and written, a
// directory's entries, a tensor's bytes (to compare tensors bit for bit).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "framework/runtime/tensor.h"

namespace keel::testing {

// A test with its own fresh directory under /tmp (dir_), removed after the test.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

// The whole file; "" when it cannot be read.
std::string ReadText(const std::string& path);
// Writes `bytes` to `path` as they are (replacing it; not atomically, unlike WriteFileAtomic).
void WriteText(const std::string& path, const std::string& bytes);
// The names of `dir`'s entries, sorted.
std::vector<std::string> DirEntries(const std::string& dir);
// The bytes of `t`'s elements.
std::string TensorBytes(const Tensor& t);
// A tensor of `dtype` and `dims` holding the bytes of `values` (float16 given as uint16 bits, ...).
template <typename T>
Tensor MakeTensor(DType dtype, const DDim& dims, const std::vector<T>& values) {
  Tensor t(dtype, dims);
  EXPECT_EQ(values.size() * sizeof(T), t.nbytes());
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), t.nbytes());
  return t;
}

}  // namespace keel::testing
