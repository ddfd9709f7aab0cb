#!/usr/bin/env python3
"""The HTTP server over lesson 12's MPI ranks, end to end: options it cannot combine with ranks are
refused before mpirun starts; a server whose log nobody reads (stderr a pipe left unread) answers
every request all the same; on 2 ranks (mpirun started by the server) concurrent greedy requests
get the single-process server's texts; SIGTERM stops the server gracefully (a request in flight
finishes; a second SIGTERM ends it at once); SIGTERM to the server stops every rank, exit status 0, also
when it reaches every process at once (a service manager's stop), and under an mpirun that does not
pass SIGUSR1 on to its ranks (as one Open MPI 4.1.6 did not).

    serve_cli_test.py LESSON10_SERVE_BINARY REPOSITORY_ROOT
"""
import concurrent.futures
import http.client
import json
import os
import queue
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from proc_tree import alive, descendants, signal_taken

binary, root = sys.argv[1], sys.argv[2]
model = os.path.join(root, "models", "tiny-fortunes")
PROMPTS = ["The ", "A man ", "Never ", "Love is ", "You will ", "It is "]


class Started:
    """A server on a port of its own choosing (--port 0: the banner names it; a port picked here and
    released could be taken by a parallel test before the server binds it), its stdout read as it
    comes, and the processes it started (mpirun and the ranks) found by following its children."""

    def __init__(self, *extra, preexec=None):
        self.extra = list(extra)
        self.process = subprocess.Popen([binary, "--model", model, "--port", "0"] + self.extra,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
        self.lines = queue.Queue()
        self.out = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.port = None
        self.tree = set()

    def _read(self):
        for line in self.process.stdout:
            self.out.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_ready(self):
        deadline = time.monotonic() + 30
        while self.port is None and time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            found = re.search(r"^serving .* on http://127\.0\.0\.1:(\d+) ", line)
            if found:
                self.port = int(found.group(1))
        if self.port is None:
            try:
                self.process.wait(timeout=5)  # (its stdout closed as it exits)
            except subprocess.TimeoutExpired:
                self.kill()
                sys.exit(f"the server {self.extra} printed no 'serving ... on http://127.0.0.1:PORT' line in 30 s")
            err = self.process.stderr.read()
            if "needs MPI" in err and "--tensor-parallel-size" in self.extra:
                print("serve --tensor-parallel-size 2: refused, this build has no MPI")
                sys.exit(0)
            sys.exit(f"the server {self.extra} exited {self.process.returncode}: {err}")
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1)
                self.tree = descendants(self.process.pid)
                return self
            except OSError:
                time.sleep(0.1)
        self.kill()
        sys.exit(f"the server {self.extra} did not answer /health in 30 s")

    def kill(self):
        """The server, and mpirun and its ranks (a process group of their own) where it started them."""
        for pid in descendants(self.process.pid) | self.tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.process.kill()

    def stop(self, what):
        self.process.send_signal(signal.SIGTERM)
        code, out = self.ended(what)
        if code != 0:
            sys.exit(f"{what}: exit status {code} after SIGTERM: {self.process.stderr.read()}")
        return out

    def ended(self, what):
        """Waits for the server to exit after a stop (30 s at most: then it is killed and the test
        fails, saying `what`): its exit status and all it printed on stdout."""
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            sys.exit(f"{what}: still running 30 s after SIGTERM")
        self.reader.join(timeout=10)
        return self.process.returncode, "".join(self.out)

    def all_gone(self):
        for _ in range(50):
            left = [pid for pid in self.tree if alive(pid)]
            if not left:
                return
            time.sleep(0.1)
        sys.exit(f"processes left running after the server stopped: {left}")


