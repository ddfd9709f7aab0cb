// A syntax error: graded right after a build that compiled, it must still score zero.
#include "lessons/01_other/other.hpp"

namespace probe {
int square(int x) { return x * x }
}  // namespace probe
