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
/// For the same reason the record goes out through the kernel's write call itself, not the C
/// library's `write()`, and the two variables are read from `main`'s own environment, not through
/// `getenv()`: a student file that defines a `write` or a `getenv` of its own (a C function
/// replaces the library's at link time) can neither rewrite a verdict nor read the token here.
/// What runs in this process can still reach the token in other ways; the grader's scan flags
/// those for an instructor to read (docs/instructors.md).
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

/// write(2) without the C library: -errno on failure, as the kernel returns it.
long kernel_write(int fd, const void* buf, std::size_t n) {
#if defined(__x86_64__)
  long ret;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(static_cast<long>(SYS_write)), "D"(static_cast<long>(fd)), "S"(buf), "d"(n)
               : "rcx", "r11", "memory");
  return ret;
#elif defined(__aarch64__)
  register long x8 asm("x8") = SYS_write;
  register long x0 asm("x0") = fd;
  register const void* x1 asm("x1") = buf;
  register std::size_t x2 asm("x2") = n;
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
  return x0;
#else
  const long ret = ::syscall(SYS_write, fd, buf, n);  // elsewhere: the C library's wrapper
  return ret < 0 ? -errno : ret;
#endif
}

/// The value of `name` in `envp` (main's third argument), or nullptr.
const char* env_value(char** envp, std::string_view name) {
  for (char** e = envp; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.size() > name.size() && entry.substr(0, name.size()) == name && entry[name.size()] == '=')
      return *e + name.size() + 1;
  }
  return nullptr;
}

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
      const long n = kernel_write(fd_, p, left);
      if (n == -EINTR) continue;
      if (n <= 0) return;  // the grader is gone: nothing to report to
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }

  int fd_;
  std::string token_;
};

}  // namespace

int main(int argc, char** argv, char** envp) {
  const char* fd = env_value(envp, "COURSE_GRADER_FD");
  const char* token = env_value(envp, "COURSE_GRADER_TOKEN");
  const std::string token_copy = token != nullptr ? token : "";  // unsetenv() below may free the original
  ::testing::InitGoogleTest(&argc, argv);
  if (fd != nullptr && token != nullptr) {
    char* end = nullptr;
    const long n = std::strtol(fd, &end, 10);
    if (end == fd || *end != '\0' || n < 3 || n > 1023) {
      std::fprintf(stderr, "COURSE_GRADER_FD must be a file descriptor number >= 3, got '%s'\n", fd);
      return 2;
    }
    ::testing::UnitTest::GetInstance()->listeners().Append(new ResultRecord(static_cast<int>(n), token_copy));
    // Programs the tests start need neither.
    ::unsetenv("COURSE_GRADER_FD");
    ::unsetenv("COURSE_GRADER_TOKEN");
  }
  return RUN_ALL_TESTS();
}
