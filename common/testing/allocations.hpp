/// @file allocations.hpp
/// @brief Counting the heap memory a call allocates: how a test sees that a paged read does not
/// gather a copy, or that a tiled attention never holds the whole score matrix.
///
///     AllocationCounter counter;          // counts from here...
///     paged_attention(q, pool, table, ...);
///     EXPECT_LT(counter.bytes(), limit);  // ...to here, in every thread
///
/// It works by replacing malloc and its relatives in the test program (they forward to glibc's),
/// so Eigen's matrices and std::vector's buffers are both seen. Under AddressSanitizer, which
/// owns malloc itself, available() is false: skip the check there.
#pragma once

#include <cstddef>

namespace infer::testing {

class AllocationCounter {
 public:
  AllocationCounter();
  ~AllocationCounter();
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;

  /// Bytes requested from the heap since construction.
  std::size_t bytes() const;
  /// The largest single request since construction.
  std::size_t largest() const;
  /// Whether this build can count (false under AddressSanitizer).
  static bool available();
};

}  // namespace infer::testing
