#!/usr/bin/env python3
"""`./course check` waits for the check that is using its build, and only then goes on.

Two checks in one build tree (`./course watch 00` in one terminal, `./course check 00` typed in
another) would configure, build and report over each other; the grader refuses a second grading
of a folder, but a check configures before the grader starts. So `./course check` takes the
build's grading lock (build/PRESET/.grading.lock, the one the grader takes) before anything else,
and waits for it. Here, in a copy of the `course` script beside an empty lesson 00 (so nothing of
the course's own tree is touched), with the lock held by this test: the check says it waits and
does nothing more, for 2 seconds; once the lock is let go, it goes on (to configure, which fails
there at once: there is nothing to build). Packages are reported installed by a stand-in
`dpkg-query` first on PATH, so that the check installs nothing.

  check_lock_test.py REPOSITORY_ROOT
"""
import fcntl
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time


def read_until(proc, text, seconds):
    """The check's output until a line holding `text` (included), or until `seconds` pass or it
    ends; and whether the line came."""
    out, deadline = "", time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if not ready:
            continue
        line = proc.stdout.readline()
        if not line:
            break
        out += line
        if text in line:
            return out, True
    return out, False


def main():
    root = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="check_lock_") as tree:
        shutil.copy2(os.path.join(root, "course"), tree)
        os.makedirs(os.path.join(tree, "tools"))
        shutil.copy2(os.path.join(root, "tools", "server_port.sh"), os.path.join(tree, "tools"))  # (it sources it)
        os.makedirs(os.path.join(tree, "lessons", "00_naive_decoder"))
        os.makedirs(os.path.join(tree, "build", "exercises"))
        fake = os.path.join(tree, "fake_bin")
        os.makedirs(fake)
        with open(os.path.join(fake, "dpkg-query"), "w") as f:
            f.write("#!/bin/sh\nprintf 'install ok installed'\n")
        os.chmod(os.path.join(fake, "dpkg-query"), 0o755)
        env = dict(os.environ, PATH=fake + os.pathsep + os.environ.get("PATH", ""), NO_COLOR="1")
        env.pop("COURSE_GRADING_LOCK_HELD", None)

        lock = open(os.path.join(tree, "build", "exercises", ".grading.lock"), "w")
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = subprocess.Popen([os.path.join(tree, "course"), "check", "00"], cwd=tree, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        problems = []
        try:
            out, said = read_until(proc, "waiting for it to end", 30)
            if not said:
                problems.append(f"with the build's lock held, the check did not say it waits; it said:\n{out}")
            more, _ = read_until(proc, "\n", 2)
            if more or proc.poll() is not None:
                problems.append(f"with the build's lock held, the check went on (exit {proc.poll()}): {more!r}")
            lock.close()  # let go: the check goes on, to configure (nothing to configure here: it fails)
            more, said = read_until(proc, "configuring the exercises build", 30)
            if not said:
                problems.append(f"once the lock was let go, the check did not go on to configure; it said:\n{more}")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print("ok: the check waited for the lock, said so, and went on once it was let go")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
