/// @file errors.hpp
/// @brief The course's exceptions: what went wrong, where, what was expected, what was found.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

/// Everything the course builds: the model and its loaders (`common/`), and each lesson's pieces of
/// the one engine, from lesson 00's decoder to lesson 12's ranks. The lessons' pages say which
/// lesson adds what; this namespace's page lists every function and class by name.
namespace infer {

/// Every error the engine reports. Its message says what, where, expected and got.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown by a starter's unfinished function. The message names the lesson and the
/// function, so a failing test tells the student exactly which gap to fill.
class NotImplemented : public Error {
 public:
  /// `lesson` is the two-digit number ("00"), `what` the function left to write.
  NotImplemented(std::string_view lesson, std::string_view what)
      : Error("lesson " + std::string(lesson) + ": " + std::string(what) +
              " is not implemented yet") {}
};

/// Concatenates its arguments with operator<<: `cat("expected ", n, " got ", m)`.
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

/// Throws infer::Error with the concatenated message unless `condition` holds. The message's
/// arguments are evaluated either way: never pass one that is only valid when the condition
/// fails (`queue.back()` of a queue that may be empty); write an `if` and `throw` instead.
template <typename... Args>
void require(bool condition, const Args&... message) {
  if (!condition) throw Error(cat(message...));
}

}  // namespace infer
