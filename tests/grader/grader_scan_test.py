#!/usr/bin/env python3
"""The grader's own checks that need no course build: judge() fails a case whose record was forged
(two results, a result after the end, a PASS that GoogleTest's own output does not show), the scan of a lesson's files flags each way of forging
or peeking that a review of the grader tried (and nothing in the reference solutions or the
starters), it reads every file of a lesson's folder (an included .inc too), and the check of the
compiled objects names what one object made of the second review's tricks calls and defines, and
the third review's system call in inline assembly and start-up data on the stack.

    grader_scan_test.py REPOSITORY_ROOT
"""
import os
import platform
import subprocess
import sys
import tempfile

root = sys.argv[1]
sys.path.insert(0, os.path.join(root, "tools"))
import grader  # noqa: E402

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


run = {"rc": 0, "signal": None, "flooded": False, "timed_out": False,
       "output": "[ RUN      ] S.T\nhello[       OK ] S.T (0 ms)\n"}
check(grader.judge("S.T", {**run, "records": [["PASS", "S.T"], ["END"]]}, 1, 8)[0] == "passed",
      "one PASS, then END (and GoogleTest's lines, one after a print without a newline)")
check(grader.judge("S.T", {**run, "output": "[ RUN      ] S.TX\n[       OK ] S.TX (0 ms)\n",
                           "records": [["PASS", "S.T"], ["END"]]}, 1, 8)[0] == "failed",
      "a PASS where GoogleTest ran another case (the filter was rewritten)")
check(grader.judge("S.T", {**run, "output": "Note: Google Test filter = x.y\n", "records": [["PASS", "S.T"], ["END"]]},
                   1, 8)[0] == "failed", "a PASS where GoogleTest ran another filter")
check(grader.judge("S.T", {**run, "output": "[ RUN      ] S.T\n[  FAILED  ] S.T (0 ms)\n",
                           "records": [["PASS", "S.T"], ["END"]]}, 1, 8)[0] == "failed",
      "a PASS where GoogleTest said the case failed")
check(grader.judge("S.T", {**run, "output": "", "records": [["PASS", "S.T"], ["END"]]}, 1, 8)[0] == "failed",
      "a PASS from a program that closed its output (code in the process can forge a record: nothing backs it)")
check(grader.judge("S.T", {**run, "output": "Note: Google Test filter = S.T\n[ RUN      ] S.T\n",
                           "records": [["PASS", "S.T"], ["END"]]}, 1, 8)[0] == "failed",
      "a PASS whose case never printed its OK line (the process wrote a record and left)")
check(grader.judge("S.T", {**run, "records": [["FAIL", "S.T"], ["END"], ["PASS", "S.T"], ["END"]]}, 1, 8)[0]
      == "failed", "a PASS written after the real FAIL and END (an atexit handler)")
check(grader.judge("S.T", {**run, "records": [["PASS", "S.T"], ["END"], ["PASS", "S.T"]]}, 1, 8)[0] == "failed",
      "a record after END")
check(grader.judge("S.T", {**run, "records": [["PASS", "S.T"], ["FAIL", "S.T"], ["END"]]}, 1, 8)[0] == "failed",
      "two verdicts for the case")

