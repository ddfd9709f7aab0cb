// Never returns.
#include "lessons/00_probe/probe.hpp"

namespace probe {
int add(int a, int b) {
  volatile int spin = 1;
  while (spin) {
  }
  return a + b;
}
}  // namespace probe
