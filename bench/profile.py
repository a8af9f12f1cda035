"""Sampling profiles of the capture during each Tidewater catch-up (``python -m bench --profile DIR``).

:class:`PySpyProfiler` attaches ``py-spy record --nonblocking --format speedscope`` (``pip install
py-spy`` into the venv) to the ``cdc server`` for the duration of one catch-up and writes
``DIR/<workload>-<sink>.speedscope.json``; :func:`summarise` turns such a file into the functions with
the most *self* time (the frame on top of the stack when sampled) and the most *inclusive* time, and the
busiest threads. Samples of idle threads are not recorded by py-spy (it skips threads waiting in
known blocking calls), so percentages are of busy samples. Profiling costs the capture some CPU: figures
measured with ``--profile`` are not baseline figures.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.consumers import Profiler


def py_spy_binary() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


class PySpyProfiler(Profiler):
    def __init__(self, out_dir: Path, rate: int = 100, say: Callable[[str], None] = lambda _m: None,
                 idle: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.rate = rate
        self.idle = idle  # also sample threads that wait (py-spy --idle): where the time goes, not only the CPU
        self.say = say
        self.files: list[Path] = []
        binary = py_spy_binary()
        if binary is None:
            raise RuntimeError("py-spy is not installed: .venv/bin/pip install py-spy")
        self.binary = binary

    def start(self, pid: int, name: str) -> Callable[[], None]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{name}.speedscope.json"
        log = open(self.out_dir / f"{name}.py-spy.log", "wb")  # noqa: SIM115 - closed by stop()
        proc = subprocess.Popen([self.binary, "record", "--pid", str(pid), "--rate", str(self.rate), "--nonblocking",
                                 "--threads", "--format", "speedscope", "--output", str(path)] + (["--idle"] if self.idle else []),
                                stdout=log, stderr=subprocess.STDOUT)
        time.sleep(0.5)  # attach before the catch-up starts

        def stop() -> None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.close()
            if path.exists():
                self.files.append(path)
                summary = summarise(path)
                (self.out_dir / f"{name}.summary.txt").write_text(format_summary(summary, name))
                self.say(f"profile {path} ({summary.busy_s:.1f} busy seconds)")

        return stop


@dataclass
class ProfileSummary:
    busy_s: float  # sampled busy time, all threads (seconds: py-spy's speedscope weights)
    self_time: list[tuple[str, float]]  # (function, seconds on top of the stack), most first
    inclusive: list[tuple[str, float]]  # (function, seconds with it anywhere on the stack), most first
    threads: list[tuple[str, float]]  # (thread, seconds), most first
    components: list[tuple[str, float]]  # (component of the leaf frame, seconds), most first


_PACKAGES = ("cdc", "cli", "capture", "owner", "processor", "sorter", "sinks", "upstream", "spark_jobs", "playground",
             "bench")


_COMPONENTS = (  # (file path fragment of the leaf frame, component), first match wins
    ("upstream/postgres/stream.py", "replication stream (psycopg2)"),
    ("upstream/postgres/source.py", "puller"),
    ("upstream/postgres/", "pgoutput decode and value parsers"),
    ("psycopg2/", "replication stream (psycopg2)"),
    ("sorter/", "sorter (LevelDB)"),
    ("plyvel", "sorter (LevelDB)"),
    ("processor/batcher.py", "batcher and span loop"),
    ("processor/span.py", "batcher and span loop"),
    ("processor/mounter.py", "mounter"),
    ("sinks/sql/dialect/values.py", "sink: value conversion"),
    ("sinks/", "sink: statements and driver calls (sqlite3 in C included)"),
    ("pymysql/", "driver: PyMySQL"),
    ("socket.py", "driver: socket I/O"),
    ("sqlalchemy/", "driver: SQLAlchemy"),
    ("grpc/", "etcd client (grpc)"),
    ("etcd3/", "etcd client (grpc)"),
    ("cdc/meta/", "etcd client (grpc)"),
    ("owner/", "owner"),
    ("capture/", "capture: HTTP API, processor loop"),
    ("processor/", "capture: HTTP API, processor loop"),
    ("threading.py", "thread waits"),
    ("<string>", "generated code (dataclass __init__, lambdas)"),
)


def component_of(frame: dict[str, object]) -> str:
    file = "/" + str(frame.get("file", "") or "")
    for fragment, name in _COMPONENTS:  # matched at a directory boundary: /tmp/wt-sorter/x.py is no sorter
        if (fragment if fragment.startswith("<") else "/" + fragment) in file:
            return name
    return "other"


def _label(frame: dict[str, object]) -> str:
    name = str(frame.get("name", "?"))
    file = str(frame.get("file", "") or "")
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    else:
        for pkg in _PACKAGES:
            if f"/{pkg}/" in file:
                file = pkg + "/" + file.split(f"/{pkg}/", 1)[1]
                break
    return f"{name} ({file})" if file else name


def summarise(path: Path, top: int = 30) -> ProfileSummary:
    """Self and inclusive time per function (aggregated over lines and threads) of a speedscope file
    written by ``py-spy record --threads`` (sampled profiles; each sample lists frame indexes from the
    root to the leaf; the root frame names the thread, ``thread (<tid>): <name>``)."""
    doc = json.loads(Path(path).read_text())
    frames = [_label(f) for f in doc["shared"]["frames"]]
    comps = [component_of(f) for f in doc["shared"]["frames"]]
    comp_c: Counter[str] = Counter()
    is_thread = [str(f.get("name", "")).startswith("thread (") for f in doc["shared"]["frames"]]
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0.0
    for prof in doc.get("profiles", []):
        weights = prof.get("weights") or [1] * len(prof.get("samples", []))
        for stack, w in zip(prof.get("samples", []), weights, strict=False):
            code = [i for i in stack if not is_thread[i]]
            thread = next((frames[i] for i in stack if is_thread[i]), str(prof.get("name", "?")))
            if not code:
                continue
            total += w
            threads[thread] += w
            self_c[frames[code[-1]]] += w
            comp_c[comps[code[-1]]] += w
            for label in {frames[i] for i in code}:
                incl_c[label] += w
    return ProfileSummary(total, self_c.most_common(top), incl_c.most_common(top), threads.most_common(10),
                          comp_c.most_common())


def format_summary(s: ProfileSummary, title: str) -> str:
    def pct(n: float) -> str:
        return f"{100 * n / s.busy_s:5.1f}%" if s.busy_s else "  -  "

    lines = [f"# {title}: {s.busy_s:.1f} busy seconds sampled", "", "## self time (top of stack)"]
    lines += [f"{pct(n)}  {f}" for f, n in s.self_time]
    lines += ["", "## inclusive time"]
    lines += [f"{pct(n)}  {f}" for f, n in s.inclusive]
    lines += ["", "## components (self time of the leaf frame's module)"]
    lines += [f"{pct(n)}  {c}" for c, n in s.components]
    lines += ["", "## threads"]
    lines += [f"{pct(n)}  {t}" for t, n in s.threads]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.profile FILE.speedscope.json...``: print the summary of each file."""
    for arg in argv if argv is not None else sys.argv[1:]:
        with contextlib.suppress(BrokenPipeError):
            print(format_summary(summarise(Path(arg)), arg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