# Each line is one way a review of the grader forged a result or peeked (each, alone, in a file).
attacks = {
    "section": '__attribute__((section(".init_array"), used)) void (*p)(int, char**, char**) = boot;',
    "syscall": "  ::syscall(SYS_exit_group, 0);",
    "proc": '  std::string env = std::string("/proc/self/envi") + "ron";',
    "ifstream": "  std::ifstream in(path);",
    "spi": "#include <gtest/gtest-spi.h>",
    "reporter": "static auto* r = new ::testing::ScopedFakeTestPartResultReporter(nullptr);",
    "namespace": "namespace testing {",
    "all_close": "template <> gt::AssertionResult all_close<A, B>(const A&, const B&, double, double, const S&) {",
    "outside": '#include "/tmp/class/ada/00_naive_decoder/naive_decoder.cpp"',
    "parent": '#include "../../ada/00_naive_decoder/naive_decoder.cpp"',
    "asm": '  asm volatile("syscall");',
    "envp": '  if (std::strncmp(*e, "COURSE_GRADER_TOKEN=", 20) == 0) graded = true;',
    # The third review's: a block comment holding "//" before the line's code, the C library's
    # internal names, and the program's start-up data on the stack.
    "hidden": '  /*//*/ asm volatile("syscall" : : "a"(1));',
    "continued": '  as\\\nm volatile("syscall");',
    "_environ": "  for (char** e = _environ; *e; ++e) {}",
    "__write": "  __write(fd, line, n);",
    "stack_end": '  extern "C" long* __libc_stack_end;',
    "auxval": "  auto top = getauxval(AT_EXECFN);",
    "getenv_name": "  const char* t = std::getenv(name);",
    # The fourth review's: a resolver run before the program starts, GoogleTest's lines printed.
    "ifunc": '  void warmup() __attribute__((ifunc("pick")));',
    "gtest_line": '  std::printf("[       OK ] %s (0 ms)\\n", name);',
}
with tempfile.TemporaryDirectory() as student:
    lesson = os.path.join(student, "00_naive_decoder")
    os.makedirs(lesson)
    for name, line in attacks.items():
        with open(os.path.join(lesson, f"{name}.inc"), "w") as f:
            f.write("// an honest comment: exit(0) fork() syscall\n" + line + "\n")
    files = grader.student_files(student, "00_naive_decoder")
    check(len(files) == len(attacks), f"student_files lists every file of the folder: {files}")
    flagged = {os.path.basename(line.split(":")[0])[:-4] for line in grader.suspicious_lines(files, student)}
    for name in attacks:
        check(name in flagged, f"the scan flags {name}: {attacks[name]}")
    check(all(":2:" in line for line in grader.suspicious_lines(files, student)), "comments are not flagged")
    with open(os.path.join(lesson, "honest.cpp"), "w") as f:
        f.write("  v.erase(std::remove(v.begin(), v.end(), 0), v.end());\n  std::printf(\"%d\\n\", x);\n"
                "#include <fstream>\n  const bool debug = std::getenv(\"ROOFLINE_DEBUG\") != nullptr;\n"
                "  const char* url = \"http://example.com\";  // an environment, exit(0) in a comment\n")
    honest = grader.suspicious_lines([os.path.join(lesson, "honest.cpp")], student)
    check(not honest, f"the erase-remove idiom, a printf, <fstream>, a debug switch and a URL are not flagged: {honest}")

