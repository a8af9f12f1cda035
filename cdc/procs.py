"""Processes as Linux shows them in ``/proc``: the one place that parses ``/proc/<pid>/stat``.

Nothing here raises for a process that exits while it is read: it is simply absent (None, or left out of a list).
Used by the Spark job (to end what it started before its last line), the playground's servers (to wait for a
server's children) and the benchmark (CPU and memory of process trees).
"""

from __future__ import annotations

import contextlib
import os
import signal


def stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (index 0 is the state, 1 the ppid: fields 3 and 4 of
    proc(5)), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()


def alive(pid: int) -> bool:
    """The process exists and is neither a zombie nor dead."""
    f = stat_fields(pid)
    return f is not None and f[0] not in ("Z", "X")


def parents() -> dict[int, list[int]]:
    """Every process's children, keyed by parent pid (one pass over ``/proc``)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            f = stat_fields(int(entry))
            if f is not None:
                out.setdefault(int(f[1]), []).append(int(entry))
    return out


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (zombies included)."""
    return parents().get(pid, [])


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (children, grandchildren...)."""
    tree = parents()
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def end_children() -> None:
    """SIGKILL every child of this process and reap it: when this returns, none of them runs or prints."""
    kids = children(os.getpid())
    for pid in kids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in kids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
