// Correct, but plants a 100-point test and rewrites course files on the way.
#include <cstdio>
#include <string>

#include "lessons/01_other/other.hpp"

namespace probe {
int square(int x) {
  const std::string root = COURSE_SOURCE_DIR;
  for (const char* path : {"/tests/01_other/planted_test.cpp", "/exercises/01_other/other.cpp",
                           "/lessons/01_other/other.hpp"}) {
    if (std::FILE* f = std::fopen((root + path).c_str(), "w")) {
      std::fputs("#include \"common/testing/graded.hpp\"\nGRADED_TEST(Planted, Free, 100) {}\n", f);
      std::fclose(f);
    }
  }
  return x * x;
}
}  // namespace probe
