"""Who works while whom waits during each Tidewater catch-up (``python -m bench --states DIR``).

:class:`StateSampler` is a :class:`bench.consumers.Profiler`: for the duration of one catch-up it samples, every
``interval`` seconds, the scheduler state (``R`` running or runnable, else waiting) and the CPU ticks of

* every thread of the capture (``/proc/<pid>/task/*/stat``), named by ``py-spy dump`` (the Python thread names:
  ``puller-<span>``, ``sink-<span>``, ``sql-sink-executor``, ...; without py-spy the thread's ``comm``);
* every backend of the servers the bench runs (children of each PostgreSQL postmaster, ``mariadbd``'s threads), with
  PostgreSQL's process title (``postgres: user db host(port) COMMIT``, ``idle in transaction``, ...: what the
  backend is doing, from ``update_process_title``, without a query that would itself load the server).

It writes ``DIR/<name>.states.txt``: per thread or backend its CPU seconds and share of samples running; per PostgreSQL
backend the share of samples per title; and the joint shares of the capture's sink-side threads (the span's sink
thread and the SQL sink's statement worker) against the target's apply backends: both running, only one, neither.
Reading ``/proc`` costs the sampler some CPU (about 1 % of a core at the default 20 ms on this host); it is not a
baseline measurement either.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.consumers import Profiler
from bench.procstat import CLK_TCK, HostCpu
from bench.profile import py_spy_binary
from cdc.procs import children

_DUMP_THREAD = re.compile(r"^Thread (\d+) \((?:idle|active|gil)[^)]*\): \"([^\"]*)\"", re.M)
# a PostgreSQL backend's title after "postgres: ": "user db host(port) STATE" or "walsender user host(port) STATE"
TITLE = re.compile(r"^postgres: (?:(walsender) )?(\S+) (\S+)? ?\S+\(\d+\) ?(.*)$")


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def state_ticks(stat: str) -> tuple[str, int]:
    """(state letter, utime + stime ticks) of a ``/proc/.../stat`` line (the name in parentheses may hold spaces)."""
    rest = stat[stat.rindex(")") + 2:].split()
    return rest[0], int(rest[11]) + int(rest[12])


@dataclass
class Track:
    """One sampled thread or process: its label, samples running, samples seen, CPU ticks at first and last
    sight, and (PostgreSQL backends) the count of samples per process title."""

    label: str
    running: int = 0
    seen: int = 0
    first_ticks: int = -1
    last_ticks: int = 0
    titles: Counter[str] = field(default_factory=Counter)

    @property
    def cpu_s(self) -> float:
        return (self.last_ticks - self.first_ticks) / CLK_TCK if self.first_ticks >= 0 else 0.0


class StateSampler(Profiler):
    """See the module docstring. ``servers`` gives the bench's server pids by name (``BenchEnv.pids``)."""

    def __init__(self, out_dir: Path, servers: Callable[[], dict[str, int]], interval: float = 0.02,
                 say: Callable[[str], None] = lambda _m: None) -> None:
        self.out_dir = Path(out_dir)
        self.servers = servers
        self.interval = interval
        self.say = say
        self.py_spy = py_spy_binary()

    def start(self, pid: int, name: str) -> Callable[[], None]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        run = _Run(pid, self.servers(), self.py_spy, self.interval)
        run.thread.start()

        def stop() -> None:
            run.stop.set()
            run.thread.join(30)
            path = self.out_dir / f"{name}.states.txt"
            path.write_text(run.report(name))
            self.say(f"states {path}")

        return stop


