"""A process's tree, read from /proc: for the tests that check that a stopped program left nothing
running; and whether a process has taken a signal sent to it."""
import os
import time


def children():
    """Each running process's parent: {pid: ppid}."""
    parent = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()  # after the command's name
                parent[int(pid)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                pass
    return parent


def descendants(root):
    """The processes below `root`: its children, theirs, and so on."""
    parent = children()
    found, grew = set(), True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if pid not in found and (ppid == root or ppid in found):
                found.add(pid)
                grew = True
    return found


def alive(pid):
    """Running, not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def signal_taken(pid, sig, timeout=5.0):
    """Waits until process `pid` has taken the signal `sig` sent to it (a handler or a sigwait()
    removed it from the process's pending signals), or has ended; False after `timeout` seconds.
    Two signals of one kind sent while the first is still pending merge into one (ordinary signals
    do not queue), and a busy machine can leave a process unscheduled for longer than a test's 10 ms
    between them: a test that means two stops waits for this between the two."""
    bit = 1 << (sig - 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            return True
        if fields.get("State", "").split()[:1] == ["Z"]:
            return True
        if not (int(fields.get("ShdPnd", "0"), 16) | int(fields.get("SigPnd", "0"), 16)) & bit:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)


def stopped(pid, timeout=10.0):
    """Waits until process `pid` is stopped (SIGSTOP taken: state T), or has ended; False after
    `timeout` seconds. Signals sent to it meanwhile stay pending, all taken at once when it goes on."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("T", "t", "Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
