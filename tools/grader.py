#!/usr/bin/env python3
"""The grader: builds a student's lessons and runs every graded case in a sandbox.

    tools/grader.py --student DIR [--extra-tests DIR] [--lessons NN ...]
                    [--build DIR] [--source DIR] [--no-configure]
                    [--json FILE] [--csv FILE] [--junit FILE]
                    [--sandbox require|auto|off] [--timeout S] [--jobs N]
                    [--memory-mb M] [--max-output-mb M] [--show-build] [--first-failure [--checked-build CMD]]
                    [--stop-at-first-loss] [--first SUITE.CASE ...]
                    [--build-timeout S] [--build-memory-mb M] [--report-student DIR]
                    [--classroom-outputs FILE]

(A class at once: tools/roster.py, which runs this for every student of a roster.)

What it promises, and how:

* A case passes only when GoogleTest itself says so. Each case runs as its own process with a
  fresh token and a pipe (common/testing/main.cpp); the case counts as passed only if that
  process wrote "TOKEN PASS Suite.Name" after the test body returned and "TOKEN END" after the
  last test, and then exited 0. exit(0) or a crash in the middle of a test writes neither.
* No binary from an earlier run is reused: before building, the lesson's student objects,
  library and test programs are deleted (or, with --no-configure, whenever the student's
  files differ from what the last build saw), so a lesson that does not build scores zero,
  with the compiler's first error in the report.
* Student code runs sandboxed (bubblewrap): the course tree and this grading's build are
  read-only, the other builds under build/ (a roster's classmates) are hidden, the scratch
  directory, /tmp and /dev/shm are small tmpfs, there is no network, no other process is
  visible, and every process a case started dies with it (a PID namespace). prlimit caps CPU
  time, memory, file size and (run as an unprivileged uid of this grader's own when the grader
  is root) the number of processes; the grader caps the output and the wall-clock time.
* One lesson's fault stays in that lesson: each lesson is built, listed and run on its own.
  A build that runs past --build-timeout (default 20 min) is stopped, and each of its processes
  is capped at --build-memory-mb of address space: that lesson scores zero, saying why.
* The report (table, JSON, CSV, JUnit) is always written. The exit status is 0 when grading was
  completed, whatever the points, and 2 when it could not be (then the report says why).

Without a usable bubblewrap, --sandbox require (./course grade) refuses to run student code;
--sandbox off grades anyway, with a warning in the output and the report.
"""
import argparse
import concurrent.futures
import glob
import hashlib
import json
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grade_report  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# As root, a grader runs the cases as a uid of its own, unprivileged and in no passwd file: the
# process limit (prlimit --nproc) counts a uid's processes, so graders running at once (a roster's
# workers) do not share one student's count with another's.
SANDBOX_UID = 2_100_000_000 + os.getpid()  # pids stay below 2^22; uids below 2^31


class GradingError(Exception):
    """Grading itself could not be done (as opposed to a student's test failing)."""


# ------------------------------------------------------------------ sandbox --

def closed_folder(*paths):
    """The first folder on the way to one of `paths` (from /) that other users cannot enter (no x
    bit for others), or None."""
    for path in paths:
        parts = os.path.abspath(path).split(os.sep)
        for i in range(2, len(parts) + 1):
            folder = os.sep.join(parts[:i])
            try:
                if os.path.isdir(folder) and not os.stat(folder).st_mode & 0o001:
                    return folder
            except OSError:
                return None
    return None


class Sandbox:
    """How a student's program is started: bubblewrap + prlimit, or plainly."""

    def __init__(self, mode, source, build, timeout, memory_mb, max_output_mb):
        self.source, self.build = source, build
        self.timeout, self.memory_mb, self.max_output = timeout, memory_mb, max_output_mb * 2**20
        self.kind, self.note, self.unprivileged = "none", "", False
        if mode == "off":
            self.note = "not sandboxed (--sandbox off): student code could change files and leave processes"
            return
        problem = self._probe()
        if problem is None:
            return
        if mode == "require":
            raise GradingError(
                f"cannot sandbox student code: {problem}. Install bubblewrap (./course setup), "
                "or grade code you trust with --sandbox off (the report will say it was not sandboxed)")
        self.kind = "none"
        self.note = f"not sandboxed ({problem})"

    def _probe(self):
        if not shutil.which("bwrap") or not shutil.which("prlimit"):
            return "bwrap (Debian package bubblewrap) or prlimit (util-linux) is not installed"
        self.kind = "bubblewrap"
        readable = [os.path.join(self.source, "CMakeLists.txt"), self.build]
        check = ["/bin/sh", "-c", " && ".join(f"test -r '{p}'" for p in readable)]
        if os.geteuid() == 0 and shutil.which("setpriv"):
            # As an unprivileged uid, prlimit's process limit holds (it does not bind root).
            self.unprivileged = True
            rc, said = self._run_quiet(check)
            if rc == 0:
                return None
            self.unprivileged = False
            # Why, as the probe saw it: bwrap's own words where it said any (it cannot start while
            # the uid's processes are at their limit), else the test -r's.
            why = said.strip().splitlines()[-1] if said.strip() else "the course tree is not readable by other users"
            closed = closed_folder(self.source, self.build)
            if closed:  # (a clone in /root: Debian makes /root 700)
                why += (f"; {closed} is closed to other users: grade from a copy outside it, or `chmod o+x {closed}`, "
                        "to have the limit")
            self.note = (f"processes not limited in number: a sandbox as an unprivileged user did not start ({why}), so cases "
                         "run as root inside the sandbox")
        if self._run_quiet(check)[0] == 0:
            return None
        self.kind = "none"
        return "bubblewrap is installed but cannot start a sandbox here (user namespaces disabled?)"

    def _run_quiet(self, argv):
        """(return code, what it wrote to stderr, at most 4 KB) of argv in the sandbox."""
        try:
            done = subprocess.run(self.wrap(argv, "/"), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=30)
            return done.returncode, done.stderr[-4096:].decode("utf-8", "replace")
        except (OSError, subprocess.TimeoutExpired) as e:
            return -1, str(e)

    def wrap(self, argv, cwd_inside="/scratch"):
        if self.kind == "none":
            return argv
        cpu = int(self.timeout) + 10
        out = ["prlimit", f"--cpu={cpu}", f"--as={self.memory_mb * 2**20}", "--fsize=67108864", "--core=0",
               "--nproc=1024", "--"]  # threads count too: lesson 10's HTTP tests run a few hundred
        if self.unprivileged:
            out += ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "--"]
        out += ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                out += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                out += ["--ro-bind", top, top]
        out += ["--proc", "/proc", "--dev", "/dev", "--size", str(64 * 2**20), "--tmpfs", "/dev/shm"]
        for dev in sorted(os.listdir("/dev")):
            if dev.startswith("nvidia"):  # the CUDA lessons' tests need the GPU's device files
                out += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
        out += ["--size", str(64 * 2**20), "--tmpfs", "/tmp", "--size", str(64 * 2**20), "--tmpfs", "/scratch",
                "--ro-bind", self.source, self.source]
        # The course's build/ holds other builds and, in a roster, the classmates' copies and reports:
        # hidden, then this grading's own build shown again (read-only, as the rest).
        builds = os.path.join(self.source, "build")
        if os.path.isdir(builds):
            out += ["--tmpfs", builds]
        if os.path.isdir(self.build):
            out += ["--ro-bind", self.build, self.build]
        out += ["--chdir", cwd_inside, "--"]
        return out + argv


