// A test program as a dishonest student would link it: one failing case, and a `write` of its
// own that replaces the C library's (a C function defined in any linked object does) and rewrites
// every " FAIL " it is handed to " PASS ". record_test.py runs it as the grader does and checks
// that the record still says FAIL: common/testing/main.cpp writes its record through the kernel's
// call, never through `write()`.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <string>

extern "C" ssize_t write(int fd, const void* buf, size_t n) {
  std::string s(static_cast<const char*>(buf), n);
  for (auto p = s.find(" FAIL "); p != std::string::npos; p = s.find(" FAIL ")) s.replace(p, 6, " PASS ");
  const long r = syscall(SYS_write, fd, s.data(), s.size());
  return r < 0 ? -1 : static_cast<ssize_t>(n);
}

TEST(Forged, FailsWhateverWriteSays) { EXPECT_EQ(1 + 1, 3) << "this case must fail"; }

// Shows that the replacement is the `write` this program calls: its line comes out rewritten.
TEST(Forged, Probe) { ASSERT_EQ(::write(1, "probe: FAIL here\n", 17), 17); }
