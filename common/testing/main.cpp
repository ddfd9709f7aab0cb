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
/// The token is a secret only while no student code has seen it, and student code can run before
/// `main` (a constructor of a namespace-scope object). So the two variables are taken in
/// `.preinit_array`, which the C library runs before every constructor of the program: the token is
/// kept masked by random bytes, both variables are cut out of the environment and their bytes
/// overwritten, and the descriptor moves to a number chosen at random (the one the grader named is
/// closed). That start-up code makes kernel calls only (no C library function, which a student
/// file could replace with one of its own), and so does the record's write. What runs in this
/// process could still dig the masked token out of memory; the grader also checks GoogleTest's
/// own output, and its scan flags such code for an instructor to read (docs/instructors.md).
///
/// This is compiled into each test program as an object file, not taken from a library: a student
/// file that defines its own `main` then fails to link instead of silently replacing this one.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <fcntl.h>
#include <string>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

/// A system call with up to three arguments, without the C library: -errno on failure, as the
/// kernel returns it.
long kernel_call(long number, long a, long b, long c) {
#if defined(__x86_64__)
  long ret;
  asm volatile("syscall" : "=a"(ret) : "a"(number), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
  return ret;
#elif defined(__aarch64__)
  register long x8 asm("x8") = number;
  register long x0 asm("x0") = a;
  register long x1 asm("x1") = b;
  register long x2 asm("x2") = c;
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
  return x0;
#else
  const long ret = ::syscall(number, a, b, c);  // elsewhere: the C library's wrapper
  return ret < 0 ? -errno : ret;
#endif
}

/// What the start-up code took from the environment. Plain data, zero before the program starts:
/// it is written before any constructor runs.
struct Captured {
  bool ran;                     ///< capture() ran
  bool found;                   ///< both variables were there: the grader runs this program
  bool bad_fd;                  ///< COURSE_GRADER_FD was not a number from 3 to 1023
  int fd;                       ///< where the record goes
  int token_size;               ///< the token's bytes (at most sizeof token)
  unsigned char token[128];     ///< the token, each byte XORed with mask's
  unsigned char mask[128];      ///< random bytes
  char said_fd[32];             ///< the start of COURSE_GRADER_FD's value, for the message
};
Captured captured;

// The start-up code runs before a sanitizer's runtime has started (its shadow memory is not there
// yet): left uninstrumented.
#define COURSE_BEFORE_START [[gnu::no_sanitize("address", "undefined", "thread")]]

/// Whether `entry` is `name=...`; then `value` points past the '='.
COURSE_BEFORE_START bool is_variable(const char* entry, const char* name, char*& value) {
  int i = 0;
  for (; name[i] != '\0'; ++i)
    if (entry[i] != name[i]) return false;
  if (entry[i] != '=') return false;
  value = const_cast<char*>(entry + i + 1);
  return true;
}

/// Takes the grader's two variables out of `envp` (the program's environment: the C library's
/// `environ` is this array), and the descriptor to a new number. Kernel calls and plain loops only:
/// it runs before the C library's own start-up code.
COURSE_BEFORE_START void capture(int, char**, char** envp) {
  if (captured.ran) return;
  captured.ran = true;
  if (envp == nullptr) return;
  char* fd_value = nullptr;
  char* token_value = nullptr;
  int kept = 0;
  for (int i = 0; envp[i] != nullptr; ++i) {
    char* value = nullptr;
    if (is_variable(envp[i], "COURSE_GRADER_FD", value))
      fd_value = value;
    else if (is_variable(envp[i], "COURSE_GRADER_TOKEN", value))
      token_value = value;
    else
      envp[kept++] = envp[i];
  }
  for (int i = kept; envp[i] != nullptr; ++i) envp[i] = nullptr;  // the two cut out; the array ends sooner
  if (fd_value == nullptr || token_value == nullptr) return;
  captured.found = true;
  if (kernel_call(SYS_getrandom, reinterpret_cast<long>(captured.mask), sizeof captured.mask, 0) !=
      static_cast<long>(sizeof captured.mask))
    for (unsigned i = 0; i < sizeof captured.mask; ++i) captured.mask[i] = static_cast<unsigned char>(167 * i + 13);
  int n = 0;
  for (; token_value[n] != '\0' && n < static_cast<int>(sizeof captured.token); ++n)
    captured.token[n] = static_cast<unsigned char>(token_value[n]) ^ captured.mask[n];
  captured.token_size = n;
  long fd = 0;
  int digits = 0;
  for (const char* p = fd_value; *p != '\0'; ++p, ++digits) {
    if (*p < '0' || *p > '9' || digits > 4) {
      fd = -1;
      break;
    }
    fd = 10 * fd + (*p - '0');
  }
  for (int i = 0; fd_value[i] != '\0' && i + 1 < static_cast<int>(sizeof captured.said_fd); ++i)
    captured.said_fd[i] = fd_value[i];
  if (digits == 0 || fd < 3 || fd > 1023) {
    captured.bad_fd = true;
  } else {
    captured.fd = static_cast<int>(fd);
    // A new number, from 200 up, where this program has no other descriptor (F_DUPFD_CLOEXEC:
    // the lowest free one from there), and not inherited by the programs a test starts.
    const long wanted = 200 + (captured.mask[0] | captured.mask[1] << 8) % 600;
    const long moved = kernel_call(SYS_fcntl, fd, F_DUPFD_CLOEXEC, wanted);
    if (moved >= 0) {
      kernel_call(SYS_close, fd, 0, 0);
      captured.fd = static_cast<int>(moved);
    }
  }
  // Overwrite what the variables said (a copy left in the environment's strings could be read).
  for (char* p = fd_value; *p != '\0'; ++p) *p = 'x';
  for (char* p = token_value; *p != '\0'; ++p) *p = 'x';
}

[[gnu::used, gnu::section(".preinit_array")]] void (*capture_first)(int, char**, char**) = capture;

class ResultRecord : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult& r = *info.result();
    const char* verdict = r.Skipped() ? "SKIP" : r.Passed() ? "PASS" : "FAIL";
    write_line(std::string(verdict) + " " + info.test_suite_name() + "." + info.name());
  }

  void OnTestProgramEnd(const ::testing::UnitTest&) override { write_line("END"); }

 private:
  static void write_line(const std::string& what) {
    std::string line(static_cast<std::size_t>(captured.token_size), ' ');
    for (int i = 0; i < captured.token_size; ++i)
      line[static_cast<std::size_t>(i)] = static_cast<char>(captured.token[i] ^ captured.mask[i]);
    line += " " + what + "\n";
    const char* p = line.data();
    std::size_t left = line.size();
    while (left > 0) {  // a pipe may take it in pieces
      const long n = kernel_call(SYS_write, captured.fd, reinterpret_cast<long>(p), static_cast<long>(left));
      if (n == -EINTR) continue;
      if (n <= 0) break;  // the grader is gone: nothing to report to
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    for (char& c : line) *static_cast<volatile char*>(&c) = 0;  // no unmasked copy left behind
  }
};

}  // namespace

int main(int argc, char** argv, char** envp) {
  capture(argc, argv, envp);  // (where no .preinit_array ran: a C library without them)
  ::testing::InitGoogleTest(&argc, argv);
  if (captured.found) {
    if (captured.bad_fd) {
      std::fprintf(stderr, "COURSE_GRADER_FD must be a file descriptor number from 3 to 1023, got '%s'\n",
                   captured.said_fd);
      return 2;
    }
    ::testing::UnitTest::GetInstance()->listeners().Append(new ResultRecord());
  }
  return RUN_ALL_TESTS();
}