def signal_name(n):
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


# Every process the grader has running (a build's cmake, a case's sandbox), so that Ctrl-C or a
# TERM stops them with it: a build's compilers run in process groups of their own (ninja's), and a
# case in a session of its own, so neither hears a signal sent to the grader, and an orphaned build
# would go on compiling (a student's never-ending compile: gigabytes, for minutes).
LIVE = set()
LIVE_LOCK = threading.RLock()  # (reentrant: stop() runs on the main thread, which may hold it)
STOPPING = threading.Event()


def track(proc, live=True):
    with LIVE_LOCK:
        (LIVE.add if live else LIVE.discard)(proc)


def stop(signum, frame):
    """The handler of SIGINT and SIGTERM: no new case starts, every running process and all it
    started are killed, and the main thread gets KeyboardInterrupt (main() says so, exit 130)."""
    STOPPING.set()
    with LIVE_LOCK:
        procs = list(LIVE)
    # TERM first, so that a compiler's driver deletes its temporary files (a SIGKILL leaves them
    # in /tmp), then, a second later, SIGKILL for whatever is left.
    for p in procs:
        kill_tree(p.pid, signal.SIGTERM, rounds=1)
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:
        kill_tree(p.pid)
    raise KeyboardInterrupt


def run_program(sandbox, argv, timeout, with_record):
    """Runs argv (sandboxed); returns dict(rc, signal, output, truncated, flooded, timed_out, records)."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/scratch", "TMPDIR": "/scratch",
           "OMP_NUM_THREADS": "1", "GTEST_COLOR": "no"}
    if sandbox.kind == "none":
        env["HOME"] = env["TMPDIR"] = "/tmp"
    for k in ("CUDA_VISIBLE_DEVICES",):
        if k in os.environ:
            env[k] = os.environ[k]
    token = secrets.token_hex(16)
    pass_fds = ()
    rec_r = rec_w = None
    if with_record:
        rec_r, rec_w = os.pipe()
        env["COURSE_GRADER_FD"] = str(rec_w)
        env["COURSE_GRADER_TOKEN"] = token
        pass_fds = (rec_w,)
    cwd = "/" if sandbox.kind != "none" else "/tmp"
    try:
        proc = subprocess.Popen(sandbox.wrap(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd, pass_fds=pass_fds,
                                start_new_session=True)
        track(proc)
    finally:
        if rec_w is not None:
            os.close(rec_w)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    if rec_r is not None:
        sel.register(rec_r, selectors.EVENT_READ, "rec")
    head, tail, total, record = bytearray(), bytearray(), 0, bytearray()
    keep_head, keep_tail = 48 * 1024, 16 * 1024
    flooded = timed_out = False
    deadline = time.monotonic() + timeout
    exited_at = None

    def kill():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    while sel.get_map():
        now = time.monotonic()
        if proc.poll() is not None and exited_at is None:
            exited_at = now
        if exited_at is not None and now - exited_at > 2:
            kill()  # something it left behind still holds the pipes (only possible unsandboxed)
            break
        if now > deadline:
            timed_out = True
            kill()
            break
        for key, _ in sel.select(timeout=0.2):
            fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
            chunk = os.read(fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            if key.data == "rec":
                if len(record) < 1 << 20:
                    record += chunk
                continue
            total += len(chunk)
            if len(head) < keep_head:
                take = keep_head - len(head)
                head += chunk[:take]
                chunk = chunk[take:]
            tail = (tail + chunk)[-keep_tail:]
            if total > sandbox.max_output:
                flooded = True
                kill()
                sel.unregister(key.fileobj)
                break
        if flooded:
            break
    sel.close()
    kill()  # the session: whatever is left of it (the sandbox's own PID namespace already is gone)
    try:
        rc = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        rc = None
    track(proc, live=False)
    proc.stdout.close()
    if rec_r is not None:
        os.close(rec_r)
    text = head.decode("utf-8", "replace")
    truncated = total > len(head) + len(tail)
    if total > len(head):
        if truncated:
            text += f"\n[... {total - len(head) - len(tail)} bytes of output left out ...]\n"
        text += tail.decode("utf-8", "replace")
    sig = None
    if rc is not None and rc < 0:
        sig = -rc
    elif rc is not None and sandbox.kind != "none" and rc > 128:
        sig = rc - 128  # bubblewrap reports a child killed by signal N as 128 + N
    records = []
    for line in record.decode("utf-8", "replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[0] == token:
            records.append(parts[1:])
    return {"rc": rc, "signal": sig, "output": text, "flooded": flooded, "timed_out": timed_out,
            "records": records, "bytes": total}


# What REQUIRE_EMULATOR() (common/testing/device.hpp) says when it skips a case on a GPU.
EMULATOR_ONLY = "[emulator only]"


def gtest_contradicts(output, name):
    """What in GoogleTest's own lines of `output` fails to back a PASS record for case `name` (the
    grader ran the program with --gtest_filter=NAME): another filter, another case run, this one
    failed, or no line saying it ran and passed ('[ RUN      ] NAME' and '[       OK ] NAME', not
    anchored: a test's print without a newline may come just before either); None where the
    output backs it. A program that closed its standard output backs nothing: code in the test's
    process can find and forge the record, so the record alone is not enough."""
    for filt in re.findall(r"Google Test filter = (\S+)", output):
        if filt != name:
            return f"GoogleTest ran the filter {filt}, not {name}"
    for ran in re.findall(r"\[ RUN      \] (\S+)", output):
        if ran != name:
            return f"GoogleTest ran {ran}"
    if re.search(r"\[  FAILED  \] " + re.escape(name) + r"\b", output):
        return "GoogleTest said the case failed"
    if not (re.search(r"\[ RUN      \] " + re.escape(name) + r"(\s|$)", output)
            and re.search(r"\[       OK \] " + re.escape(name) + r" \(", output)):
        return (f"GoogleTest's output has no '[ RUN      ] {name}' and '[       OK ] {name}' lines (a program "
                "must not close or silence its standard output)")
    return None


def judge(name, run, timeout, max_output_mb):
    """(status, message) for one case from what its process did."""
    verdicts = {r[1]: r[0] for r in run["records"] if len(r) == 2}
    ended = any(r == ["END"] for r in run["records"])
    verdict = verdicts.get(name)
    # main() writes one verdict, then END, once: anything else was written by other code.
    if (sum(1 for r in run["records"] if len(r) == 2) > 1 or run["records"].count(["END"]) > 1
            or (ended and run["records"][-1] != ["END"])):
        return "failed", ("the program wrote more than one result for the case, or wrote after its end: "
                          "code that writes the grader's records (read the report's suspicious lines)")
    how = (f"was killed by {signal_name(run['signal'])}" if run["signal"]
           else f"exited with status {run['rc']}")
    if run["flooded"]:
        return "failed", (f"the test printed more than {max_output_mb} MiB and was stopped "
                          "(an output loop?); its first and last lines are kept")
    if run["timed_out"]:
        return "failed", (f"timed out after {timeout:g} s (an infinite loop, or waiting for something that "
                          "never comes?); every process it started was stopped")
    if verdict == "SKIP":
        return "skipped", "skipped (GTEST_SKIP): earns nothing"
    if verdict == "FAIL":
        return "failed", None  # GoogleTest's own message, in the output
    if verdict == "PASS":
        if ended and run["rc"] == 0:
            contradiction = gtest_contradicts(run["output"], name)
            if contradiction:
                return "failed", (f"the record says the case passed, but {contradiction}: code that changed "
                                  "what the program ran or wrote (read the report's suspicious lines)")
            return "passed", None
        if not ended:
            return "failed", (f"the test passed, then the program {how} before GoogleTest finished "
                              "(exit() or a crash in a test's teardown?)")
        return "failed", (f"the test passed, then the program {how} while exiting "
                          "(a global destructor or an atexit handler?)")
    if run["rc"] == 0:
        return "failed", ("the program exited with status 0 in the middle of the test, before GoogleTest "
                          "could judge it: exit(), _exit() or quick_exit() in the code under test?")
    return "failed", (f"the program {how} in the middle of the test, before GoogleTest could judge it"
                      + (" (a crash: read the output for where)" if run["signal"] else ""))


# ------------------------------------------------------------------- build --

BUILD_TIMED_OUT = 124  # run_cmd's status for a command it stopped at its deadline


def process_tree(pid):
    """pid and every process below it (by parent links in /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def kill_tree(pid, sig=signal.SIGKILL, rounds=3):
    """Sends sig (by default, kills) to pid and everything it started. Not by process group: ninja
    starts each command in a group of its own, so a compiler would outlive its build."""
    for _ in range(rounds):  # a process may fork while the tree is read
        for p in process_tree(pid):
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass


def run_cmd(argv, log, show, timeout=None):
    """Runs argv, its output appended to log (and shown); stops it and everything it started
    after timeout seconds, returning BUILD_TIMED_OUT."""
    with open(log, "a") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if show else f,
                             stderr=subprocess.STDOUT, text=True)
        track(p)
        timer = None
        if timeout:
            timer = threading.Timer(timeout, kill_tree, (p.pid,))
            timer.start()
        try:
            if show:
                for line in p.stdout:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                    f.write(line)
            rc = p.wait()
        finally:
            track(p, live=False)
            if timer:
                timer.cancel()
        if timer and rc == -signal.SIGKILL:
            f.write(f"\n[stopped after {timeout:g} s]\n")
            return BUILD_TIMED_OUT
        return rc


OUT_OF_MEMORY = r"out of memory|virtual memory exhausted"
FIRST_ERROR = re.compile(r"(: (fatal )?error:|undefined reference|multiple definition|cannot find -l|"
                         + OUT_OF_MEMORY + r"|ninja: error|CMake Error)")
# What a build that never ends (stopped by the timeout or the memory cap) most likely holds.
NEVER_ENDS = "a file that includes itself, a constexpr or template computation that does not end?"


def first_error(log_text, student):
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        if FIRST_ERROR.search(line) and "collect2" not in line:
            out = [line] + [l for l in lines[i + 1:i + 4] if l.startswith(" ")]
            text = "\n".join(out)
            if student:
                text = text.replace(student.rstrip("/") + "/", "")
            return text
    return "the build failed (no compiler message found: see the build log)"


def build_error(log_text, student, memory_mb):
    """A failed build's message: its first error, and, where the compiler ran out of the memory the
    build may use (build_limits), what most likely made it grow."""
    err = first_error(log_text, student)
    if re.search(OUT_OF_MEMORY, err):  # the hint first: a roster's row keeps the first line
        err = f"the compiler used up this build's {memory_mb} MB (--build-memory-mb): {NEVER_ENDS}\n{err}"
    return err


def provenance(path):
    """Which code `path` holds: the git commit it is at, if its files are tracked by a repository
    (and whether they differ from that commit), else None."""
    def git(*argv):
        try:
            r = subprocess.run(["git", "-C", path, *argv], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None
    if not git("ls-files", "--", "."):  # not a repository, or a folder it does not track (a build tree)
        return {"commit": None, "modified": None}
    return {"commit": git("rev-parse", "HEAD"), "modified": bool(git("status", "--porcelain", "--", "."))}


def student_code(student, origin=None):
    """The student's code: its commit where it has one, and a digest of its sources either way.
    origin: the folder `student` was copied from (a roster grades copies): its commit is the one named."""
    # Every file of the lesson folders (NN_topic/), whatever its extension: what a lesson's .cpp
    # may include.
    sources = [os.path.join(d, f) for d, _, files in os.walk(student) for f in files
               if re.match(r"\d\d_", os.path.relpath(d, student))]
    # The digest names the files relative to the folder, so a copy has its original's digest.
    h = hashlib.sha256()
    for p in sorted(sources):
        h.update(os.path.relpath(p, student).encode())
        with open(p, "rb") as f:
            h.update(f.read())
    return {**provenance(origin or student), "sources_sha256": h.hexdigest()}


def student_files(student, lesson):
    d = os.path.join(student, lesson)
    if not os.path.isdir(d):
        return []
    # Every file, not only sources: a lesson's .cpp may include any file of its folder (a .inc),
    # and what it includes is what the scan and the digest must see.
    return sorted(os.path.join(d, f) for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))


GIVEN_OBJECT = re.compile(r"given(_\w+)?\.cpp\.")  # given.cpp.o, given_api.cpp.o, given_cuda.cpp.o.d


def file_digests(paths):
    """{path: sha256 of its text} for the student's files of a lesson."""
    out = {}
    for p in paths:
        try:
            with open(p, "rb") as f:
                out[p] = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            out[p] = None  # unreadable: counted as changed
    return out


def changed_files(now, before):
    """The student's files of a lesson whose text changed since the last grading in this build, or
    None for all of them: no record, a file added or removed, or a header changed (every file may
    include it)."""
    if before is None or set(now) != set(before):
        return None
    changed = [p for p in now if now[p] is None or now[p] != before[p]]
    if any(not p.endswith((".cpp", ".cu")) for p in changed):
        return None
    return changed


def remove_outputs(build, nn, binaries, mine, changed=None, rewrites=None):
    """Deletes what the student's code of lesson NN went into, so nothing stale is run.

    mine: the student's files of the lesson; changed: those whose text changed since the last
    grading in this build (None: all of them). Only their objects go: ninja rebuilds an object when
    its source is newer, and a file put back as it was before (a copy that keeps its time) is older.
    rewrites: {student .cu file: its host C++ rewrite} (COURSE_CUDA=EMULATE, the build's manifest),
    redone by ninja only when the .cu file is newer, so deleted with the object."""
    # The course's own test objects do not depend on the student and stay; an instructor's extra
    # tests may change between two gradings, so they are rebuilt; every program is relinked.
    shutil.rmtree(os.path.join(build, "CMakeFiles", f"lesson{nn}_extra_tests.dir"), ignore_errors=True)
    for src in (mine if changed is None else changed):
        rewrite = (rewrites or {}).get(src)
        if rewrite:
            try:
                os.remove(rewrite)
            except FileNotFoundError:
                pass
    # The objects of the changed files go (of every student file: changed None); the objects of the
    # course's own given*.cpp, built from the course tree, may stay (they do not depend on the
    # student), and so may the course headers precompiled for the student's files
    # (COURSE_STUDENT_PCH: cmake_pch.*). Where ccache is installed, a student file that did not
    # change comes back from its cache: the object the same input and flags make. An object is
    # named after its source (x.cpp.o; a .cu file's: x.cu.o, or its rewrite's x.cu.cpp.o) in a
    # folder named after the source's; where a student's file has a given file's name, both go.
    names = None if changed is None else {(os.path.basename(os.path.dirname(p)), os.path.basename(p)) for p in changed}
    objects = os.path.join(build, "CMakeFiles", f"lesson{nn}_exercise.dir")
    for dirpath, _, filenames in os.walk(objects):
        where = os.path.relpath(dirpath, objects).replace(os.sep, "/")
        given_dir = re.fullmatch(r"lessons/[0-9]{2}_[^/]+", where)
        for f in filenames:
            if names is None:
                stale = not (given_dir and GIVEN_OBJECT.match(f) or where == "." and f.startswith("cmake_pch."))
            else:
                stale = any(os.path.basename(where) == folder and f.startswith(name + ".") for folder, name in names)
            if stale:
                os.remove(os.path.join(dirpath, f))
    for lib in (f"liblesson{nn}_exercise.a",):
        try:
            os.remove(os.path.join(build, lib))
        except FileNotFoundError:
            pass
    for b in binaries:
        if b:
            try:
                os.remove(b)
            except FileNotFoundError:
                pass


# --------------------------------------------------------------- suspicion --

# A call of a free function (or std::, or ::), not a member such as cache.fork() or Cache::open.
CALL = r"(?<![\w.>:])(?:std::|::)?"
SUSPICIOUS = [
    (CALL + r"(_?exit|_Exit|quick_exit|abort)\s*\(", "ends the process"),
    (CALL + r"(fork|vfork|execv|execl|execvp|execlp|execve|system|popen|posix_spawn\w*)\s*\(", "starts processes"),
    (CALL + r"(kill|raise|signal|sigaction)\s*\(", "sends or handles signals"),
    (r"\b(setjmp|longjmp|sigsetjmp|siglongjmp)\b", "jumps across functions"),
    # getenv() of one plain literal (a debug switch) is honest; of another name, or of COURSE_..., not.
    (r"getenv\s*\(\s*(?!\"(?!COURSE)[^\"]*\"\s*\))", "reads the environment"),
    (r"(environ\b|COURSE_GRADER|__libc_stack_end|getauxval|AT_EXECFN|program_invocation)",
     "reads the environment or the program's start-up data"),
    (r"\b(testing::|gtest|UnitTest|TestEventListener|RUN_ALL_TESTS|all_close|throws_error_mentioning)",
     "touches the test framework"),
    (r"\bnamespace\s+testing\b", "touches the test framework"),
    (r"(__attribute__\s*\(\s*\(\s*(constructor|destructor)|init_priority|init_array|fini_array|\bsection\s*\(|"
     r"\bifunc\b|target_clones)", "runs code before or after main"),
    (r"\[\s*(RUN|OK|PASSED|FAILED)\s*\]|Google Test", "prints what GoogleTest prints"),
    (r"\b(syscall|SYS_\w+|asm|__asm__|__asm)\b", "makes system calls or runs assembly"),
    (r"/proc/|/dev/fd|/sys/", "reads the process's or the system's files"),
    (r"^\s*#\s*include\s*[\"<](/|.*\.\./)", "includes a file from outside the lesson"),
    (CALL + r"(fopen|unlink|rename|mkdir|rmdir|chmod|open)\s*\(", "touches files"),  # (remove: std::remove
    # is also the algorithm; the compiled check sees the C library's)
    (r"^(?!\s*#\s*include).*\b(ofstream|ifstream|fstream|filebuf|std::filesystem)\b", "touches files"),
    (r"\b(close|dup[23]?|write|writev|pwrite\w*)\s*\(\s*[0-9]", "writes to or closes file descriptors"),
    (r"\b(__write|__libc_\w+|pwritev2|vmsplice|splice|sendfile|process_vm_writev)\b",
     "writes through the C library's internals"),
]


# What a lesson's compiled code has no use for, by the symbols its objects use: the text scan above
# reads the source, which macros, token pasting, split string literals and linker names can hide
# from it; the compiler's output cannot hide what it calls. Undefined symbols (C names):
SUSPICIOUS_CALLS = {
    "ends the process": {"exit", "_exit", "_Exit", "quick_exit", "abort", "atexit", "at_quick_exit", "on_exit", "err",
                         "errx", "verr", "verrx", "error", "error_at_line", "pthread_exit", "thrd_exit"},
    "looks for file descriptors": {"dprintf", "vdprintf", "fstat", "fstat64", "__fxstat", "__fxstat64", "statx",
                                   "isatty", "lseek", "lseek64", "ioctl", "fileno"},
    "reads the program's own memory layout": {"__bss_start", "_end", "end", "_edata", "edata", "__data_start",
                                              "data_start", "__executable_start", "etext", "_etext", "__etext",
                                              "dl_iterate_phdr", "dladdr", "dladdr1", "_DYNAMIC", "_r_debug"},
    "writes to or opens file descriptors": {"write", "writev", "pwrite", "pwrite64", "pwritev", "pwritev64",
                                            "pwritev2", "pwritev64v2", "__write", "send", "sendto", "sendmsg",
                                            "sendfile", "sendfile64", "splice", "vmsplice", "tee",
                                            "process_vm_writev", "syscall", "fdopen", "fopen", "fopen64", "freopen",
                                            "open", "open64", "__open", "__open64", "openat", "openat64", "creat",
                                            "dup", "dup2", "dup3", "fcntl", "fcntl64"},
    # (not getenv: a debug switch is honest, and the grader's variables are gone before a student's
    # code runs; common/testing/main.cpp)
    "reads the environment or the program's arguments": {"secure_getenv", "environ", "__environ", "_environ",
                                                         "program_invocation_name", "program_invocation_short_name",
                                                         "__libc_stack_end", "getauxval"},
    "starts processes or loads code": {"fork", "vfork", "clone", "execve", "execv", "execvp", "execvpe", "execl",
                                       "execlp", "system", "popen", "posix_spawn", "posix_spawnp", "dlopen", "dlsym",
                                       "dlvsym"},
    "sends or handles signals": {"kill", "raise", "signal", "sigaction"},
    "touches files": {"remove", "unlink", "unlinkat", "rename", "renameat", "mkdir", "rmdir", "chmod", "truncate"},
}
# ...and C++ names (mangled) by their prefix.
SUSPICIOUS_PREFIXES = {
    "_ZN7testing": "touches the test framework", "_ZN5infer7testing": "touches the test framework",
    "_ZNSt14basic_ofstream": "touches files", "_ZNSt14basic_ifstream": "touches files",
    "_ZNSt13basic_fstream": "touches files", "_ZNSt13basic_filebuf": "touches files",
    "_ZNSt10filesystem": "touches files",
}
# nvcc's registration code in every .cu object calls these.
NVCC_OWN = {"exit", "atexit"}


def symbol_findings(symbols, cu):
    """(what, symbol) for each suspicious symbol in `nm -P` output; cu: an nvcc object."""
    for line in symbols.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            for what, names in SUSPICIOUS_CALLS.items():
                if name in names and not (cu and name in NVCC_OWN):
                    yield what, name
            if name.startswith("__libc_") and not any(name in names for names in SUSPICIOUS_CALLS.values()):
                yield "reaches the C library's internals", name
            for prefix, what in SUSPICIOUS_PREFIXES.items():
                if name.startswith(prefix):
                    yield what, name
        elif kind == "i":
            yield "defines an indirect function (its resolver runs before the program starts)", name
        elif kind in "TDBRVWGS" and name.startswith(("_ZN7testing", "_ZN5infer7testing")):
            yield "defines a function of the test framework (it can replace the one the tests call)", name
        elif kind in "TDBRVWGS" and name != "main" and not name.startswith(("_Z", "DW.ref.", "__cuda", "__nv",
                                                                              "__fatbin")):
            yield "defines a C function or variable (it can replace the C library's or the test's)", name


def instruction_findings(path):
    """(what, instruction) where the object at `path` makes a system call itself (inline assembly:
    it names no symbol for the check above). Nothing where objdump is missing."""
    if not shutil.which("objdump"):
        return []
    try:
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = re.search(r"^\s*[0-9a-f]+:\s+(syscall|sysenter|svc|int\s+\$0x80)\b", text, re.M)
    return [("makes system calls itself (an instruction in its code)", found.group(1))] if found else []


def include_findings(deps, build, allowed, course):
    """(what, file) for each header in `ninja -t deps` output from the reference solutions, the
    tests, or outside the course and `allowed` (the student's folder, the build, the system)."""
    refused = tuple(os.path.join(course, d) + os.sep for d in ("solutions", "tests"))
    for dep in (d.strip() for d in deps.splitlines()[1:]):
        real = os.path.realpath(dep if os.path.isabs(dep) else os.path.join(build, dep)) if dep else ""
        if not real or real.startswith(allowed) or (real.startswith(course) and not real.startswith(refused)):
            continue
        what = ("includes the course's reference solution" if real.startswith(refused[0])
                else "includes the course's tests" if real.startswith(refused[1])
                else "includes a file from outside the lesson")
        yield what, os.path.relpath(real, course) if real.startswith(course) else real


def suspicious_objects(build, nn, student, source):
    """Lines like suspicious_lines()'s for the student's compiled objects of lesson nn: what they
    call (above), a C function they define (it can replace the C library's or the test program's),
    and a file they include from the reference solutions, the tests, or outside the course and
    their folder (ninja's record of each object's headers). Not the code run before main (an
    .init_array): `#include <iostream>` or a namespace-scope std::vector makes one in honest code,
    and what such code could do to the grader's record needs the calls above."""
    objects = os.path.join(build, "CMakeFiles", f"lesson{nn}_exercise.dir")
    allowed = [os.path.realpath(student) + os.sep, os.path.realpath(build) + os.sep, "/usr/"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        allowed.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) + os.sep)
    course = os.path.realpath(source) + os.sep
    found = []
    for dirpath, _, filenames in os.walk(objects):
        if os.path.relpath(dirpath, objects).replace(os.sep, "/").startswith(("lessons/", "build/")):
            continue  # the course's given files, and their unity builds (build/shared/unity)
        for f in sorted(x for x in filenames if x.endswith(".o")):
            path = os.path.join(dirpath, f)
            try:
                symbols = subprocess.run(["nm", "-P", path], capture_output=True, text=True, timeout=60).stdout
                deps = subprocess.run(["ninja", "-C", build, "-t", "deps", os.path.relpath(path, build)],
                                      capture_output=True, text=True, timeout=60).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            pairs = list(symbol_findings(symbols, f.endswith(".cu.o")))
            pairs += instruction_findings(path)
            pairs += include_findings(deps, build, tuple(allowed), course)
            found += [f"{f[:-2]} (compiled): {what}: {name}" for what, name in dict.fromkeys(pairs)]
    return found


