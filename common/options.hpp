/// @file options.hpp
/// @brief Command-line options of the demos, benches and tools (`--name value` and `--flag`), and the
/// timing helpers they share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/timer.hpp"

namespace infer {

/// Parses `--name value` pairs and bare `--flag`s. An unknown option, a missing value or a value
/// that is not a number where one is expected throws infer::Error naming the program and option.
class Options {
 public:
  /// `valued`: options that take a value; `flags`: options that stand alone; `aliases`: other
  /// names for some of them (vLLM's, say: `{"--max-num-seqs", "--max-running"}`), read as the option
  /// they name. An option given twice, or under both its names, is refused (which would count?).
  Options(int argc, char** argv, std::string program, std::set<std::string> valued, std::set<std::string> flags = {},
          const std::map<std::string, std::string>& aliases = {})
      : program_(std::move(program)) {
    std::map<std::string, std::string> spelled;  // option -> how it was written
    for (int i = 1; i < argc; ++i) {
      const auto alias = aliases.find(argv[i]);
      const std::string a = alias == aliases.end() ? argv[i] : alias->second;
      if (spelled.count(a) && spelled[a] != argv[i])
        throw Error(cat(program_, ": ", argv[i], " and ", spelled[a], " are the same option; give one"));
      if (spelled.count(a) && (valued.count(a) || flags.count(a)))  // (an unknown one is said below)
        throw Error(cat(program_, ": ", argv[i], " is given twice; give it once"));
      spelled[a] = argv[i];
      if (flags.count(a)) {
        values_[a] = "";
      } else if (valued.count(a)) {
        require(i + 1 < argc, program_, ": ", a, " needs a value");
        const std::string next = argv[i + 1];
        // `--prompt --max-new-tokens 8`: the value is missing, not "--max-new-tokens".
        if (valued.count(next) || flags.count(next) || aliases.count(next))
          throw Error(cat(program_, ": ", a, " needs a value, but the next argument is the option '", next, "'"));
        values_[a] = argv[++i];
      } else {
        throw Error(cat(program_, ": unknown option '", a, "'"));
      }
    }
  }

  /// Whether the option was given.
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  /// Whether `-h` or `--help` was given (a program that answers them lists both among its flags).
  bool help() const { return has("-h") || has("--help"); }
  /// The option's text, or `fallback`.
  std::string text(const std::string& name, const std::string& fallback) const {
    return has(name) ? values_.at(name) : fallback;
  }
  /// The option as an integer in [minimum, maximum], or `fallback`. The default maximum is the
  /// largest int, since most callers store the value in an int: a larger number is refused, never
  /// wrapped (4294967300 would otherwise become 4).
  long number(const std::string& name, long fallback, long minimum = 0,
              long maximum = std::numeric_limits<int>::max()) const {
    if (!has(name)) return fallback;
    const std::string& v = values_.at(name);
    size_t used = 0;
    long n = 0;
    bool parsed = false;
    try {
      n = std::stol(v, &used);
      parsed = used == v.size();
    } catch (const std::exception&) {  // not a number, or beyond a long
    }
    if (!parsed || n < minimum || n > maximum)
      throw Error(cat(program_, ": ", name, " expects an integer in [", minimum, ", ", maximum, "], got '", v, "'"));
    return n;
  }
  /// The option as a finite real number in [minimum, maximum], written in decimal (as 2, -0.5 or
  /// 1e-3), or `fallback` ("inf", "nan", hexadecimal and spaces are refused).
  double real(const std::string& name, double fallback, double minimum = -std::numeric_limits<double>::max(),
              double maximum = std::numeric_limits<double>::max()) const {
    if (!has(name)) return fallback;
    const std::string& v = values_.at(name);
    // strtod, not std::stod: a number too small for a double (1e-320) is still a number, near 0;
    // one too large reads as infinity, refused below.
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    const size_t used = static_cast<size_t>(end - v.c_str());
    require(used == v.size() && used > 0 && std::isfinite(x) && v.find_first_not_of("0123456789+-.eE") == std::string::npos,
            program_, ": ", name, " expects a finite number written in decimal, got '", v, "'");
    require(x >= minimum && x <= maximum, program_, ": ", name, " expects a number in [", minimum, ", ", maximum,
            "], got '", v, "'");
    return x;
  }

 private:
  std::string program_;
  std::map<std::string, std::string> values_;
};

/// The median of some measurements (the upper one of the middle two for an even count).
inline double median(std::vector<double> v) {
  require(!v.empty(), "median: no measurements");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// The fastest of `reps` runs of `fn`, in seconds.
template <typename Fn>
double best_seconds(int reps, Fn&& fn) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    Stopwatch clock;
    fn();
    best = std::min(best, clock.seconds());
  }
  return best;
}

}  // namespace infer