# The compiled check: what an object calls and defines, whatever its source text hides (a linker
# name, a split literal, token pasting). One object made of the second review's tricks.
trick = r"""
#include <cstdlib>
#include <sys/uio.h>
#include <unistd.h>
#define CAT(a, b) a##b
extern "C" long write(int, const void*, unsigned long) { return 0; }
extern "C" void _ZN7testing32ScopedFakeTestPartResultReporterC1ENS0_13InterceptModeEPNS_19TestPartResultArrayE(void*, int, void*);
static const bool early = [] {
  const char* fd = secure_getenv("COURSE_" "GRADER_FD");
  iovec v{nullptr, 0};
  if (fd) writev(3, &v, 1);
  if (!fd) _ZN7testing32ScopedFakeTestPartResultReporterC1ENS0_13InterceptModeEPNS_19TestPartResultArrayE(nullptr, 1, nullptr);
  if (fd) CAT(_ex, it)(0);
  return true;
}();
int used() { return early; }
"""
with tempfile.TemporaryDirectory() as build:
    objects = os.path.join(build, "CMakeFiles", "lesson01_exercise.dir", "student", "01_roofline")
    os.makedirs(objects)
    src = os.path.join(build, "trick.cpp")
    with open(src, "w") as f:
        f.write(trick)
    subprocess.run(["g++", "-c", "-O1", src, "-o", os.path.join(objects, "roofline.cpp.o")], check=True)
    found = " | ".join(grader.suspicious_objects(build, "01", os.path.join(build, "student"), root))
    for what in ("defines a C function or variable", ": write", ": writev", ": secure_getenv", ": _exit",
                 "_ZN7testing"):
        check(what in found, f"the compiled check names {what!r}: {found}")
    # Honest code that makes a global constructor (iostream, a namespace-scope vector) is not named.
    with open(src, "w") as f:
        f.write("#include <iostream>\n#include <vector>\nconst std::vector<int> kSizes = {1, 2, 4};\n"
                "int debug(int x) { std::cerr << x << '\\n'; return kSizes[0]; }\n")
    subprocess.run(["g++", "-c", "-O1", src, "-o", os.path.join(objects, "roofline.cpp.o")], check=True)
    honest = grader.suspicious_objects(build, "01", os.path.join(build, "student"), root)
    check(not honest, f"a debug print and a global vector are not named: {honest}")
    # The third review's: a system call in inline assembly (no symbol), the stack's start-up data.
    call = ('asm volatile("syscall" : "=a"(r) : "a"(39L) : "rcx", "r11");' if platform.machine() == "x86_64"
            else 'register long x8 asm("x8") = 172; register long x0 asm("x0"); '
                 'asm volatile("svc 0" : "=r"(x0) : "r"(x8)); r = x0;')
    with open(src, "w") as f:
        f.write('extern "C" long* __libc_stack_end;\n'
                'long peek() { long r; ' + call + ' return r + *__libc_stack_end; }\n'
                '#include <cstdlib>\nbool debug() { return std::getenv("ROOFLINE_DEBUG") != nullptr; }\n')
    subprocess.run(["g++", "-c", "-O1", src, "-o", os.path.join(objects, "roofline.cpp.o")], check=True)
    found = " | ".join(grader.suspicious_objects(build, "01", os.path.join(build, "student"), root))
    for what in ("makes system calls itself", "__libc_stack_end"):
        check(what in found, f"the compiled check names {what!r}: {found}")
    # The fourth review's: an indirect function, a strong definition of a framework template that
    # the tests' weak one yields to, a memory scan from the program's layout, the moved descriptor
    # found by fstat and written by dprintf, and an exit by errx.
    with open(src, "w") as f:
        f.write('#include <err.h>\n#include <cstdio>\n#include <sys/stat.h>\n'
                'extern "C" char __bss_start[];\n'
                'static int real() { return 1; }\n'
                'extern "C" int (*pick())() { return real; }\n'
                'int warmup() __attribute__((ifunc("pick")));\n'
                '#define NS test##ing\n'
                'namespace NS { namespace internal { template <typename T> int Cmp(T); template <> int Cmp<double>(double) '
                '{ return 0; } } }\n'
                'int forge(int fd) { struct stat st; fstat(fd, &st); dprintf(fd, "x %c\\n", __bss_start[0]); '
                'errx(0, "done"); }\n')
    subprocess.run(["g++", "-c", "-O1", src, "-o", os.path.join(objects, "roofline.cpp.o")], check=True)
    found = " | ".join(grader.suspicious_objects(build, "01", os.path.join(build, "student"), root))
    for what in ("defines an indirect function", "defines a function of the test framework", ": __bss_start",
                 ": fstat", ": dprintf", ": errx"):
        check(what in found, f"the compiled check names {what!r}: {found}")
    check("getenv" not in found, f"a debug switch's getenv is not named: {found}")

# An instructor's hidden-tests folder: what would grade nothing is said, not skipped in silence.
with tempfile.TemporaryDirectory() as extra:
    os.makedirs(os.path.join(extra, "00_naive"))
    os.makedirs(os.path.join(extra, "00_naive_decoder"))
    with open(os.path.join(extra, "00_naive_decoder", "hidden_test.cpp"), "w") as f:
        f.write("TEST(Lesson00Hidden, Plain) {}\nGRADED_TEST(Lesson00Hidden, Graded, 1) {}\n")
    said = " | ".join(grader.grade_report.extra_tests_warnings(extra, root))
    check("folder 00_naive/ names no lesson" in said, f"a misnamed lesson folder is said: {said}")
    check("hidden_test.cpp has 1 TEST()" in said, f"a plain TEST() is said: {said}")

# make_roster.py never empties a folder it did not make (a class's real one).
with tempfile.TemporaryDirectory() as d:
    with open(os.path.join(d, "ada.txt"), "w") as f:
        f.write("a student's work")
    refused = subprocess.run([sys.executable, os.path.join(root, "tools", "make_roster.py"), d], capture_output=True)
    check(refused.returncode != 0 and os.path.exists(os.path.join(d, "ada.txt")),
          "make_roster.py refuses a folder it did not make")
    check(subprocess.run([sys.executable, os.path.join(root, "tools", "make_roster.py"), "--help"],
                         capture_output=True, cwd=d).returncode != 0 and not os.path.exists(os.path.join(d, "--help")),
          "make_roster.py --help makes no folder named --help")

for track in ("solutions", "exercises"):
    base = os.path.join(root, track)
    for lesson in sorted(os.listdir(base)):
        found = grader.suspicious_lines(grader.student_files(base, lesson), base)
        check(not found, f"nothing flagged in {track}/{lesson}: {found[:3]}")

for f in failures:
    print("FAILED:", f)
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
