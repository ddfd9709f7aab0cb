#include "lessons/01_other/other.hpp"

namespace probe {
int square(int x) { return x * x; }
}  // namespace probe
