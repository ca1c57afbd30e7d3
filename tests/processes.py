"""Processes below a test's own (Linux /proc): the engine process of a service, a TP engine's ranks, the
kernels of a JupyterLab server. Used by the serving, day-0 and browser tests."""
import os
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (/proc/PID/task/TID/children lists each thread's children)."""
    out = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(k) for k in children.read_text().split()]
        except OSError:  # the thread or the process ended meanwhile
            pass
    return out


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`."""
    kids = set(children(pid))
    return kids.union(*(descendants(k) for k in kids))


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not reaped, does not)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone(pid: int, timeout: float = 20.0) -> bool:
    """Whether process `pid` ended (and was reaped) within `timeout` s."""
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    return not os.path.exists(f"/proc/{pid}")
