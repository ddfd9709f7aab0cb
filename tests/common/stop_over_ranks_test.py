#!/usr/bin/env python3
"""Stopping generate and serve-offline over lesson 12's MPI ranks, every way a user does: Ctrl-C
and SIGTERM mid-run (the program says where it stopped, prints what it finished, and ends by that
signal, as it would without ranks: a shell script running it stops too), a Ctrl-C in the first
milliseconds (ranks not yet ready to hear it), two Ctrl-Cs (the job is aborted, saying so), a
reader that closes the output early (`| head`: ends by SIGPIPE), SIGTERM to every process at once
(a service manager's or a batch system's stop), and SIGKILL to the launching process (mpirun ends
the job). Each time: no rank or mpirun left running, and mpirun prints none of
its boxes (a rank that died of the stop's SIGUSR1, or exited non-zero, would have it print one).

    stop_over_ranks_test.py GENERATE_BINARY SERVE_OFFLINE_BINARY REPOSITORY_ROOT
"""
import fcntl
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time

from proc_tree import alive, descendants, signal_taken, stopped

generate, serve_offline, root = sys.argv[1], sys.argv[2], sys.argv[3]
model = os.path.join(root, "models", "tiny-fortunes")
# generate runs the prompt up to 1,000 times one after another (--repeat): long enough to stop.
LONG = [generate, "--model", model, "--prompt", "The ", "--max-new-tokens", "200", "--tensor-parallel-size", "2",
        "--paged", "--prefix-cache", "--repeat", "1000", "--temperature", "0"]


def no_box(name, stderr, what):
    box = [line for line in stderr.splitlines() if re.fullmatch(r"-{20,}", line.strip()) or "signal" in line]
    if box:
        sys.exit(f"{name}: mpirun printed {box!r} after {what}; stderr:\n{stderr[-3000:]}")


def none_left(name, tree, what):
    deadline = time.time() + 10
    while [pid for pid in tree if alive(pid)] and time.time() < deadline:
        time.sleep(0.1)
    left = [pid for pid in tree if alive(pid)]
    if left:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        sys.exit(f"{name}: processes {left} (mpirun or ranks) left running after {what}")


def written(f):
    """What the program has written to the temporary file f so far. Read with pread, never with
    seek and read: the file's offset is shared with the program (its stdout is the same open file),
    and a seek(0) of ours between two writes of rank 0 made its next write land at the start of the
    file (a clean clone's run once got 't e world' for 'The world')."""
    return os.pread(f.fileno(), os.fstat(f.fileno()).st_size, 0)


