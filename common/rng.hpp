/// @file rng.hpp
/// @brief A small seeded random generator that gives the same numbers on every platform.
///
/// The standard library's distributions (std::uniform_real_distribution, ...) are allowed
/// to differ between implementations, so a seeded test could pass with one compiler and
/// fail with another. The course uses this generator and its own transforms instead.
#pragma once

#include <cmath>
#include <cstdint>

namespace infer {

/// SplitMix64 (Steele, Lea and Flood, 2014): 64 bits of state, one add and a mix per draw.
/// Not cryptographic; good enough for sampling and test data, and fully reproducible.
class Rng {
 public:
  /// The same seed gives the same sequence everywhere.
  explicit Rng(uint64_t seed = 0) : state_(seed) {}

  /// The next 64 random bits.
  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  /// Uniform in [0, 1), with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  /// Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

  /// Uniform integer in [0, n), for n > 0 (Lemire's multiply-shift; the bias is below 2^-32 for n < 2^32).
  uint64_t below(uint64_t n) {
    __extension__ using u128 = unsigned __int128;
    return static_cast<uint64_t>((static_cast<u128>(next_u64()) * n) >> 64);
  }

  /// Standard normal by Box-Muller (one draw per call; the second value is discarded for simplicity).
  double normal() {
    double u1 = uniform();
    double u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace infer
