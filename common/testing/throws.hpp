/// @file throws.hpp
/// @brief Asserting that bad input is refused with a clear message.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "common/errors.hpp"

namespace infer::testing {

/// Success when `fn()` throws infer::Error whose message contains `fragment`. An unfinished
/// function's NotImplemented does not count: refusing everything is not validating.
template <typename Fn>
::testing::AssertionResult throws_error_mentioning(Fn&& fn, const std::string& fragment) {
  try {
    fn();
  } catch (const NotImplemented& e) {
    return ::testing::AssertionFailure() << "still not implemented: " << e.what();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find(fragment) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "threw infer::Error, but its message should mention \"" << fragment
                                         << "\"; it was: " << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw " << typeid(e).name() << " (" << e.what()
                                         << "), expected infer::Error mentioning \"" << fragment << "\"";
  }
  return ::testing::AssertionFailure() << "did not throw; expected infer::Error mentioning \"" << fragment << "\"";
}

}  // namespace infer::testing
