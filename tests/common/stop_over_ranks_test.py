#!/usr/bin/env python3
"""Ctrl-C and SIGTERM to generate and serve-offline over lesson 12's MPI ranks: the program stops
within seconds with exit status 130 (an interrupted command), says where it stopped, prints what
it finished, leaves no rank or mpirun running, and mpirun prints none of its boxes (a rank that
died of the stop's SIGUSR1, or exited non-zero, would have it print one).

    stop_over_ranks_test.py GENERATE_BINARY SERVE_OFFLINE_BINARY REPOSITORY_ROOT
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from proc_tree import alive, descendants

generate, serve_offline, root = sys.argv[1], sys.argv[2], sys.argv[3]
model = os.path.join(root, "models", "tiny-fortunes")


def stop_and_check(name, argv, sig, started, stderr_says):
    """Runs argv, waits until started(stdout so far, process tree) holds, sends sig, and checks
    the ending. Returns the stdout and stderr."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err)
        deadline = time.time() + 60
        tree = set()
        while True:
            tree |= descendants(process.pid)
            out.seek(0)
            if started(out.read(), tree):
                break
            if process.poll() is not None:
                err.seek(0)
                sys.exit(f"{name}: ended (exit {process.returncode}) before it could be stopped: "
                         f"{err.read().decode(errors='replace')[-2000:]}")
            if time.time() > deadline:
                process.kill()
                sys.exit(f"{name}: not started after 60 s")
            time.sleep(0.02)
        tree |= descendants(process.pid)
        process.send_signal(sig)
        try:
            code = process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            for pid in descendants(process.pid) | tree:
                os.kill(pid, signal.SIGKILL)
            process.kill()
            sys.exit(f"{name}: still running 20 s after {sig.name}")
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if "needs MPI" in stderr:
        return None
    if code != 130:
        sys.exit(f"{name}: exit {code} after {sig.name}, expected 130; stderr:\n{stderr[-3000:]}")
    if stderr_says not in stderr:
        sys.exit(f"{name}: stderr should say {stderr_says!r} after {sig.name}; it says:\n{stderr[-3000:]}")
    box = [line for line in stderr.splitlines() if re.fullmatch(r"-{20,}", line.strip()) or "signal" in line]
    if box:
        sys.exit(f"{name}: mpirun printed {box!r} after {sig.name}; stderr:\n{stderr[-3000:]}")
    deadline = time.time() + 5
    while [pid for pid in tree if alive(pid)] and time.time() < deadline:
        time.sleep(0.1)
    left = [pid for pid in tree if alive(pid)]
    if left:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        sys.exit(f"{name}: processes {left} (mpirun or ranks) left running after {sig.name}")
    return stdout, stderr


# generate runs the prompt up to 1,000 times one after another (--repeat): stopped after 300 bytes.
got = stop_and_check(
    "generate --tensor-parallel-size 2",
    [generate, "--model", model, "--prompt", "The ", "--max-new-tokens", "200", "--tensor-parallel-size", "2",
     "--paged", "--prefix-cache", "--repeat", "1000", "--temperature", "0"],
    signal.SIGINT, lambda stdout, tree: len(stdout) > 300, "[stopped after ")
if got is None:
    print("generate --tensor-parallel-size 2: refused, this build has no MPI")
    sys.exit(0)
stdout, stderr = got
tokens = int(re.search(r"\[stopped after (\d+) tokens\]", stderr).group(1))
if not 0 < tokens < 200 * 1000 or not stdout.startswith("The "):
    sys.exit(f"generate: stopped after {tokens} tokens, printed {len(stdout)} characters starting {stdout[:40]!r}")
print(f"generate --tensor-parallel-size 2: Ctrl-C stopped it after {tokens} tokens, exit 130, no rank left, "
      "nothing from mpirun")

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

    stdout, stderr = stop_and_check(
        "serve_offline --tensor-parallel-size 2",
        [serve_offline, "--model", model, "--prompts", prompts.name, "--max-new-tokens", "200",
         "--tensor-parallel-size", "2"],
        signal.SIGTERM, ranks_up, "[stopped: ")
finished = int(re.search(r"\[stopped: (\d+) of 2000 requests finished\]", stderr).group(1))
headers = re.findall(r"^--- request (\d+), line (\d+) ", stdout, re.M)
if len(headers) != finished or any(int(line) != int(i) + 1 for i, line in headers) or finished >= 2000:
    sys.exit(f"serve_offline: said {finished} requests finished, printed {len(headers)} "
             f"(the first: {headers[:3]})")
print(f"serve_offline --tensor-parallel-size 2: SIGTERM stopped it with {finished} of 2000 requests finished "
      "(each printed with its line), exit 130, no rank left, nothing from mpirun")
