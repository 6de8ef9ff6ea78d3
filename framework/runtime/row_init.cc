#include "framework/runtime/row_init.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "framework/error.h"

namespace keel {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace {

// A uniform double in [0, 1) from 53 random bits.
double Unit(uint64_t& state) {
  state = SplitMix64(state);
  return static_cast<double>(state >> 11) * (1.0 / 9007199254740992.0);
}

const char* const kDistNames[] = {"uniform", "normal", "constant"};

}  // namespace

template <typename T>
void RowInit(const RowInitRule& rule, int64_t id, int64_t width, T* out) {
  // The generator: SplitMix64 over a state seeded by (seed, id); fixed arithmetic, so every
  // process and compiler draws the same values.
  uint64_t state = SplitMix64(static_cast<uint64_t>(rule.seed)) ^ static_cast<uint64_t>(id);
  state = SplitMix64(state);
  for (int64_t j = 0; j < width; ++j) {
    double v = rule.a;
    if (rule.dist == RowInitRule::kUniform) {
      v = rule.a + (static_cast<double>(rule.b) - rule.a) * Unit(state);
    } else if (rule.dist == RowInitRule::kNormal) {
      // Box-Muller, one value per pair of draws.
      const double u1 = 1.0 - Unit(state), u2 = Unit(state);
      v = rule.a + rule.b * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
    out[j] = static_cast<T>(v);
  }
}
template void RowInit<float>(const RowInitRule&, int64_t, int64_t, float*);
template void RowInit<double>(const RowInitRule&, int64_t, int64_t, double*);

std::string RowInitText(const RowInitRule& rule) {
  KEEL_ENFORCE(rule.dist >= 0 && rule.dist <= 2, "row initializer: dist ", rule.dist,
               " is not 0, 1 or 2");
  // %.9g: a float32 comes back from strtof exactly.
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%s %.9g %.9g %lld", kDistNames[rule.dist],
                static_cast<double>(rule.a), static_cast<double>(rule.b),
                static_cast<long long>(rule.seed));
  return buf;
}

RowInitRule ParseRowInit(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  std::string dist, a, b, seed, rest;
  in >> dist >> a >> b >> seed;
  const bool extra = static_cast<bool>(in >> rest);
  RowInitRule r;
  r.dist = -1;
  for (int d = 0; d < 3; ++d)
    if (dist == kDistNames[d]) r.dist = d;
  auto number = [&](const std::string& s, auto parse) {
    char* end = nullptr;
    const auto v = parse(s.c_str(), &end);
    KEEL_ENFORCE(!s.empty() && end == s.c_str() + s.size(), what, ": row initializer '", text,
                 "' is not '<uniform|normal|constant> <a> <b> <seed>'");
    return v;
  };
  KEEL_ENFORCE(r.dist >= 0 && !extra, what, ": row initializer '", text,
               "' is not '<uniform|normal|constant> <a> <b> <seed>'");
  r.a = number(a, [](const char* s, char** e) { return std::strtof(s, e); });
  r.b = number(b, [](const char* s, char** e) { return std::strtof(s, e); });
  r.seed = number(seed, [](const char* s, char** e) { return std::strtoll(s, e, 10); });
  return r;
}

}  // namespace keel
