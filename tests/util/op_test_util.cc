#include "tests/util/op_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "framework/error.h"

namespace keel::testing {

std::vector<double> ToDouble(const Tensor& t) {
  std::vector<double> v(t.numel());
  VisitDType(t.dtype(), [&](auto z) {
    using V = decltype(z);
    const V* p = t.data<V>();
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<double>(p[i]);
  });
  return v;
}

std::string Describe(const OpCase& c) {
  std::ostringstream os;
  os << "case '" << c.name << "' op " << c.type;
  for (auto& [slot, ts] : c.inputs)
    for (auto& t : ts) os << " " << slot << "=" << DTypeName(t.dtype()) << t.dims().str();
  for (auto& [k, v] : c.attrs) os << " " << k << "=" << AttrToString(v);
  return os.str();
}

void ExpectOutputNear(const OpCase& c, const std::string& slot, const DDim& want_dims,
                      const std::vector<double>& want, const OutputCheck& check) {
  SCOPED_TRACE(Describe(c));
  auto outs = RunForward(c);
  ASSERT_EQ(outs.count(slot), 1u) << "no output " << slot;
  const Tensor& out = outs[slot][0];
  ASSERT_EQ(out.dims(), want_dims);
  if (check.dtype_of_first_input) {
    ASSERT_EQ(out.dtype(), c.inputs[0].second[0].dtype());
  }
  const double tol = out.dtype() == DType::kFloat32 ? check.f32_tol : 1e-12;
  std::vector<double> got = ToDouble(out);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << slot << " at flat index " << i;
}

void ExpectForward(const OpCase& c, const std::string& slot, const DDim& want_dims,
                   const std::vector<double>& want, double f32_tol) {
  ExpectOutputNear(c, slot, want_dims, want, {f32_tol});
}

OpCase UnaryCase(const std::string& name, const std::string& type, Tensor x,
                 std::map<std::string, Attribute> attrs) {
  OpCase c;
  c.name = name;
  c.type = type;
  c.inputs = {{"X", {std::move(x)}}};
  c.attrs = std::move(attrs);
  return c;
}

Tensor RandomInts(const DDim& dims, DType dtype, int lo, int hi, uint64_t seed) {
  Tensor r = RandomTensor(dims, DType::kFloat64, lo, hi + 1, seed);
  Tensor t(dtype, dims);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = std::floor(r.data<double>()[i]);
    VisitDType(dtype, [&](auto z) {
      using V = decltype(z);
      t.data<V>()[i] = static_cast<V>(v);
    });
  }
  return t;
}

std::vector<int> Pair(int a, int b) { return {a, b}; }

int CanonicalAxis(int axis, int rank) { return axis < 0 ? axis + rank : axis; }

AxisParts SplitAroundAxis(const DDim& d, int axis) {
  if (axis < 0) axis += d.size();
  return {d.prod(0, axis), d[axis], d.prod(axis + 1, d.size())};
}

std::vector<double> NaiveSoftmax(const std::vector<double>& x, const DDim& dims, int axis) {
  AxisParts s = SplitAroundAxis(dims, axis);
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < s.pre; ++i)
    for (int64_t j = 0; j < s.post; ++j) {
      auto at = [&](int64_t k) { return (i * s.n + k) * s.post + j; };
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t k = 0; k < s.n; ++k) mx = std::max(mx, x[at(k)]);
      for (int64_t k = 0; k < s.n; ++k) sum += std::exp(x[at(k)] - mx);
      for (int64_t k = 0; k < s.n; ++k) y[at(k)] = std::exp(x[at(k)] - mx) / sum;
    }
  return y;
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string(kNotAKeelError) + e.what();
  }
  return "";
}

std::string ForwardError(const OpCase& c) {
  return ErrorOf([&] { RunForward(c); });
}

void ExpectContainsAll(const std::string& msg, const std::vector<std::string>& parts) {
  for (auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' in: " << msg;
}

void ExpectErrorContainsAll(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_FALSE(msg.empty()) << "expected a keel::Error";
  EXPECT_EQ(msg.rfind(kNotAKeelError, 0), std::string::npos) << msg;
  ExpectContainsAll(msg, parts);
}

bool SameBits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].nbytes() != b[i].nbytes() ||
        std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()) != 0)
      return false;
  return true;
}

}  // namespace keel::testing