def complete(port, prompt):
    body = json.dumps({"model": "tiny-fortunes", "prompt": prompt, "max_tokens": 16, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)["choices"][0]["text"]


def texts(port):
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:  # all at once: one batch
        return list(pool.map(lambda p: complete(port, p), PROMPTS))


refused = subprocess.run([binary, "--model", model, "--tensor-parallel-size", "2", "--naive"],
                         capture_output=True, text=True, timeout=30)
if refused.returncode != 1 or "drop --naive" not in refused.stderr:
    sys.exit(f"--tensor-parallel-size 2 --naive: expected exit 1 saying to drop --naive, got "
             f"{refused.returncode}: {refused.stderr!r}")
if "mpirun" in refused.stdout + refused.stderr:
    sys.exit(f"a refused option must be said once, before mpirun starts: {refused.stderr!r}")
print("serve --tensor-parallel-size 2 --naive: refused before any rank starts")
for bad, fragment in [(["--cublas"], "needs --device cuda, --weights bf16"),
                      (["--cublas", "--naive"], "got --device cpu, --weights f32, --naive"),
                      (["--token-budget", "1"], "--token-budget (1) must be at least --max-running (32)"),
                      (["--naive", "--kv-blocks", "4"], "drop --kv-blocks"), (["--name", ""], "--name is empty"),
                      (["--kv-blocks", "16000000"], "GB available (lower --kv-blocks"),
                      (["--tensor-parallel-size", "3"], "--tensor-parallel-size 3: shard_plan")]:
    run = subprocess.run([binary, "--model", model] + bad, capture_output=True, text=True, timeout=30)
    if run.returncode != 1 or fragment not in run.stderr:
        sys.exit(f"serve {' '.join(bad)}: expected exit 1 saying {fragment!r}, got {run.returncode}: {run.stderr!r}")
print("serve --cublas without the GPU's bf16 engine: refused")

# Over ranks, an address the server cannot listen on is refused once, in Server::start()'s words,
# without mpirun's boxes (rank 0 said it among two of them). A build without MPI refuses the option.
with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    for bad, fragment in [(["--host", "999.1.1.1"], "'999.1.1.1' is not an IP address"),
                          (["--port", str(taken.getsockname()[1])], "cannot listen on 127.0.0.1:")]:
        run = subprocess.run([binary, "--model", model, "--tensor-parallel-size", "2"] + bad, capture_output=True,
                             text=True, timeout=60)
        if run.returncode == 1 and "needs MPI" in run.stderr:
            print(f"serve --tensor-parallel-size 2 {' '.join(bad)}: refused, this build has no MPI")
            continue
        if run.returncode != 1 or fragment not in run.stderr or "-----" in run.stderr or "mpirun" in run.stderr:
            sys.exit(f"serve --tensor-parallel-size 2 {' '.join(bad)}: expected exit 1 saying {fragment!r} without "
                     f"mpirun's boxes, got {run.returncode}: {run.stderr!r}")
print("serve --tensor-parallel-size 2: a bad --host and a port in use are refused once, without mpirun's boxes")

one = Started().wait_ready()
expected = texts(one.port)
one.stop("the single-process server")

# A log that nobody reads (its stderr a pipe left unread, as Started leaves it until the end): no
# answer may wait on it. 6,000 refused requests, each a line of about 350 bytes in the log, many
# times what a pipe holds and what the log queues: each is answered, /health too, and once
# stderr is read again the log says how many of its lines it dropped.
quiet = Started().wait_ready()
connection = http.client.HTTPConnection("127.0.0.1", quiet.port, timeout=10)
answered, t0 = 0, time.monotonic()
try:
    for _ in range(6000):
        connection.request("GET", "/v1/models/" + "m" * 150)
        answer = connection.getresponse()
        answer.read()
        answered += answer.status == 404
    health = urllib.request.urlopen(f"http://127.0.0.1:{quiet.port}/health", timeout=10).status
except OSError as e:
    quiet.kill()
    sys.exit(f"a server whose stderr nobody reads stopped answering after {answered} requests: {e!r}")
seconds = time.monotonic() - t0
err = []
reader = threading.Thread(target=lambda: err.append(quiet.process.stderr.read()), daemon=True)
reader.start()
time.sleep(0.5)
quiet.process.send_signal(signal.SIGTERM)
code, _ = quiet.ended("the server whose stderr nobody read")
reader.join(timeout=30)
dropped = re.search(r"serve: (\d+) lines of this log were dropped", "".join(err))
if answered != 6000 or health != 200 or code != 0 or not dropped:
    sys.exit(f"a server whose stderr nobody read: {answered} of 6000 answered, /health {health}, exit {code}, "
             f"its log {'said' if dropped else 'did not say'} it dropped lines")
print(f"serve with a log nobody reads: 6000 requests answered in {seconds:.1f} s, /health answered, "
      f"{dropped.group(1)} log lines dropped and said so, exit 0")

# Out of file descriptors (`ulimit -n` 64, far below --max-connections' 1,024): said at start, said
# once when accepting fails, and again when it accepts again; the connections past the limit wait
# in the system's queue, and /health is answered once the others close.
low = Started(preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))).wait_ready()
crowd = [socket.create_connection(("127.0.0.1", low.port), timeout=10) for _ in range(80)]
time.sleep(0.5)
for c in crowd:
    c.close()
