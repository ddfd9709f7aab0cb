// quick_exit(0): status 0 through the at_quick_exit path.
#include <cstdlib>

#include "lessons/00_probe/probe.hpp"

namespace probe {
int add(int, int) { std::quick_exit(0); }
}  // namespace probe
