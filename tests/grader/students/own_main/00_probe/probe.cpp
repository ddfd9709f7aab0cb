// Brings its own main, which would report success without running a test.
#include "lessons/00_probe/probe.hpp"

namespace probe {
int add(int, int) { return 0; }
}  // namespace probe

int main() { return 0; }