try:
    health = urllib.request.urlopen(f"http://127.0.0.1:{low.port}/health", timeout=15).status
except OSError as e:
    health = repr(e)
low.process.send_signal(signal.SIGTERM)
code, _ = low.ended("the server with 64 files")
err = low.process.stderr.read()
said = [w for w in ("too few for 1024 connections", "cannot accept connections: Too many open files",
                    "accepting connections again") if w in err]
if health != 200 or code != 0 or len(said) != 3:
    sys.exit(f"a server with 64 files and 80 connections: /health {health}, exit {code}, its log said {said} "
             f"of the three lines expected: {err[-1500:]!r}")
print("serve with 64 files and 80 connections: the limit said at start, running out and accepting again "
      "each said once, /health answered after, exit 0")


def in_engine(port):
    """Requests running or waiting in the engine, by /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(m) for m in re.findall(r"^course_requests_(?:running|waiting) (\S+)$", text, re.M))


def rank0(tree):
    """The process of `tree` that is rank 0 (by the environment mpirun gave it), as a list."""
    for pid in tree:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if b"OMPI_COMM_WORLD_RANK=0\0" in f.read():
                    return [pid]
        except OSError:
            pass
    sys.exit(f"no rank 0 among {sorted(tree)}")


def streamed_while_stopped(signals, sig=signal.SIGTERM, extra=(), also=lambda tree: []):
    """A server (with `extra` options) that runs one sequence at a time (--max-running 1), sent 16
    streamed requests of 200 tokens, and then `signals` of `sig` (each 0.01 s after the server took
    the one before; each also to the processes also(its process tree) picks, at once) once the
    engine took them all (a stream's headers come then) and the first tokens came: each request's
    events, the server's exit status, its stdout, and the server (ended; its `in_at_stop`: the
    requests running or waiting then)."""
    server = Started(*extra, "--max-running", "1", "--token-budget", "1").wait_ready()
    body = json.dumps({"model": "tiny-fortunes", "prompt": "The ", "max_tokens": 200, "temperature": 0,
                       "stream": True}).encode()
    events = [[] for _ in range(16)]
    taken = [False] * 16

    def stream(i):
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            taken[i] = True
            for line in answer:
                if line.startswith(b"data: "):
                    events[i].append(line[6:].strip().decode())

    clients = [threading.Thread(target=stream, args=(i,)) for i in range(16)]
    for c in clients:
        c.start()
    deadline = time.monotonic() + 30
    while sum(map(len, events)) < 3 or not all(taken):  # (waiting for all 16 to be in: some may end first)
        if time.monotonic() > deadline:
            server.kill()
            sys.exit(f"16 requests not all taken by the engine after 30 s ({sum(taken)})")
        time.sleep(0.001)
    server.in_at_stop = in_engine(server.port)
    for i in range(signals):
        if i:  # a second stop: after the first was taken (two pending would merge), past its 5 ms
            signal_taken(server.process.pid, sig)
            time.sleep(0.01)
        for pid in also(server.tree):
            os.kill(pid, sig)
        server.process.send_signal(sig)
    for c in clients:
        c.join(timeout=60)
    return (events, *server.ended(f"the server {list(extra)} with 16 requests in, {signals} {sig.name}"), server)


def finish_reason(event):
    return None if event == "[DONE]" or "error" in json.loads(event) else json.loads(event)["choices"][0]["finish_reason"]


def stop_account(out):
    """What the server said the stop did: (ended, finished, cancelled, cut) since it, or None."""
    said = re.search(r"stopped: (\d+) requests ended since the stop: (\d+) finished .*?, (\d+) cancelled .*?, "
                     r"(\d+) ended by the stop", out)
    return tuple(int(n) for n in said.groups()) if said else None


def all_finished(what, events, code, out, server):
    """Checks that every one of the 16 requests finished (each token, its finish_reason, then
    [DONE]) and the server said so and exited 0, leaving nothing running."""
    whole = [e for e in events if e and e[-1] == "[DONE]" and any(finish_reason(x) for x in e)]
    account = stop_account(out)
    if not account or account[0] < 1 or account[1] != account[0]:
        server.kill()
        sys.exit(f"{what}: the server's account of its stop should say that every request ended since finished; "
                 f"stdout {out[-400:]!r}")
    if code != 0 or len(whole) != 16 or "the requests already in finish first" not in out:
        server.kill()  # (mpirun and the ranks, were any left)
        sys.exit(f"{what} with 16 requests in: exit {code}, {len(whole)} of 16 finished (the ends: "
                 f"{[e[-2:] for e in events]!r}), stdout {out[-400:]!r}")
    server.all_gone()
    print(f"serve: {what} with {server.in_at_stop:.0f} of 16 requests in (1 running, the others waiting): all 16 "
          f"finished ({sum(map(len, events))} events), then exit 0")


# A graceful stop: one SIGTERM (or SIGHUP: a closed terminal, systemd's SendSIGHUP), and every
# request already in, running or waiting, finishes; a second one ends them at once, with an error
# event that says why.
all_finished("one SIGTERM", *streamed_while_stopped(1))
all_finished("one SIGHUP", *streamed_while_stopped(1, signal.SIGHUP))


def second_stop_cuts(what, events, code, out, server):
    """Checks that a second stop ended what was left at once: some requests ended by an error event
    saying the server is shutting down, exit status 0, nothing left running."""
    cut = [e for e in events if any("shutting down" in x for x in e)]
    account = stop_account(out)
    if code != 0 or not cut or not account or account[3] < 1:
        server.kill()
        sys.exit(f"{what}, two SIGTERMs with 16 requests in: exit {code}, {len(cut)} ended saying the server is "
                 f"shutting down (the ends: {[e[-2:] for e in events]!r})")
    server.all_gone()
    print(f"serve{what}: a second SIGTERM ends what is left at once ({len(cut)} of 16 requests ended by an error "
          "event saying the server is shutting down), exit 0")


second_stop_cuts("", *streamed_while_stopped(2))

# --shutdown-timeout 0: no drain, the open requests end at once, each with its error event.
events, code, out, server = streamed_while_stopped(1, extra=("--shutdown-timeout", "0"))
cut = [e for e in events if any("shutting down" in x for x in e)]
if code != 0 or len(cut) < server.in_at_stop - 1 or "finish first" in out:  # (the running one may just end)
    server.kill()
    sys.exit(f"--shutdown-timeout 0, one SIGTERM with {server.in_at_stop:.0f} requests in: exit {code}, {len(cut)} "
             f"ended by the error event "
             f"(the ends: {[e[-2:] for e in events]!r}), stdout {out[-300:]!r}")
server.all_gone()
print(f"serve --shutdown-timeout 0: one SIGTERM ends the requests in at once ({len(cut)} of the "
      f"{server.in_at_stop:.0f} in by the error event)")

ranks = Started("--tensor-parallel-size", "2").wait_ready()
got = texts(ranks.port)
if got != expected:
    ranks.kill()
    sys.exit(f"on 2 ranks the greedy texts differ:\n got      {got}\n expected {expected}")
if len(ranks.tree) < 3:  # mpirun and 2 ranks under this server (and perhaps mpirun's helpers)
    ranks.kill()
    sys.exit(f"the server on 2 ranks should run mpirun and two ranks under it, found processes {sorted(ranks.tree)}")
out = ranks.stop("the server on 2 ranks")
if "tensor parallel over 2 MPI ranks" not in out:
    sys.exit(f"the server on 2 ranks must say so when it starts, printed {out!r}")
ranks.all_gone()

# Over ranks, the same graceful stop, also where the stop reaches rank 0 itself besides through
# the launcher (the launcher's SIGUSR1 is that same stop passed on: taken as a second stop, it cut
# the drain after 0.05 s).
all_finished("on 2 ranks, one SIGTERM", *streamed_while_stopped(1, extra=("--tensor-parallel-size", "2")))
all_finished("on 2 ranks, one SIGTERM to it and to rank 0",
             *streamed_while_stopped(1, extra=("--tensor-parallel-size", "2"), also=rank0))
# A second stop aborts the job (mpirun ends the ranks), which rank 0 sees coming: it ends the
# open requests with their error event and its status is the program's, 0 (before: 143).
second_stop_cuts(" on 2 ranks", *streamed_while_stopped(2, extra=("--tensor-parallel-size", "2")))

# SIGTERM to every process at once, as a service manager stops a service (systemd by default):
# mpirun, signalled too, ends the ranks a second later, so the server ends the open requests at
# once, each with an error event that says why (none cut without a word), says "stopping" and
# exits 0, without mpirun's boxes (before: exit status 1, "stopping" lost).
events, code, out, ranks = streamed_while_stopped(1, extra=("--tensor-parallel-size", "2"),
                                                  also=lambda tree: [p for p in tree if alive(p)])
err = ranks.process.stderr.read()
told = [e for e in events if e and e[-1] == "[DONE]" and (any(finish_reason(x) for x in e) or "shutting down" in e[-2])]
if code != 0 or "\nstopping\n" not in out or len(told) != 16 or "-----" in err or "mpirun" in err:
    sys.exit(f"the server on 2 ranks, SIGTERM to every process with 16 requests in: exit {code}, {len(told)} of 16 "
             f"streams ended with a finish_reason or an error (the ends: {[e[-2:] for e in events]!r}), stdout "
             f"{out[-300:]!r}, stderr {err[-2000:]!r}")
ranks.all_gone()
print(f"serve on 2 ranks, SIGTERM to every process with 16 requests in: each stream ended with its finish_reason "
      f"or an error event, 'stopping', exit 0, no box")

# An mpirun that keeps SIGUSR1 to itself (ignored, nothing forwarded): the stop must still reach
# the ranks, which the server tells directly.
with tempfile.TemporaryDirectory() as bin_dir:
    real = subprocess.run(["sh", "-c", "command -v mpirun"], capture_output=True, text=True).stdout.strip()
    fake = os.path.join(bin_dir, "mpirun")
    with open(fake, "w") as f:
        f.write(f"#!/bin/sh\ntrap '' USR1\nexec {real} --mca ess_base_forward_signals none \"$@\"\n")
    os.chmod(fake, 0o755)
    path = os.environ["PATH"]
    os.environ["PATH"] = bin_dir + os.pathsep + path
    ranks = Started("--tensor-parallel-size", "2")
    os.environ["PATH"] = path
    ranks.wait_ready()
    if texts(ranks.port) != expected:
        ranks.kill()
        sys.exit("on 2 ranks under an mpirun that forwards no signal, the greedy texts differ")
    # The case's premise: that mpirun neither catches SIGUSR1 (to forward it) nor dies of it.
    mpirun = [p for p in ranks.tree if alive(p) and open(f"/proc/{p}/comm").read().strip() in ("mpirun", "orterun", "prterun")]
    masks = {}
    for line in open(f"/proc/{mpirun[0]}/status") if mpirun else []:
        if line.startswith(("SigCgt:", "SigIgn:")):
            masks[line.split(":")[0]] = int(line.split()[1], 16)
    usr1 = 1 << (signal.SIGUSR1 - 1)
    if not mpirun:
        ranks.kill()
        sys.exit(f"the server on 2 ranks under the fake mpirun: no mpirun process found")
    # Open MPI 4.1 (Debian 12's) leaves an ignored SIGUSR1 ignored when told to forward no signal.
    # Some builds install their own handler whatever they are told (one H200 machine's did); there
    # the premise cannot be built, and the case still checks that the stop reaches every rank.
    premise = not masks.get("SigCgt", 0) & usr1 and masks.get("SigIgn", 0) & usr1
    if not premise:
        version = subprocess.run([real, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
        print(f"premise not built on this machine: its mpirun ({version[0] if version else real}) catches "
              f"SIGUSR1 even when told to forward no signal ({masks}); stopping it anyway")
    ranks.stop("the server on 2 ranks under an mpirun that forwards no signal")
    ranks.all_gone()
print(f"serve --tensor-parallel-size 2: {len(PROMPTS)} concurrent greedy requests answered as by one process; "
      "SIGTERM stopped every rank, exit 0, also when it reached every process, and under an mpirun " +
      ("that forwards no signal" if premise else "told to forward no signal (premise not built, above)"))
