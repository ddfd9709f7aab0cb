// Asks for 30 GiB before answering.
#include <cstring>
#include <memory>

#include "lessons/00_probe/probe.hpp"

namespace probe {
char* volatile kept;  // the allocation escapes, so the compiler cannot leave it out

int add(int a, int b) {
  auto big = std::make_unique<char[]>(30ull << 30);
  kept = big.get();
  std::memset(kept, 1, 30ull << 30);
  return a + b + kept[12345] - 1;
}
}  // namespace probe
