#include "common/errors.hpp"
#include "lessons/00_probe/probe.hpp"

namespace probe {
int add(int, int) { throw infer::NotImplemented("00", "add"); }
}  // namespace probe
