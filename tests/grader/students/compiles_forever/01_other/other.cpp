// A compile that does not end in any useful time: the file includes itself twice at each of 40
// levels (2^40 inclusions; every limit of the compiler is per level, not per build).
#if __INCLUDE_LEVEL__ < 40
#include __FILE__
#include __FILE__
#else
#include "lessons/01_other/other.hpp"

namespace probe {
int square(int x) { return x * x; }
}  // namespace probe
#endif
