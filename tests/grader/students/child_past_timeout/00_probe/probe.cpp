// Waits for a child that sleeps far past the test's timeout.
#include <sys/wait.h>
#include <unistd.h>

#include "lessons/00_probe/probe.hpp"

namespace probe {
int add(int a, int b) {
  const pid_t child = fork();
  if (child == 0) {
    execl("/bin/sleep", "sleep", "9732", static_cast<char*>(nullptr));
    _exit(1);
  }
  waitpid(child, nullptr, 0);
  return a + b;
}
}  // namespace probe