def stop_and_check(name, argv, signals, started, ends_by, stderr_says, env=None, at_once=False, every_process=False):
    """Runs argv (with `env` added to the environment), waits until started(stdout so far, process
    tree) holds, sends `signals` (each 10 ms after the program took the one before, or at once;
    with every_process, each to mpirun and the ranks too, at once, as a service manager or a batch
    system stops a job), and checks that the program ended by signal `ends_by` (or by one of a
    tuple of them), said `stderr_says`, printed no box and left nothing running. Returns the stdout and stderr, or None where the build has no MPI."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, env={**os.environ, **(env or {})})
        deadline = time.time() + 60
        tree = set()
        while True:
            tree |= descendants(process.pid)
            if started(written(out), tree):
                break
            if process.poll() is not None:
                said = written(err).decode(errors="replace")
                if "needs MPI" in said:  # a build without MPI: the option is refused, saying what to install
                    return None
                sys.exit(f"{name}: ended (exit {process.returncode}) before it could be stopped: {said[-2000:]}")
            if time.time() > deadline:
                process.kill()
                sys.exit(f"{name}: not started after 60 s")
            time.sleep(0.005)
        tree |= descendants(process.pid)
        what = " and ".join(s.name for s in signals)
        if at_once:
            # Both pending when it next runs, as `timeout`'s two come: the program stopped while they
            # are sent (this test, preempted between its two kills on a busy machine, once spaced
            # them past the program's 5 ms and made them two stops).
            os.kill(process.pid, signal.SIGSTOP)
            if not stopped(process.pid):
                sys.exit(f"{name}: not stopped by SIGSTOP within 10 s")
        for i, sig in enumerate(signals):
            if i and not at_once:  # after the program took the one before (two pending merge), past 5 ms
                signal_taken(process.pid, signals[i - 1])
                time.sleep(0.01)
            for pid in descendants(process.pid) | tree if every_process else ():
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            process.send_signal(sig)
        if at_once:
            os.kill(process.pid, signal.SIGCONT)
        try:
            code = process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            for pid in descendants(process.pid) | tree:
                os.kill(pid, signal.SIGKILL)
            process.kill()
            sys.exit(f"{name}: still running 20 s after {what}")
        stdout, stderr = written(out).decode(errors="replace"), written(err).decode(errors="replace")
    if "needs MPI" in stderr:
        return None
    endings = ends_by if isinstance(ends_by, tuple) else (ends_by,)
    if code not in [-sig for sig in endings]:
        sys.exit(f"{name}: exit status {code} after {what}, expected to end by {' or '.join(e.name for e in endings)} "
                 f"({' or '.join(str(-e) for e in endings)}); stderr:\n{stderr[-3000:]}")
    if stderr_says not in stderr:
        sys.exit(f"{name}: stderr should say {stderr_says!r} after {what}; it says:\n{stderr[-3000:]}")
    no_box(name, stderr, what)
    none_left(name, tree, what)
    return stdout, stderr


got = stop_and_check("generate --tensor-parallel-size 2", LONG, [signal.SIGINT],
                     lambda stdout, tree: len(stdout) > 300, signal.SIGINT, "[stopped after ")
if got is None:
    print("generate --tensor-parallel-size 2: refused, this build has no MPI")
    sys.exit(0)
stdout, stderr = got
tokens = int(re.search(r"\[stopped after (\d+) tokens\]", stderr).group(1))
if not 0 < tokens < 200 * 1000 or not stdout.startswith("The "):
    sys.exit(f"generate: stopped after {tokens} tokens, printed {len(stdout)} characters starting {stdout[:40]!r}")
print(f"generate --tensor-parallel-size 2: Ctrl-C stopped it after {tokens} tokens, ended by SIGINT, no rank left, "
      "nothing from mpirun")

# A Ctrl-C as soon as mpirun has started, and as soon as a rank has (before it can hear a stop):
# the ranks are told once they can.
def rank_named(comm):
    """started(): a process of the tree runs `comm` (a rank, just started)."""
    def started(stdout, tree):
        for pid in tree:
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == comm:
                        return True
            except OSError:  # gone since
                pass
        return False
    return started


# The second time, each rank takes 300 ms to start (a seam of launch_ranks()): a SIGUSR1 before its
# handler is in place would kill it (and mpirun print its box) every time, not in a window of a few
# milliseconds (without the seam, a launcher that told the ranks at once failed in 1 run of 4).
for when, started, env in (("as soon as mpirun started", lambda stdout, tree: bool(tree), {}),
                           ("as soon as a rank started", rank_named("generate"),
                            {"COURSE_TEST_RANK_START_DELAY_MS": "300"})):
    stop_and_check(f"generate --tensor-parallel-size 2, Ctrl-C {when}", LONG, [signal.SIGINT], started,
                   signal.SIGINT, "[stopped after ", env)
print("generate --tensor-parallel-size 2: Ctrl-C as soon as mpirun started, and as soon as a rank did: "
      "stopped as cleanly")

# Two Ctrl-Cs: the job is aborted, and the program says so.
stop_and_check("generate --tensor-parallel-size 2, two Ctrl-Cs", LONG, [signal.SIGINT, signal.SIGINT],
               lambda stdout, tree: len(stdout) > 300, signal.SIGINT, "a second stop")
print("generate --tensor-parallel-size 2: two Ctrl-Cs abort the job, saying so, nothing left")

# A reader that closes the output early (`generate ... | head -c 100`): the ranks stop, the program
# ends by SIGPIPE as it does without ranks.
process = subprocess.Popen(LONG, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
first = process.stdout.read(100)
tree = descendants(process.pid)
process.stdout.close()
try:
    code = process.wait(timeout=20)
except subprocess.TimeoutExpired:
    process.kill()
    sys.exit("generate --tensor-parallel-size 2 | head: still running 20 s after its reader left")
stderr = process.stderr.read().decode(errors="replace")
if code != -signal.SIGPIPE or len(first) != 100:
    sys.exit(f"generate --tensor-parallel-size 2 | head: exit status {code} (expected to end by SIGPIPE, "
             f"{-signal.SIGPIPE}), read {len(first)} bytes; stderr:\n{stderr[-3000:]}")
if "[stopped after" in stderr:  # (one process ends at the write, saying nothing more)
    sys.exit(f"generate --tensor-parallel-size 2 | head: said more after its reader left: {stderr[-2000:]!r}")
no_box("generate --tensor-parallel-size 2 | head", stderr, "its reader left")
none_left("generate --tensor-parallel-size 2 | head", tree, "its reader left")
print("generate --tensor-parallel-size 2 | head: ended by SIGPIPE, nothing from mpirun, nothing left")

# A reader that leaves after the whole text (`generate ... | head -1`, the text one line): nothing
# was written after it left, so the program ends as one process does, with status 0 (before rank
# 0 wrote to the terminal itself, the launcher saw the reader gone and ended by SIGPIPE, 8 in 8).
SHORT = [generate, "--model", model, "--prompt", "Once upon", "--max-new-tokens", "40", "--temperature", "0",
         "--tensor-parallel-size", "2"]
for attempt in range(3):
    process = subprocess.Popen(SHORT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = process.stdout.readline()
    process.stdout.close()
    code = process.wait(timeout=60)
    stderr = process.stderr.read().decode(errors="replace")
    if code != 0 or not line.startswith(b"Once upon"):
        sys.exit(f"generate --tensor-parallel-size 2 | head -1: exit status {code} (expected 0: nothing was written "
                 f"after the reader left), first line {line!r}; stderr:\n{stderr[-2000:]}")
print("generate --tensor-parallel-size 2 | head -1, the text whole: exit status 0, as one process")

# A reader that stopped reading (a pipe of 4 KiB, full): rank 0 waits in write() and never ends its
# step, so one SIGTERM ends the job a second later (before, only a second signal did).
read_end, write_end = os.pipe()
size = fcntl.fcntl(write_end, 1031, 4096)  # F_SETPIPE_SZ: the size it got
process = subprocess.Popen(LONG, stdout=write_end, stderr=subprocess.PIPE)
os.close(write_end)
# The pipe full (FIONREAD: the bytes in it), then a second more: rank 0 is waiting in write(). (A
# fixed 3 s was not always enough: on a busy machine the ranks had written 3,331 bytes by then.)
deadline = time.time() + 60
while struct.unpack("i", fcntl.ioctl(read_end, termios.FIONREAD, b"\0\0\0\0"))[0] < size:
    if time.time() > deadline or process.poll() is not None:
        process.kill()
        sys.exit(f"generate --tensor-parallel-size 2: its output never filled a pipe of {size} bytes")
    time.sleep(0.05)
time.sleep(1)
tree = descendants(process.pid)
process.send_signal(signal.SIGTERM)
try:
    code = process.wait(timeout=15)
except subprocess.TimeoutExpired:
    process.kill()
    sys.exit("generate --tensor-parallel-size 2, its reader not reading: still running 15 s after one SIGTERM")
os.close(read_end)
stderr = process.stderr.read().decode(errors="replace")
if code != -signal.SIGTERM or "stopped reading" not in stderr:
    sys.exit(f"generate --tensor-parallel-size 2, its reader not reading: exit status {code} after SIGTERM "
             f"(expected to end by it, saying why); stderr:\n{stderr[-2000:]}")
no_box("generate --tensor-parallel-size 2, its reader not reading", stderr, "SIGTERM")
none_left("generate --tensor-parallel-size 2, its reader not reading", tree, "SIGTERM")
print("generate --tensor-parallel-size 2 with a reader that stopped reading: one SIGTERM ends it, saying why")

# `timeout` signals the program and then, at once, its process group: the two are one stop (the
# second, as a second stop, aborted the job in 2 runs of 11). Here SIGTERM and SIGHUP at once (two
# of one signal, both pending, would be one by the kernel's rules: the case could not fail).
_, stderr = stop_and_check("generate --tensor-parallel-size 2, SIGTERM and SIGHUP at once", LONG,
                           [signal.SIGTERM, signal.SIGHUP], lambda stdout, tree: len(stdout) > 300,
                           (signal.SIGTERM, signal.SIGHUP), "[stopped after ", at_once=True)
if "a second stop" in stderr:
    sys.exit(f"generate --tensor-parallel-size 2: SIGTERM and SIGHUP at once were taken as two stops:\n"
             f"{stderr[-2000:]}")
print("generate --tensor-parallel-size 2: two stops at once are one")

# SIGTERM to every process at once (systemd's default stop, a batch system's cancel): mpirun, told
# too, ends the ranks a second later, but each rank takes the signal as the stop, so rank 0 says
# where it stopped and the program ends by SIGTERM (before: exit status 1, nothing said).
stop_and_check("generate --tensor-parallel-size 2, SIGTERM to every process", LONG, [signal.SIGTERM],
               lambda stdout, tree: len(stdout) > 300, signal.SIGTERM, "[stopped after ", every_process=True)
print("generate --tensor-parallel-size 2: SIGTERM to every process at once stops it as one process")

# SIGKILL to the launching process: mpirun, told by the kernel, ends the job.
process = subprocess.Popen(LONG, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
deadline = time.time() + 60
while len(descendants(process.pid)) < 3 and time.time() < deadline:  # mpirun and its two ranks
    time.sleep(0.02)
tree = descendants(process.pid)
process.kill()
process.wait()
none_left("generate --tensor-parallel-size 2", tree, "SIGKILL to the launching process")
print("generate --tensor-parallel-size 2: SIGKILL to it ends mpirun and the ranks")

# serve-offline on 2,000 prompts, stopped a second after both ranks run: the finished requests are
# printed.
with tempfile.NamedTemporaryFile("w", suffix=".txt") as prompts:
    prompts.write("".join(f"Fortune {i}: \n" for i in range(2000)))
    prompts.flush()
    up_since = []

    def ranks_up(stdout, tree):
        """Both ranks (mpirun's children, each a serve_offline) running for a second: some requests
        have finished then (each is 200 tokens at most, 8 at a time)."""
        ranks = 0
        for pid in tree:
            try:
                with open(f"/proc/{pid}/comm") as f:
                    ranks += alive(pid) and f.read().strip() == "serve_offline"
            except OSError:  # gone since
                pass
        if ranks >= 2 and not up_since:
            up_since.append(time.time())
        return bool(up_since) and time.time() - up_since[0] > 1

    # SIGTERM to it, then to every process at once (a batch system cancelling the job).
    for every_process, to_whom in ((False, "SIGTERM"), (True, "SIGTERM to every process")):
        up_since.clear()
        stdout, stderr = stop_and_check(
            f"serve_offline --tensor-parallel-size 2, {to_whom}",
            [serve_offline, "--model", model, "--prompts", prompts.name, "--max-new-tokens", "200",
             "--tensor-parallel-size", "2"],
            [signal.SIGTERM], ranks_up, signal.SIGTERM, "[stopped: ", every_process=every_process)
        finished = int(re.search(r"\[stopped: (\d+) of 2000 requests finished\]", stderr).group(1))
        headers = re.findall(r"^--- request (\d+), line (\d+) ", stdout, re.M)
        if len(headers) != finished or any(int(line) != int(i) + 1 for i, line in headers) or finished >= 2000:
            sys.exit(f"serve_offline, {to_whom}: said {finished} requests finished, printed {len(headers)} "
                     f"(the first: {headers[:3]})")
        print(f"serve_offline --tensor-parallel-size 2: {to_whom} stopped it with {finished} of 2000 requests "
              "finished (each printed with its line), ended by SIGTERM, no rank left, nothing from mpirun")
