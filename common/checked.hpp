/// @file checked.hpp
/// @brief The checked build's first header (`./course check NN --debug`, CMake option
/// COURSE_CHECKED): Eigen's own checks of shapes and indices, failing with an exception that says
/// what was checked.
///
/// Every other build defines NDEBUG, for speed, and NDEBUG turns Eigen's checks off: there, a
/// product of a row and a column taken element by element, or `x(i)` one past the end, reads
/// memory it should not and gives wrong numbers without a word. The checked build leaves NDEBUG
/// out and includes this header before anything else in every file, so each check Eigen makes
/// throws std::logic_error instead of aborting the test program: GoogleTest reports it as the
/// failing case's message ("C++ exception with description ... thrown in the test body") and goes
/// on to the next case. Under gdb, `catch throw` stops at the line that failed the check.
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>

namespace infer::checked {

/// Throws std::logic_error naming the Eigen check that failed (`condition`, as Eigen wrote it),
/// what it most likely means, and where Eigen checks it (`file`:`line`).
[[noreturn]] inline void eigen_check_failed(const char* condition, const char* file, int line) {
  const bool shapes = std::strstr(condition, "rows()") != nullptr || std::strstr(condition, "cols()") != nullptr;
  const bool index = std::strstr(condition, "index") != nullptr || std::strstr(condition, ">= 0") != nullptr;
  const char* slash = std::strrchr(file, '/');
  std::string what = std::string("Eigen's check failed: ") + condition;
  if (index) what += " (an index out of range: one past the end, or a negative one?)";
  else if (shapes) what += " (two operands of different shapes: a row where a column was meant, or the other way?)";
  what += std::string(", checked in Eigen's ") + (slash ? slash + 1 : file) + ":" + std::to_string(line) +
          " (under gdb, `catch throw` stops there, below the line that called it)";
  throw std::logic_error(what);
}

}  // namespace infer::checked

/// Eigen's check of condition `x` (Eigen uses this macro when it is defined before its headers):
/// infer::checked::eigen_check_failed() where it does not hold.
#define eigen_assert(x) ((x) ? static_cast<void>(0) : ::infer::checked::eigen_check_failed(#x, __FILE__, __LINE__))
