"""CPU time and resident memory of processes, read from ``/proc`` (Linux only).

All functions return ``None`` (or skip the process) when a process is gone; none of them raises for a
process that exits while it is being read. :class:`TreeSampler` runs one daemon thread; its results are
read after :meth:`TreeSampler.stop`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cdc.procs import descendants, stat_fields

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, children: bool = False) -> float | None:
    """utime + stime of ``pid`` in seconds (plus cutime + cstime of its reaped children if ``children``)."""
    f = stat_fields(pid)
    if f is None:
        return None
    ticks = int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
    if children:
        ticks += int(f[13]) + int(f[14])  # cutime, cstime (fields 16, 17)
    return ticks / CLK_TCK


def status_bytes(pid: int, names: tuple[str, ...] = ("VmRSS", "VmHWM")) -> dict[str, int]:
    """The given ``kB`` fields of /proc/<pid>/status, in bytes (empty when the process is gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in names:
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def reset_peak_rss(pid: int) -> bool:
    """Reset the kernel's peak RSS (VmHWM) of ``pid`` to its current RSS (``5 > /proc/<pid>/clear_refs``;
    needs the right to write that file, e.g. root or the same user). True when it worked."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` (with its reaped children) plus every live descendant's."""
    total = cpu_seconds(pid, children=True) or 0.0
    for child in descendants(pid):
        total += cpu_seconds(child) or 0.0
    return total


@dataclass
class TreePeak:
    rss_peak: int  # highest sampled VmRSS of the process itself
    tree_rss_peak: int  # highest sampled sum of VmRSS over the process and its descendants
    tree_procs: int  # most processes seen in the tree at once
    samples: int


class TreeSampler:
    """Samples VmRSS of a process and of its process tree every ``interval`` seconds on a daemon thread."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid = pid
        self.interval = interval
        self._peak = TreePeak(0, 0, 0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)

    def sample(self) -> None:
        own = status_bytes(self.pid, ("VmRSS",)).get("VmRSS")
        if own is None:
            return
        tree = descendants(self.pid)
        total = own + sum(status_bytes(p, ("VmRSS",)).get("VmRSS", 0) for p in tree)
        p = self._peak
        p.rss_peak = max(p.rss_peak, own)
        p.tree_rss_peak = max(p.tree_rss_peak, total)
        p.tree_procs = max(p.tree_procs, 1 + len(tree))
        p.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> TreeSampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> TreePeak:
        """Stop sampling (idempotent), take a last sample and return the peaks."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(5)
            self.sample()
        return self._peak


class TreeCpu:
    """The CPU seconds a process tree uses from :meth:`start` to :meth:`stop`, for trees whose processes come
    and go (a Spark job, its JVM and Python workers; database backends): every ``interval`` seconds on a daemon
    thread the own CPU (utime + stime) of each process in the trees of ``roots`` is read, and the total is the
    sum over the processes of their last reading minus their reading at start (0 for a process started since).
    A process's CPU after its last reading before it exits is missed (at most ``interval`` each); reaped
    children's CPU (cutime) is never counted, so nothing is counted twice."""

    def __init__(self, roots: list[int], interval: float = 0.1) -> None:
        self.roots = roots
        self.interval = interval
        self._base: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._gone = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-cpu", daemon=True)

    def _read(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for root in self.roots:
            for pid in (root, *descendants(root)):
                v = cpu_seconds(pid)
                if v is not None:
                    out[pid] = v
        return out

    def sample(self) -> None:
        for pid, v in self._read().items():
            last = self._last.get(pid)
            if last is not None and v < last:  # the pid was reused: the process we knew is gone
                self._gone += last - self._base.pop(pid, 0.0)
            self._last[pid] = v

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> TreeCpu:
        self._base = self._read()
        self._last = dict(self._base)
        self._gone = 0.0
        self._thread.start()
        return self

    def stop(self) -> float:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(5)
            self.sample()
        return self._gone + sum(v - self._base.get(pid, 0.0) for pid, v in self._last.items())


class LastCpu:
    """Keeps the latest CPU seconds of processes that may exit at any moment (polled on a daemon thread),
    so that the CPU of a process we do not reap (a walsender, a ``cdc server`` started by someone else)
    is known up to ``interval`` before it exits."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.last: dict[int, float] = {}
        self._pids: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-watch", daemon=True)
        self._thread.start()

    def watch(self, pid: int) -> None:
        with self._lock:
            self._pids.add(pid)
        self._poll(pid)

    def _poll(self, pid: int) -> None:
        v = cpu_seconds(pid)
        if v is not None:
            with self._lock:
                self.last[pid] = v

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                pids = list(self._pids)
            for pid in pids:
                self._poll(pid)

    def total(self) -> float:
        for pid in list(self._pids):
            self._poll(pid)
        with self._lock:
            return sum(self.last.values())

    def stop(self) -> float:
        total = self.total()
        self._stop.set()
        self._thread.join(2)
        return total


class HostCpu:
    """How busy the whole host was between construction and :meth:`busy`: the share of every core's time spent not
    idle (any process: the chain measured, the bench driving it, other users of the host), from the first line of
    ``/proc/stat``. A consumer's own utilisation well below 1 while the host was near 1 means the cores went to other
    work (contention), not that the consumer waited."""

    def __init__(self) -> None:
        self.start = host_jiffies()

    def busy(self) -> float | None:
        """The host's busy share since construction (0..1); None without ``/proc/stat`` or when no time passed."""
        end = host_jiffies()
        if self.start is None or end is None:
            return None
        busy, total = end[0] - self.start[0], end[1] - self.start[1]
        return busy / total if total > 0 else None


def host_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all cores since boot: total = user + nice + system + idle + iowait + irq +
    softirq + steal, busy = total - idle - iowait (guest time is inside user already)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(v) for v in fields[1:9]]
    total = sum(ticks)
    return total - ticks[3] - ticks[4], total


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate()`` until it is true (return True) or ``timeout`` passes (return False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
