// Correct, but tries to delete the build directory its own program runs from.
#include <filesystem>
#include <system_error>

#include "lessons/00_probe/probe.hpp"

namespace probe {
int add(int a, int b) {
  std::error_code ignored;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ignored);
  std::filesystem::remove_all(exe.parent_path().parent_path(), ignored);  // build/
  std::filesystem::remove_all(COURSE_SOURCE_DIR, ignored);
  return a + b;
}
}  // namespace probe
