// A test program as a dishonest student would link it: one failing case, a `write` of its own
// that replaces the C library's (a C function defined in any linked object does) and rewrites
// every " FAIL " it is handed to " PASS ", and code run before main that looks for the grader's
// token and descriptor. record_test.py runs it as the grader does and checks that the record
// still says FAIL (common/testing/main.cpp writes it through the kernel's call, never through
// `write()`) and that the code before main found neither (main.cpp took them first).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

extern char** environ;

extern "C" ssize_t write(int fd, const void* buf, size_t n) {
  std::string s(static_cast<const char*>(buf), n);
  for (auto p = s.find(" FAIL "); p != std::string::npos; p = s.find(" FAIL ")) s.replace(p, 6, " PASS ");
  const long r = syscall(SYS_write, fd, s.data(), s.size());
  return r < 0 ? -1 : static_cast<ssize_t>(n);
}

TEST(Forged, FailsWhateverWriteSays) { EXPECT_EQ(1 + 1, 3) << "this case must fail"; }

// Shows that the replacement is the `write` this program calls: its line comes out rewritten.
TEST(Forged, Probe) { ASSERT_EQ(::write(1, "probe: FAIL here\n", 17), 17); }

// What a constructor saw before main: the token through getenv(), any environment entry naming
// the grader or holding the token record_test.py passes, and whether the descriptor it named (in
// RECORD_TEST_FD, which main.cpp does not know) was still open.
const std::string snooped = [] {
  const char* token = std::getenv("COURSE_GRADER_TOKEN");
  int entries = 0;
  for (char** e = environ; *e != nullptr; ++e)
    entries += std::strstr(*e, "COURSE_GRADER") != nullptr || std::strstr(*e, "t0k3n") != nullptr;
  const char* fd = std::getenv("RECORD_TEST_FD");
  const bool open = fd != nullptr && fcntl(std::atoi(fd), F_GETFD) != -1;
  return std::string("snoop: token=") + (token ? token : "none") + "; entries=" + std::to_string(entries) +
         "; fd " + (open ? "open" : "closed");
}();

TEST(Forged, Snoop) { std::printf("%s\n", snooped.c_str()); }
