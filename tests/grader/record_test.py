#!/usr/bin/env python3
"""The record the grader trusts cannot be rewritten by a `write` of the student's.

Runs tests/grader/forged_write.cpp's program (a failing case, and a `write` that rewrites FAIL to
PASS) as tools/grader.py does, with a pipe and a token, and checks what reaches the pipe: the
case's FAIL, then END. Also that the program's `write` did replace the C library's (a line its
probe case writes comes out rewritten), so the check is not empty.

  record_test.py PROGRAM
"""
import os
import subprocess
import sys


def main():
    program = sys.argv[1]
    read_end, write_end = os.pipe()
    env = {"PATH": "/usr/bin:/bin", "COURSE_GRADER_FD": str(write_end), "COURSE_GRADER_TOKEN": "t0k3n",
           "GTEST_COLOR": "no"}
    proc = subprocess.Popen([program, "--gtest_filter=Forged.FailsWhateverWriteSays"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, pass_fds=(write_end,))
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        record = f.read().decode()
    output = proc.communicate()[0].decode("utf-8", "replace")
    problems = []
    if record.splitlines() != ["t0k3n FAIL Forged.FailsWhateverWriteSays", "t0k3n END"]:
        problems.append(f"the record should be the case's FAIL, then END; it is {record!r}")
    if proc.returncode == 0:
        problems.append("the program should exit 1 (a case failed)")
    if "this case must fail" not in output:
        problems.append("the case's failure message is missing from the output:\n" + output)
    # Not an empty check: the program's own write() is the one it calls.
    probe = subprocess.run([program, "--gtest_filter=Forged.Probe"], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"})
    if "probe: PASS here" not in probe.stdout:
        problems.append("the program's write() should have rewritten its probe line; it printed:\n" + probe.stdout)
    for p in problems:
        print("FAILED:", p)
    if not problems:
        print("the forged write left the record alone: FAIL, then END")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
