/// @file graded.hpp
/// @brief Graded tests: a GoogleTest case that carries points.
///
/// `GRADED_TEST(Lesson00Ops, RmsNormMatchesReference, 2) { ... }` is a TEST worth 2 points.
/// The grade report (tools/grade_report.py) reads the points from the sources, so a lesson
/// whose tests do not even compile still shows what it was worth, and joins them with the
/// pass/fail result of every case from ctest.
///
/// Keep each GRADED_TEST on one line with literal arguments: the report parses it.
#pragma once

#include <gtest/gtest.h>

/// A GoogleTest case worth `points` points in the grade report.
#define GRADED_TEST(suite, name, points)                                     \
  static_assert((points) > 0 && (points) <= 100, "points must be in 1..100"); \
  TEST(suite, name)
