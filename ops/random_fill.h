// The host draws of uniform_random and gaussian_random, shared by their CPU kernels and their
// CUDA twins (which draw on the host and copy to the device: initializers run once, in the
// startup program, and this way a seed gives the same parameters on every place).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace keel {

// A mt19937_64 seeded once, from `seed`, on the first use; later uses continue the stream.
class SeededEngine {
 public:
  std::mt19937_64& Get(uint64_t seed) {
    if (!seeded_) {
      engine_.seed(seed);
      seeded_ = true;
    }
    return engine_;
  }

 private:
  std::mt19937_64 engine_;
  bool seeded_ = false;
};

// Uniform in [0, 1) from the top 53 bits. Spelled out (unlike std::*_distribution, whose
// algorithms are implementation-defined) so a seed gives the same values with every library.
inline double Uniform01(std::mt19937_64& e) { return static_cast<double>(e() >> 11) * 0x1.0p-53; }

// p[0, n) ~ U[lo, hi).
template <typename T>
void FillUniform(std::mt19937_64& e, double lo_d, double hi_d, T* p, int64_t n) {
  const T lo = static_cast<T>(lo_d);
  const T hi = static_cast<T>(hi_d);
  const T below_hi = std::nextafter(hi, lo);  // rounding to T must not reach max
  for (int64_t i = 0; i < n; ++i) {
    T v = static_cast<T>(lo_d + (hi_d - lo_d) * Uniform01(e));
    p[i] = v < hi ? v : below_hi;
  }
}

// p[0, n) ~ N(mean, std^2), by Box-Muller: two normals from two uniforms.
template <typename T>
void FillGaussian(std::mt19937_64& e, double mean, double std_dev, T* p, int64_t n) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = 1.0 - Uniform01(e);  // (0, 1]: log stays finite
    const double u2 = Uniform01(e);
    const double r = std_dev * std::sqrt(-2.0 * std::log(u1));
    p[i] = static_cast<T>(mean + r * std::cos(kTwoPi * u2));
    if (i + 1 < n) p[i + 1] = static_cast<T>(mean + r * std::sin(kTwoPi * u2));
  }
}

}  // namespace keel
