/// @file compare.hpp
/// @brief Comparing an optimized result with its reference: |got - ref| <= atol + rtol * |ref|
/// everywhere, and on failure the first mismatches with their (row, column).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <sstream>
#include <string>

#include "common/tensor.hpp"

namespace infer::testing {

/// A Vector from a list of values (logits, probabilities) written out in a test.
inline Vector vec(std::initializer_list<float> values) {
  Vector v(static_cast<Eigen::Index>(values.size()));
  Eigen::Index i = 0;
  for (float x : values) v[i++] = x;
  return v;
}

/// Element-wise closeness of two Eigen matrices or vectors of the same shape.
/// Use it as `EXPECT_TRUE(all_close(ref, got, 1e-5, 1e-4, "rms_norm output"))`.
template <typename A, typename B>
::testing::AssertionResult all_close(const Eigen::DenseBase<A>& expected, const Eigen::DenseBase<B>& got,
                                     double atol, double rtol, const std::string& what) {
  if (expected.rows() != got.rows() || expected.cols() != got.cols()) {
    return ::testing::AssertionFailure() << what << ": shape is [" << got.rows() << ", " << got.cols()
                                         << "], expected [" << expected.rows() << ", " << expected.cols()
                                         << "]";
  }
  long bad = 0, nans = 0;
  double worst = 0;
  std::ostringstream first;
  for (Eigen::Index r = 0; r < expected.rows(); ++r) {
    for (Eigen::Index c = 0; c < expected.cols(); ++c) {
      const double e = expected(r, c), g = got(r, c);
      const double err = std::abs(g - e);
      const double tol = atol + rtol * std::abs(e);
      if (!(err <= tol)) {  // also catches NaN
        if (bad < 5)
          first << "\n  at (" << r << ", " << c << "): expected " << e << ", got " << g << " (|diff| "
                << err << " > tolerance " << tol << ")";
        ++bad;
        if (std::isnan(err)) ++nans;
        else worst = std::max(worst, err);
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream largest;  // NaN has no size: said apart
  if (nans < bad) largest << "largest difference " << worst << (nans > 0 ? ", " : "");
  if (nans > 0) largest << nans << " of them NaN";
  const char* why_nan = nans == 0 ? ""
                                  : "\n  (a NaN is most often a value never written, as the tests poison a kernel's "
                                    "outputs and the emulator its shared memory with NaN; or an operation such as "
                                    "-inf - -inf, 0 / 0 or the square root of a negative)";
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << expected.size()
                                       << " values differ by more than atol " << atol << " + rtol " << rtol
                                       << " * |expected| (" << largest.str() << "); first ones:" << first.str()
                                       << why_nan;
}

}  // namespace infer::testing
