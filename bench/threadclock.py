"""Per-thread CPU and run-queue time of processes over a short interval, from ``/proc/<pid>/task/<tid>/schedstat``.

``schedstat`` gives each thread's time on a CPU and its time runnable but waiting for one (nanoseconds, Linux with
schedstats; ``stat``'s utime/stime are 10 ms ticks, too coarse for a catch-up of a few hundred milliseconds).
:class:`ThreadClock` samples every thread of the given processes every ``interval`` seconds on a daemon thread, so
that a catch-up's timeline shows, bucket by bucket, which thread ran, which waited for a core (run queue) and which
slept (neither: blocked on a socket, a lock, an event). A thread is seen from its first sample to its last: the CPU
of a thread that starts inside the window before its first sample, and of one that ends after its last, is missed
(each at most ``interval``, longer when the sampler itself waits for a core or for the GIL of the process it is
in). Nothing here raises for a process or thread that exits while it is read.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

# x86-64 system call numbers of the blocking calls a thread of ours or of mariadbd sleeps in (``/proc/.../syscall``)
SYSCALLS = {0: "read", 7: "poll", 23: "select", 35: "nanosleep", 45: "recvfrom", 202: "futex", 230: "nanosleep",
            232: "epoll_wait", 270: "pselect", 271: "ppoll", 281: "epoll_wait"}


def thread_state(pid: int, tid: int) -> str:
    """What thread ``tid`` of ``pid`` does now: ``run`` (running or runnable), else the name of the system call it
    sleeps in (``futex``: a lock, a condition or the GIL; ``recvfrom``/``read``/``poll``: a socket), ``?`` if
    unknown."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            raw = f.read()
        if raw[raw.rindex(b")") + 2:raw.rindex(b")") + 3] == b"R":
            return "run"
        with open(f"/proc/{pid}/task/{tid}/syscall", "rb") as f:
            first = f.read().split(maxsplit=1)[0]
    except (OSError, ValueError, IndexError):
        return "?"
    if first == b"running":
        return "run"
    try:
        return SYSCALLS.get(int(first), f"sys{int(first)}")
    except ValueError:
        return "?"


def thread_times(pid: int) -> dict[int, tuple[int, int]]:
    """``tid -> (ns on a CPU, ns runnable waiting for one)`` of every thread of ``pid`` (empty when it is gone)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                run, wait, _slices = f.read().split()
        except (OSError, ValueError):
            continue
        out[int(tid)] = (int(run), int(wait))
    return out


@dataclass
class ThreadSeries:
    """One thread's samples: ``(monotonic s, ns on a CPU, ns waiting for one)``, cumulative."""

    process: str
    tid: int
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    states: list[tuple[float, str]] = field(default_factory=list)  # (monotonic s, thread_state) when sampled

    def state_shares(self, t0: float, t1: float) -> dict[str, float]:
        """The share of the state samples between ``t0`` and ``t1`` in each state (``thread_state``)."""
        seen = [st for t, st in self.states if t0 <= t <= t1]
        return {st: seen.count(st) / len(seen) for st in sorted(set(seen), key=lambda x: -seen.count(x))}

    def between(self, t0: float, t1: float) -> tuple[float, float]:
        """(CPU s, run-queue s) between the samples nearest ``t0`` (at or before) and ``t1`` (at or after)."""
        if not self.samples:
            return 0.0, 0.0
        a = self.samples[0]
        for s in self.samples:
            if s[0] <= t0:
                a = s
        b = self.samples[-1]
        for s in reversed(self.samples):
            if s[0] >= t1:
                b = s
        return max(0, b[1] - a[1]) / 1e9, max(0, b[2] - a[2]) / 1e9


class ThreadClock:
    """Samples :func:`thread_times` of ``pids`` (``name -> pid``) every ``interval`` seconds from :meth:`start` to
    :meth:`stop`; :attr:`series` holds every thread seen, keyed by ``(process name, tid)``."""

    def __init__(self, pids: Mapping[str, int], interval: float = 0.005, states: bool = True) -> None:
        """``states``: also sample each thread's state (:func:`thread_state`), into :attr:`ThreadSeries.states`."""
        self.pids = dict(pids)
        self.interval = interval
        self.states = states
        self.series: dict[tuple[str, int], ThreadSeries] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-clock", daemon=True)

    def sample(self) -> None:
        now = time.monotonic()
        for name, pid in self.pids.items():
            for tid, (run, wait) in thread_times(pid).items():
                s = self.series.get((name, tid))
                if s is None:
                    s = self.series[(name, tid)] = ThreadSeries(name, tid)
                s.samples.append((now, run, wait))
                if self.states:
                    s.states.append((now, thread_state(pid, tid)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> ThreadClock:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(5)
            self.sample()

    def busiest(self, t0: float, t1: float, least: float = 0.005) -> list[tuple[ThreadSeries, float, float]]:
        """``(series, CPU s, run-queue s)`` of every thread with at least ``least`` s of CPU or run-queue time
        between ``t0`` and ``t1``, the busiest first."""
        out = []
        for s in self.series.values():
            cpu, wait = s.between(t0, t1)
            if cpu >= least or wait >= least:
                out.append((s, cpu, wait))
        return sorted(out, key=lambda x: -x[1])
