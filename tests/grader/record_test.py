#!/usr/bin/env python3
"""The record the grader trusts cannot be rewritten by a `write` of the student's.

Runs tests/grader/forged_write.cpp's program (a failing case, and a `write` that rewrites FAIL to
PASS) as tools/grader.py does, with a pipe and a token, and checks what reaches the pipe: the
case's FAIL, then END. Also that the program's `write` did replace the C library's (a line its
probe case writes comes out rewritten), so the check is not empty; and that code the program
runs before main finds neither the token nor the descriptor the grader named (main.cpp took
both, in its .preinit_array function, before any constructor ran).

  record_test.py PROGRAM
"""
import os
import subprocess
import sys


def run_graded(program, case, env):
    """(exit status, the record, the output) of `program` running `case` as the grader runs it: a
    pipe for the record, its number in COURSE_GRADER_FD (and in RECORD_TEST_FD, for the snoop)."""
    read_end, write_end = os.pipe()
    env = {**env, "COURSE_GRADER_FD": str(write_end), "RECORD_TEST_FD": str(write_end)}
    proc = subprocess.Popen([program, f"--gtest_filter={case}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, pass_fds=(write_end,))
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        record = f.read().decode()
    output = proc.communicate()[0].decode("utf-8", "replace")
    return proc.returncode, record, output


def main():
    program = sys.argv[1]
    env = {"PATH": "/usr/bin:/bin", "COURSE_GRADER_TOKEN": "t0k3n", "GTEST_COLOR": "no"}
    rc, record, output = run_graded(program, "Forged.FailsWhateverWriteSays", env)
    problems = []
    if record.splitlines() != ["t0k3n FAIL Forged.FailsWhateverWriteSays", "t0k3n END"]:
        problems.append(f"the record should be the case's FAIL, then END; it is {record!r}")
    if rc == 0:
        problems.append("the program should exit 1 (a case failed)")
    if "this case must fail" not in output:
        problems.append("the case's failure message is missing from the output:\n" + output)
    # Not an empty check: the program's own write() is the one it calls.
    probe = subprocess.run([program, "--gtest_filter=Forged.Probe"], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"})
    if "probe: PASS here" not in probe.stdout:
        problems.append("the program's write() should have rewritten its probe line; it printed:\n" + probe.stdout)
    # Code run before main finds neither the token nor the descriptor the grader named.
    _, record, output = run_graded(program, "Forged.Snoop", env)
    if "snoop: token=none; entries=0; fd closed" not in output:
        problems.append("code before main should find no token, no grader entry in the environment and the "
                        "descriptor closed; it printed:\n" + output)
    if record.splitlines() != ["t0k3n PASS Forged.Snoop", "t0k3n END"]:
        problems.append(f"the snooping case's record should be its PASS, then END; it is {record!r}")
    for p in problems:
        print("FAILED:", p)
    if not problems:
        print("the forged write left the record alone: FAIL, then END")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