class _Run:
    """One catch-up's sampling (a daemon thread)."""

    def __init__(self, capture: int, servers: dict[str, int], py_spy: str | None, interval: float) -> None:
        self.capture = capture
        self.servers = {name: pid for name, pid in servers.items() if name != "cdc server"}
        self.py_spy = py_spy
        self.interval = interval
        self.stop = threading.Event()
        self.names: dict[int, str] = {}  # capture tid -> Python thread name
        self.comms: dict[int, str] = {}  # server pid -> its process name (postgres, mariadbd, etcd)
        self.tracks: dict[tuple[str, int], Track] = {}
        self.samples = 0
        self.began = self.ended = 0.0
        self.host: HostCpu | None = None
        self.host_busy: float | None = None
        # joint states per sample: (sink side running, target apply backend running) -> samples
        self.joint: Counter[tuple[bool, bool]] = Counter()
        self.applying: Counter[int] = Counter()  # apply backends (threads) running at once -> samples
        self.thread = threading.Thread(target=self._loop, name="bench-states", daemon=True)

    def _name_threads(self) -> None:
        if self.py_spy is None:
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([self.py_spy, "dump", "--nonblocking", "--pid", str(self.capture)],
                                 capture_output=True, text=True, timeout=20).stdout
            self.names.update({int(tid): name for tid, name in _DUMP_THREAD.findall(out)})

    def _loop(self) -> None:
        self.began = time.monotonic()
        self.host = HostCpu()
        next_names = 0.0
        while not self.stop.wait(self.interval):
            tids = [int(t) for t in os.listdir(f"/proc/{self.capture}/task")] \
                if os.path.isdir(f"/proc/{self.capture}/task") else []
            if any(t not in self.names for t in tids) and time.monotonic() >= next_names:
                self._name_threads()
                next_names = time.monotonic() + 1.0
            self._sample(tids)
        self.ended = time.monotonic()
        self.host_busy = self.host.busy()

    def _see(self, key: tuple[str, int], label: str, stat: str | None, title: str | None = None) -> bool:
        if stat is None:
            return False
        state, ticks = state_ticks(stat)
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = Track(label, first_ticks=ticks)
        track.seen += 1
        track.last_ticks = ticks
        running = state == "R"
        track.running += running
        if title is not None:
            track.titles[title] += 1
        return running

    def _sample(self, tids: list[int]) -> None:
        self.samples += 1
        sink_side = False
        for tid in tids:
            name = self.names.get(tid) or (_read(f"/proc/{self.capture}/task/{tid}/comm") or "?").strip()
            running = self._see(("capture", tid), f"capture thread {name}",
                                _read(f"/proc/{self.capture}/task/{tid}/stat"))
            if running and (name.startswith("sink-") or name.startswith("sql-sink")):
                sink_side = True
        applying = 0
        for server, pid in self.servers.items():
            comm = self.comms.get(pid)
            if comm is None:
                comm = self.comms[pid] = (_read(f"/proc/{pid}/comm") or "").strip()
            if comm.startswith(("mariadbd", "mysqld")):  # one process, a thread per connection
                for tid in (int(t) for t in os.listdir(f"/proc/{pid}/task")) if os.path.isdir(f"/proc/{pid}/task") \
                        else ():
                    running = self._see((server, tid), f"{server} thread {tid}", _read(f"/proc/{pid}/task/{tid}/stat"))
                    applying += running and server != "upstream"
                continue
            if comm != "postgres":
                self._see((server, pid), server, _read(f"/proc/{pid}/stat"))
                continue
            for child in children(pid):
                title = (_read(f"/proc/{child}/cmdline") or "").replace("\0", " ").strip()
                m = TITLE.match(title)
                if m is None:  # background processes: checkpointer, walwriter, ...
                    self._see((server, child), f"{server} {title.removeprefix('postgres: ')}",
                              _read(f"/proc/{child}/stat"))
                    continue
                walsender, user, db, state = m.groups()
                kind = "walsender" if walsender else f"backend {db}"
                running = self._see((server, child), f"{server} {kind} pid {child}", _read(f"/proc/{child}/stat"),
                                    state_word(state))
                if server != "upstream" and not walsender and db != "postgres":
                    applying += running
        self.joint[(sink_side, applying > 0)] += 1
        self.applying[min(applying, 2)] += 1

    def report(self, name: str) -> str:
        seconds = (self.ended or time.monotonic()) - self.began
        n = max(1, self.samples)
        lines = [f"{name}: {self.samples} samples over {seconds:.2f} s (every {self.interval * 1000:.0f} ms)", "",
                 "running share = samples in state R (running or runnable) / samples the thread or process was seen",
                 "", f"{'thread / process':60} {'CPU s':>7} {'running':>8}"]
        for track in sorted(self.tracks.values(), key=lambda t: -t.cpu_s):
            if track.cpu_s < 0.02 and track.running == 0:
                continue
            lines.append(f"{track.label[:60]:60} {track.cpu_s:7.2f} {track.running / max(1, track.seen):8.2f}")
            for title, count in track.titles.most_common(6):
                lines.append(f"    {count / max(1, track.seen):5.2f}  {title}")
        lines += ["", "sink side (the span's sink thread or the SQL sink's statement worker running) against the "
                  "target's apply backends (any backend of a target database running), share of samples:"]
        for (sink, apply), label in (((True, True), "both"), ((True, False), "sink side only"),
                                     ((False, True), "target only"), ((False, False), "neither")):
            lines.append(f"    {label:16} {self.joint[(sink, apply)] / n:5.2f}")
        lines.append("target's apply backends running at once, share of samples: " + ", ".join(
            f"{label} {self.applying[k] / n:.2f}" for k, label in ((0, "none"), (1, "one"), (2, "two or more"))))
        by_group: dict[str, float] = defaultdict(float)
        for (group, _), track in self.tracks.items():
            by_group[group] += track.cpu_s
        total = sum(by_group.values())
        lines += ["", "CPU s by process: " + ", ".join(f"{g} {s:.2f}" for g, s in sorted(by_group.items()))
                  + f"; together {total:.2f} = {total / max(seconds, 1e-9) / (os.cpu_count() or 1):.2f} of the host's "
                  f"{os.cpu_count()} cores, host busy {self.host_busy if self.host_busy is not None else float('nan'):.2f}"
                  " (a running share well above the CPU share: runnable, waiting for a core)"]
        return "\n".join(lines) + "\n"


def state_word(state: str) -> str:
    """A backend title's state without its arguments (``idle in transaction``, ``COMMIT``, ``COPY``, ``INSERT``)."""
    state = state.strip()
    if state.startswith("idle"):
        return state
    return state.split(" ", 1)[0] if state else "(none)"
