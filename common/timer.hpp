/// @file timer.hpp
/// @brief A stopwatch for demos and benches (never for tests: tests don't read the clock).
#pragma once

#include <chrono>

namespace infer {

/// Measures elapsed wall-clock time from construction or the last reset().
class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  /// Starts counting again from now.
  void reset() { start_ = Clock::now(); }
  /// Seconds since the start.
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  /// Milliseconds since the start.
  double millis() const { return seconds() * 1e3; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

}  // namespace infer
