// Correct, but closes its standard output and error: its PASS has nothing in GoogleTest's output to back it.
#include <unistd.h>

#include "lessons/00_probe/probe.hpp"

namespace probe {
int add(int a, int b) {
  close(1);
  close(2);
  return a + b;
}
}  // namespace probe
