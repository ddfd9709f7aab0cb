// Correct, and closes its standard output and error: the verdict does not travel there.
#include <unistd.h>

#include "lessons/00_probe/probe.hpp"

namespace probe {
int add(int a, int b) {
  close(1);
  close(2);
  return a + b;
}
}  // namespace probe