def code_lines(text):
    """`text`'s lines with its comments blanked (string and character literals kept, so that a "//"
    in one starts no comment, and a comment's "//" inside /* */ hides nothing after it), and a line
    ending in a backslash joined to the next (reported at its first line; the next left empty)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    lines = "".join(out).split("\n")
    joined = list(lines)
    for k in range(len(lines) - 1, 0, -1):
        if joined[k - 1].endswith("\\"):
            joined[k - 1] = joined[k - 1][:-1] + joined[k]
            joined[k] = ""
    return joined


def suspicious_lines(paths, student):
    found = []
    for p in paths:
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                text = f.read(1 << 20)  # (a lesson's files are a few KB)
        except OSError:
            continue
        lines = text.splitlines()
        for i, code in enumerate(code_lines(text), 1):
            for pattern, what in SUSPICIOUS:
                if re.search(pattern, code):
                    shown = lines[i - 1] if i <= len(lines) else code
                    found.append(f"{os.path.relpath(p, student)}:{i}: {what}: {shown.strip()[:120]}")
                    break
    return found


# ------------------------------------------------------------------- junit --

def write_junit(path, cases, results):
    root = ET.Element("testsuites")
    by_lesson = {}
    for name, (lesson, points, _) in cases.items():
        by_lesson.setdefault(lesson, []).append(name)
    for lesson in sorted(by_lesson):
        names = by_lesson[lesson]
        suite = ET.SubElement(root, "testsuite", name=lesson, tests=str(len(names)))
        fails = 0
        for name in names:
            r = results.get(name, {"status": "not run", "message": "not run", "output": "", "time": 0})
            tc = ET.SubElement(suite, "testcase", name=name, classname=lesson, time=f"{r.get('time', 0):.3f}")
            if r["status"] == "passed":
                tc.set("status", "run")
            elif r["status"] == "skipped" or r["status"] in grade_report.UNGRADED:
                tc.set("status", "run")
                ET.SubElement(tc, "skipped", message=r.get("message") or "skipped")
            else:
                fails += 1
                tc.set("status", "fail" if r["status"] == "failed" else "notrun")
                ET.SubElement(tc, "failure", message=r.get("message") or r["status"])
            if r.get("output"):
                ET.SubElement(tc, "system-out").text = r["output"]
        suite.set("failures", str(fails))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


# ------------------------------------------------------------- the course --

def tree_snapshot(source, build):
    """(path -> (mode, size, modification time)) of the course tree, the build directories left
    out: a file saved or written while grading changes its time (a stat, not a read: the tree holds
    the bundled models' megabytes, and this runs twice a grading). Left out too: logs at the top
    of the tree (*.log, *.out, *.txt but CMakeLists.txt), which nothing builds or reads, where a
    student's `./course check 02 > check.log` writes the check's own output."""
    snap = {}
    skip = {os.path.abspath(build)}
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = [d for d in dirnames
                       if os.path.abspath(os.path.join(dirpath, d)) not in skip
                       and not (dirpath == source and d in ("build", ".git"))
                       and d != "__pycache__"]
        for f in filenames:
            if dirpath == source and f != "CMakeLists.txt" and f.endswith((".log", ".out", ".txt")):
                continue
            p = os.path.join(dirpath, f)
            try:
                st = os.lstat(p)
                snap[os.path.relpath(p, source)] = (st.st_mode, st.st_size, st.st_mtime_ns)
            except OSError:
                snap[os.path.relpath(p, source)] = None
    return snap


def build_limits(args):
    """The prefix that caps what a build may use: a student's file can make the compiler grow
    without end (a file that includes itself, twice per level), which the timeout alone stops late."""
    return ["prlimit", f"--as={args.build_memory_mb * 2**20}", "--"] if shutil.which("prlimit") else []


def configure(args, log):
    argv = ["cmake", "-S", args.source, "-B", args.build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DCOURSE_TRACK=exercises", f"-DCOURSE_EXERCISES_DIR={args.student}",
            f"-DCOURSE_EXTRA_TESTS={args.extra_tests or ''}"] + args.cmake_arg
    if run_cmd(build_limits(args) + argv, log, False, args.build_timeout) != 0:
        with open(log) as f:
            raise GradingError("cmake could not configure the grading build: "
                               + first_error(f.read(), None) + f" (log: {log})")


def load_manifest(build):
    path = os.path.join(build, "course_tests.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise GradingError(f"{path} is missing or unreadable ({e}): was the build configured?")


def list_cases(sandbox, binary, timeout):
    run = run_program(sandbox, [binary, "--gtest_list_tests"], timeout, with_record=False)
    if run["rc"] != 0 or run["timed_out"] or run["flooded"]:
        if run["timed_out"]:
            how = f"did not finish within {timeout:g} s"
        elif run["signal"]:
            how = f"was killed by {signal_name(run['signal'])}"
        else:
            how = f"exited with status {run['rc']}"
        return None, (f"the test program {how} before running any test (listing its cases): look for a "
                      "global constructor or a static variable's initializer in this lesson's code\n"
                      + run["output"][-2000:])
    names, suite = [], None
    for line in run["output"].splitlines():
        if not line.strip() or line.startswith(("Running main", "[")):
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()
        elif suite:
            names.append(suite + line.split("#")[0].strip())
    return names, None


def grade(args):
    started = time.monotonic()
    os.makedirs(args.build, exist_ok=True)
    log = os.path.join(args.build, "grader-build.log")
    open(log, "w").close()
    problems = []
    cases = grade_report.graded_cases(args.extra_tests, root=args.source)
    lessons = grade_report.lesson_dirs(args.source)
    if args.lessons:
        wanted = [f"{int(n):02d}_" for n in args.lessons]
        lessons = [l for l in lessons if any(l.startswith(w) for w in wanted)]
        if not lessons:
            raise GradingError(f"no lesson matches {' '.join(args.lessons)}")
    cases = {k: v for k, v in cases.items() if v[0] in lessons}
    if not any(os.path.isdir(os.path.join(args.student, l)) for l in grade_report.lesson_dirs(args.source)):
        raise GradingError(f"{args.report_student or args.student} holds no lesson folder (expected a copy of exercises/: "
                           f"{grade_report.lesson_dirs(args.source)[0]}/, ...; or the course's repository, whose "
                           "exercises/ folder is the one to grade)")
    results = {}
    before = tree_snapshot(args.source, args.build)

    sandbox = Sandbox(args.sandbox, args.source, args.build, args.timeout, args.memory_mb, args.max_output_mb)
    if not args.no_configure:
        configure(args, log)
    elif os.path.exists(os.path.join(args.build, "build.ninja")):
        # The build as configured, brought up to date if a CMakeLists.txt changed since (a new
        # lesson, new files): ninja re-runs CMake only then.
        run_cmd(["cmake", "--build", args.build, "--target", "build.ninja"], log, False)
    manifest = load_manifest(args.build)
    if os.path.realpath(manifest.get("exercises", "")) != os.path.realpath(args.student):
        raise GradingError(f"the build in {args.build} was configured for {manifest.get('exercises')}, "
                           f"not {args.student}")

    runs = []  # (name, binary)
    cuda_binaries = set()  # the CUDA cases' programs
    notes = {}
    # A build with COURSE_CUDA=EMULATE runs the CUDA cases on the host, kernels and all.
    has_gpu = bool(glob.glob("/dev/nvidia[0-9]*")) or manifest.get("cuda_emulated", False)
    for lesson in lessons:
        nn = lesson[:2]
        entries = [e for e in manifest["tests"] if e["lesson"] == lesson]
        lesson_cases = {k: v for k, v in cases.items() if v[0] == lesson}
        mine = student_files(args.student, lesson)
        sus = suspicious_lines(mine, args.student)
        if sus:
            notes[lesson] = sus
        missing = [e["problem"] for e in entries if e["problem"]]
        if missing:
            for name in lesson_cases:
                results[name] = {"status": "not built", "message": missing[0]}
            continue
        # The digest of each student file at the last grading in this build: a file that did not
        # change keeps its object (a new configure keeps none: its flags may differ).
        record = os.path.join(args.build, ".course", f"lesson{nn}.sources.json")
        digests = file_digests(mine)
        try:
            with open(record) as f:
                last = json.load(f) if args.no_configure else None
        except (OSError, ValueError):
            last = None
        changed = changed_files(digests, last)
        if changed is None or changed:
            remove_outputs(args.build, nn, [e["binary"] for e in entries], mine, changed, manifest.get("rewrites"))
        for e in entries:
            srcs = set(e["sources"])
            owned = {k: v for k, v in lesson_cases.items() if v[2] in srcs}
            if e["target"].endswith("_cuda_tests") and not has_gpu:
                for name in owned:
                    results[name] = {"status": "no gpu",
                                     "message": "not graded here: this machine has no CUDA device"}
                continue
            start = os.path.getsize(log)
            rc = run_cmd(build_limits(args) + ["cmake", "--build", args.build, "--target", e["target"]], log,
                         args.show_build, args.build_timeout)
            if rc != 0 or not os.path.exists(e["binary"]):
                if rc == BUILD_TIMED_OUT:
                    err = f"the build did not finish within {args.build_timeout:g} s and was stopped ({NEVER_ENDS})"
                else:
                    with open(log) as f:
                        f.seek(start)
                        err = build_error(f.read(), args.student, args.build_memory_mb)
                for name in owned:
                    results[name] = {"status": "not built", "message": f"lesson {nn} did not build:\n{err}"}
                continue
            names, trouble = list_cases(sandbox, e["binary"], min(args.timeout, 60))
            if trouble:
                for name in owned:
                    results[name] = {"status": "failed", "message": trouble}
                continue
            if e["target"].endswith("_cuda_tests"):
                cuda_binaries.add(e["binary"])
            for name in owned:
                if name in names:
                    runs.append((name, e["binary"]))
                else:
                    results[name] = {"status": "not run", "message": f"{os.path.basename(e['binary'])} has no case {name}"}
        # What the text scan already named for a file (its line, its kind) is not named again.
        named = {(os.path.basename(line.split(":")[0]), line.split(": ")[1]) for line in notes.get(lesson, [])}
        compiled = [line for line in suspicious_objects(args.build, nn, args.student, args.source)
                    if (line.split(" (compiled)")[0], line.split(": ")[1]) not in named]
        if compiled:
            notes[lesson] = notes.get(lesson, []) + compiled
        # A build without CUDA (no CUDA compiler on this machine) has no program for the CUDA
        # cases: like a machine without a device, they are not part of this grade.
        built = {src for e in entries for src in e["sources"]}
        for name, (_, _, src) in lesson_cases.items():
            if src not in built and src.endswith(("_test.cu", "_cuda_test.cpp")) and name not in results:
                results[name] = {"status": "no gpu",
                                 "message": "not graded here: CUDA is not built on this machine (no CUDA compiler)"}
        os.makedirs(os.path.dirname(record), exist_ok=True)
        with open(record, "w") as f:
            json.dump(digests, f)

    # The cases asked for first run first (in the order asked); the others keep their order.
    first = {name: i for i, name in enumerate(args.first)}
    runs.sort(key=lambda run: first.get(run[0], len(first)))
    lost = threading.Event()  # --stop-at-first-loss: set once a case is lost

    def one(item):
        name, binary = item
        if STOPPING.is_set():  # Ctrl-C or TERM: main() reports no grade
            return name, {"status": "not run", "message": "not run: grading was stopped", "output": "", "time": 0.0}
        if lost.is_set():
            return name, {"status": "not run", "message": "not run: grading stopped at the first lost case "
                          "(--stop-at-first-loss)", "output": "", "time": 0.0}
        t0 = time.monotonic()
        for _ in range(3):
            run = run_program(sandbox, [binary, f"--gtest_filter={name}"], args.timeout, with_record=True)
            # bubblewrap's own complaint and no record: the sandbox did not start (the machine's
            # processes or memory at a limit), which is no fault of the code. Tried again, then said.
            unstarted = (sandbox.kind != "none" and not run["records"] and run["rc"] == 1
                         and not run["timed_out"] and run["output"].lstrip().startswith("bwrap:"))
            if not unstarted:
                break
            time.sleep(2)
        if unstarted:
            problems.append(f"the sandbox did not start for {name}, three times: "
                            + run["output"].strip().splitlines()[0][:200])
            return name, {"status": "not run", "message": "not run: the sandbox did not start (see the report's "
                          "problems)", "output": run["output"], "time": time.monotonic() - t0}
        status, message = judge(name, run, args.timeout, args.max_output_mb)
        if status == "skipped" and binary in cuda_binaries and manifest.get("cuda_emulated", False):
            # Emulated, a CUDA case that skips asks for what only a GPU shows: it waits for one,
            # as every CUDA case does on a machine without emulation.
            status, message = "no gpu", "not graded here: it needs a GPU (the kernels are emulated in this build)"
        elif status == "skipped" and binary in cuda_binaries and EMULATOR_ONLY in run["output"]:
            # On a GPU, a case that watches what a kernel reads (only the emulator can) skips:
            # graded where the kernels are emulated, not part of this grade.
            status, message = "emulator only", ("not graded here: it watches what the kernel reads, which only the "
                                                f"kernel emulator can see (./course check {cases[name][0][:2]} "
                                                "--emulate grades it)")
        if status == "failed" and message is None:
            message = grade_report.failure_message(run["output"])
        if args.stop_at_first_loss and status not in ("passed", "skipped") and status not in grade_report.UNGRADED:
            lost.set()
        return name, {"status": status, "message": message, "output": run["output"],
                      "time": time.monotonic() - t0, "program": binary}

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, r in pool.map(one, runs):
            results[name] = r
            if args.progress:
                mark = {"passed": "ok  ", "skipped": "skip"}.get(r["status"], "FAIL")
                print(f"  {mark} {name} ({r['time']:.1f} s)", flush=True)

    after = tree_snapshot(args.source, args.build)
    if after != before:
        changed = sorted(set(before) ^ set(after) | {k for k in before if k in after and before[k] != after[k]})
        problems.append("the course tree changed while grading (a file saved during the check? the grade may "
                        "mix the old and the new version; run it again): " + ", ".join(changed[:10]))
    return cases, results, problems, notes, sandbox, time.monotonic() - started


def main():
    signal.signal(signal.SIGINT, stop)  # first: a Ctrl-C at any moment says it stopped (stop())
    signal.signal(signal.SIGTERM, stop)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--student", required=True, help="a copy of exercises/")
    ap.add_argument("--report-student", metavar="DIR",
                    help="the folder the report names, and whose git commit it gives, where --student is a copy "
                         "of it (tools/roster.py grades copies)")
    ap.add_argument("--extra-tests")
    ap.add_argument("--lessons", nargs="*", action="extend", help="the lessons to grade (NN ...; may be repeated)")
    ap.add_argument("--source", default=ROOT)
    ap.add_argument("--build")
    ap.add_argument("--no-configure", action="store_true",
                    help="use the build as configured (./course check); rebuild a lesson only where its files changed")
    ap.add_argument("--json")
    ap.add_argument("--csv")
    ap.add_argument("--junit")
    ap.add_argument("--classroom-outputs", metavar="FILE",
                    help="append lessonNN=RESULTS lines to FILE for GitHub Classroom's grading reporter "
                         "(FILE is $GITHUB_OUTPUT in a workflow; classroom/github-classroom.yml)")
    ap.add_argument("--sandbox", choices=("require", "auto", "off"), default="require")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per graded case")
    ap.add_argument("--build-timeout", type=float, default=1200,
                    help="seconds for configuring, and for building one lesson's test program")
    ap.add_argument("--build-memory-mb", type=int, default=8192,
                    help="address space of each process of a build (the compiler on a student's file)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--memory-mb", type=int, default=4096)
    ap.add_argument("--max-output-mb", type=int, default=8)
    ap.add_argument("--cmake-arg", action="append", default=[], help="passed to CMake's configure, as it is")
    ap.add_argument("--show-build", action="store_true")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--first-failure", action="store_true")
    ap.add_argument("--checked-build", metavar="COMMAND",
                    help="with --first-failure: where the first failing case got wrong numbers, name COMMAND, "
                         "the same cases with every shape and index checked (./course check NN --debug)")
    ap.add_argument("--stop-at-first-loss", action="store_true",
                    help="run no more cases once one is lost: enough to prove a submission loses points "
                         "(tools/known_wrong.py), not a grade")
    ap.add_argument("--first", action="append", default=[], metavar="SUITE.CASE",
                    help="run this case before the others (repeatable): with --stop-at-first-loss, the case "
                         "expected to catch a known-wrong implementation, so that it is often the only one run")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    for name in ("timeout", "build_timeout"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be a number of seconds above 0, got {getattr(args, name)}")
    for name in ("jobs", "memory_mb", "build_memory_mb", "max_output_mb"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be 1 or more, got {getattr(args, name)}")
    if args.lessons is not None and not args.lessons:
        ap.error("--lessons needs lesson numbers (00 to 99), as in --lessons 00 03")
    for n in args.lessons or []:
        if not re.fullmatch(r"[0-9]{1,2}", n):
            ap.error(f"--lessons takes lesson numbers (00 to 99), got '{n}'")
    args.source = os.path.abspath(args.source)
    if args.extra_tests and (why := grade_report.extra_tests_error(args.extra_tests, args.source)):
        ap.error(why)
    args.student = os.path.abspath(args.student)
    args.build = os.path.abspath(args.build or os.path.join(args.source, "build", "grade"))
    # (./course check takes the lock itself, before it configures the build, and says so.)
    if os.environ.get("COURSE_GRADING_LOCK_HELD") != args.build and (refusal := grade_report.lock_or_refusal(
            args.build, "grader", "its build and its reports", "grade into another folder (--build)")):
        print(refusal, file=sys.stderr)
        return 2
    if args.extra_tests:
        args.extra_tests = os.path.abspath(args.extra_tests)
    named = os.path.abspath(args.report_student or args.student)
    out_json = args.json or os.path.join(args.build, "grade.json")
    out_csv = args.csv or os.path.join(args.build, "grade.csv")
    out_junit = args.junit or os.path.join(args.build, "junit.xml")

    if not args.quiet:
        for w in grade_report.extra_tests_warnings(args.extra_tests, args.source):
            print(f"WARNING: {w}", file=sys.stderr)
    complete = True
    problems, notes, sandbox_kind, sandbox_note, seconds = [], {}, "none", "", 0.0
    try:
        if not os.path.isdir(args.student):
            raise GradingError(f"--student {args.student} is not a directory (expected a copy of exercises/)")
        cases, results, problems, notes, sandbox, seconds = grade(args)
        sandbox_kind, sandbox_note = sandbox.kind, sandbox.note
    except KeyboardInterrupt:  # stop() has killed what was running
        print(STOPPED, file=sys.stderr)
        return 130
    except GradingError as e:
        complete = False
        problems = [str(e)]
        cases = grade_report.graded_cases(args.extra_tests, root=args.source)
        if args.lessons:
            cases = {k: v for k, v in cases.items() if v[0][:2] in [f"{int(n):02d}" for n in args.lessons]}
        results = {n: {"status": "not run", "message": "grading could not be completed: " + str(e)} for n in cases}
    if problems:
        complete = False

    report = grade_report.build_report(cases, {k: (v["status"], v.get("output", ""), v.get("message"))
                                               for k, v in results.items()})
    report.update({"complete": complete, "problems": problems, "sandbox": sandbox_kind,
                   "sandbox_note": sandbox_note, "suspicious": notes, "seconds": round(seconds, 1),
                   "student": named, "course_code": provenance(args.source),
                   "student_code": student_code(args.student, named) if os.path.isdir(args.student) else None})
    grade_report.write_json(out_json, report)
    grade_report.write_csv(out_csv, report)
    write_junit(out_junit, cases, results)
    if args.classroom_outputs:
        grade_report.write_classroom_outputs(args.classroom_outputs, report, grade_report.lesson_dirs(args.source))

    if not args.quiet:
        if problems:  # said first too: the table below it reads like a grade
            print("NOT A GRADE: grading did not complete (why: at the end); the points below do not count.")
        grade_report.print_table(report, sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
        shown = set()
        for r in report["lessons"]:
            for t in r["tests"]:
                # (--first-failure: print_first_failure says it, once)
                if t["status"] == "not built" and r["lesson"] not in shown and not args.first_failure:
                    shown.add(r["lesson"])
                    print(f"\n{r['lesson']}: {t.get('message', 'did not build')}")
        if notes and not args.first_failure:
            print("\nLines an instructor may want to read (they are not penalized):")
            for lesson, lines in notes.items():
                for line in lines[:10]:
                    print(f"  {line}")
        # (Not for ./course check, --first-failure: a student's own code, where a limit on its
        # processes' number protects nobody; the report keeps the note.)
        if sandbox_note and not (args.first_failure and sandbox_kind == "bubblewrap"):
            print(f"\nWARNING: {sandbox_note}", file=sys.stderr)
        for p in problems:
            print(f"\nGRADING NOT COMPLETE: {p}", file=sys.stderr)
    elif problems:
        for p in problems:
            print(f"GRADING NOT COMPLETE: {p}", file=sys.stderr)
    if args.first_failure and complete:
        if grade_report.print_first_failure(report, results, args.source, args.json, args.checked_build):
            return 1
    return 0 if complete else 2


STOPPED = "\ngrader: stopped (Ctrl-C or TERM) before the end: no grade (a report left behind is an earlier run's, or incomplete)"

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # stop() has killed what was running (the report was being written?)
        print(STOPPED, file=sys.stderr)
        sys.exit(130)
