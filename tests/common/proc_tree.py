"""A process's tree, read from /proc: for the tests that check that a stopped program left nothing
running."""
import os


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
