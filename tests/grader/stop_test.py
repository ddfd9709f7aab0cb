#!/usr/bin/env python3
"""A TERM or Ctrl-C stops the grader and everything it started.

A build's compilers run in process groups of their own (ninja starts each command so) and a case
in a session of its own, so a signal sent to the grader alone reaches neither: before the grader
handled SIGTERM, a stopped grader left its build compiling (a student's never-ending compile went
on using gigabytes). Here a stand-in for each, started by the grader's own run_cmd() (a build) and
run_program() (a case, unsandboxed), each in a group or session of its own with a child, must be
gone within 2 seconds of a SIGTERM to the process that runs them (while it still runs, as the
grader does while it says it stopped), which must exit 130 saying it stopped. Then the same with
SIGINT.

  stop_test.py REPOSITORY_ROOT
"""
import os
import signal
import subprocess
import sys
import time

CHILD = r"""
import os, sys, threading, time
sys.path.insert(0, os.path.join(sys.argv[1], "tools"))
import grader, signal
signal.signal(signal.SIGINT, grader.stop)
signal.signal(signal.SIGTERM, grader.stop)
marker = sys.argv[2]
# A case: a session of its own (run_program starts it so), with a child of its own.
sandbox = grader.Sandbox("off", sys.argv[1], "/tmp", 60, 1024, 16)  # unsandboxed: no bwrap --die-with-parent
threading.Thread(target=grader.run_program, daemon=True,
                 args=(sandbox, ["bash", "-c", f"sleep {marker}1 & sleep {marker}1; wait"], 60, False)).start()
# A build: a group of its own below it, as ninja gives each compiler.
build = f"setsid sleep {marker}2 & sleep {marker}2; wait"
try:
    print("started", flush=True)
    grader.run_cmd(["bash", "-c", build], os.devnull, False)
except KeyboardInterrupt:
    print("stopped", flush=True)
    time.sleep(3)  # still running, as the grader is while it says so: what it started must be gone
    sys.exit(130)
sys.exit(0)
"""


def alive(marker):
    """The stand-ins still running: processes whose command line holds the marker."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if f"sleep {marker}" in line]


def main():
    root = os.path.abspath(sys.argv[1])
    problems = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        marker = f"9{os.getpid() % 1000:03d}{int(sig):02d}."  # a sleep of 9xxxyy.1 s: no one else's
        proc = subprocess.Popen([sys.executable, "-c", CHILD, root, marker], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        assert proc.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 10
        while len(alive(marker)) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        if len(alive(marker)) < 6:
            problems.append(f"{sig.name}: the stand-ins did not start: {alive(marker)}")
        proc.send_signal(sig)  # to the grader's process alone, as `kill` or a scheduler sends it
        said = proc.stdout.readline().strip()
        deadline = time.monotonic() + 2  # within the 3 s it lives on after saying so
        while alive(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = alive(marker)
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        if rc != 130 or said != "stopped":
            problems.append(f"{sig.name}: expected exit 130 and 'stopped', got exit {rc} and {said!r}")
        if left:
            problems.append(f"{sig.name}: left running: {left}")
            for line in left:
                try:
                    os.kill(int(line.split()[0]), signal.SIGKILL)
                except ProcessLookupError:  # gone with the process that ran it, after all
                    pass
        if not problems:
            print(f"{sig.name}: the grader's build and case stand-ins, and their children, stopped with it")
    if problems:
        sys.exit("\n".join(problems))


if __name__ == "__main__":
    main()
