#include "framework/dsl/initializer.h"

#include <cmath>

#include "framework/dsl/program_guard.h"

namespace keel {
namespace initializer {

namespace {

void Fill(Block& b, const VarDesc& p, const std::string& type, std::map<std::string, Attribute> a) {
  a["shape"] = p.shape();
  a["dtype"] = static_cast<int>(p.dtype());
  AppendOp(b, type, {}, {{"Out", {p.name()}}}, a);
}

// fan_in, fan_out of a parameter shape: [in, out] for fc, [out, in, k...] for conv.
std::pair<double, double> Fans(const VarDesc& p) {
  const auto& s = p.shape();
  if (s.size() < 2) return {double(s.empty() ? 1 : s[0]), double(s.empty() ? 1 : s[0])};
  if (s.size() == 2) return {double(s[0]), double(s[1])};
  double receptive = 1;
  for (size_t i = 2; i < s.size(); ++i) receptive *= double(s[i]);
  return {double(s[1]) * receptive, double(s[0]) * receptive};
}

}  // namespace

Initializer Constant(float value) {
  return [=](Block& b, const VarDesc& p) { Fill(b, p, "fill_constant", {{"value", value}}); };
}

Initializer Uniform(float low, float high, int seed) {
  return [=](Block& b, const VarDesc& p) {
    Fill(b, p, "uniform_random", {{"min", low}, {"max", high}, {"seed", seed}});
  };
}

Initializer Normal(float mean, float std, int seed) {
  return [=](Block& b, const VarDesc& p) {
    Fill(b, p, "gaussian_random", {{"mean", mean}, {"std", std}, {"seed", seed}});
  };
}

Initializer Xavier(bool uniform, int fan_in, int fan_out, int seed) {
  return [=](Block& b, const VarDesc& p) {
    auto [fi, fo] = Fans(p);
    if (fan_in > 0) fi = fan_in;
    if (fan_out > 0) fo = fan_out;
    if (uniform) {
      float limit = static_cast<float>(std::sqrt(6.0 / (fi + fo)));
      Uniform(-limit, limit, seed)(b, p);
    } else {
      Normal(0.0f, static_cast<float>(std::sqrt(2.0 / (fi + fo))), seed)(b, p);
    }
  };
}

Initializer MSRA(bool uniform, int fan_in, int seed) {
  return [=](Block& b, const VarDesc& p) {
    double fi = fan_in > 0 ? fan_in : Fans(p).first;
    if (uniform) {
      float limit = static_cast<float>(std::sqrt(6.0 / fi));
      Uniform(-limit, limit, seed)(b, p);
    } else {
      Normal(0.0f, static_cast<float>(std::sqrt(2.0 / fi)), seed)(b, p);
    }
  };
}

}  // namespace initializer
}  // namespace keel
