/// @file chi_square.hpp
/// @brief Pearson's chi-square test, as lesson 06's tests use it: is a sampler's output the
/// distribution it must draw from?
#pragma once

#include <cmath>
#include <vector>

#include "common/errors.hpp"
#include "common/tensor.hpp"

namespace infer::testing {

/// Pearson's chi-square statistic of `counts` against the distribution `p` (entries with p = 0
/// must have no count at all; they add infinity otherwise).
inline double chi_square(const std::vector<long>& counts, const Vector& p) {
  long n = 0;
  for (long c : counts) n += c;
  double x2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = static_cast<double>(n) * p[static_cast<Eigen::Index>(i)];
    if (expected == 0) {
      if (counts[i] > 0) return INFINITY;
      continue;
    }
    x2 += (static_cast<double>(counts[i]) - expected) * (static_cast<double>(counts[i]) - expected) / expected;
  }
  return x2;
}

/// The chi-square distribution's critical value at significance 0.001 for `df` degrees of
/// freedom (1 to 15): a correct sampler exceeds it in one seeded run out of a thousand.
inline double chi_square_critical_001(int df) {
  static constexpr double kCritical[] = {10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124,
                                         27.877, 29.588, 31.264, 32.909, 34.528, 36.123, 37.697};
  require(df >= 1 && df <= 15, "chi_square_critical_001: ", df, " degrees of freedom, the table holds 1 to 15");
  return kCritical[df - 1];
}

}  // namespace infer::testing
