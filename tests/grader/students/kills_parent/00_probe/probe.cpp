// Correct, but sends SIGKILL to whatever started it.
#include <csignal>
#include <unistd.h>

#include "lessons/00_probe/probe.hpp"

namespace probe {
int add(int a, int b) {
  kill(getppid(), SIGKILL);
  return a + b;
}
}  // namespace probe
