/// @file main.cpp
/// @brief The `main` of every course test program: GoogleTest, plus the result record the grader
/// trusts.
///
/// A test program's exit status says little: student code can call `exit(0)` in the middle of a
/// test. So when the grader (tools/grader.py) runs a case, it hands the program a file descriptor
/// and a fresh token in `COURSE_GRADER_FD` and `COURSE_GRADER_TOKEN`, and counts a case as passed
/// only when this listener has written `TOKEN PASS Suite.Name` (after the test body returned and
/// GoogleTest judged it) and then `TOKEN END` (after the last test). A process that exits, is
/// killed or jumps away in the middle of a test never writes the first line.
///
/// This is compiled into each test program as an object file, not taken from a library: a student
/// file that defines its own `main` then fails to link instead of silently replacing this one.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace {

class ResultRecord : public ::testing::EmptyTestEventListener {
 public:
  ResultRecord(int fd, std::string token) : fd_(fd), token_(std::move(token)) {}

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult& r = *info.result();
    const char* verdict = r.Skipped() ? "SKIP" : r.Passed() ? "PASS" : "FAIL";
    write_line(std::string(verdict) + " " + info.test_suite_name() + "." + info.name());
  }

  void OnTestProgramEnd(const ::testing::UnitTest&) override { write_line("END"); }

 private:
  void write_line(const std::string& what) {
    const std::string line = token_ + " " + what + "\n";
    const char* p = line.data();
    std::size_t left = line.size();
    while (left > 0) {  // a pipe may take it in pieces
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // the grader is gone: nothing to report to
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }

  int fd_;
  std::string token_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* fd = std::getenv("COURSE_GRADER_FD");
  const char* token = std::getenv("COURSE_GRADER_TOKEN");
  if (fd != nullptr && token != nullptr) {
    char* end = nullptr;
    const long n = std::strtol(fd, &end, 10);
    if (end == fd || *end != '\0' || n < 3 || n > 1023) {
      std::fprintf(stderr, "COURSE_GRADER_FD must be a file descriptor number >= 3, got '%s'\n", fd);
      return 2;
    }
    ::testing::UnitTest::GetInstance()->listeners().Append(new ResultRecord(static_cast<int>(n), token));
    // Programs the tests start need neither.
    ::unsetenv("COURSE_GRADER_FD");
    ::unsetenv("COURSE_GRADER_TOKEN");
  }
  return RUN_ALL_TESTS();
}
