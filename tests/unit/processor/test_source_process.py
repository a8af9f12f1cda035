"""processor.source_process without servers: a span source's ``run`` in a real child process, fed by sources that
make their buffer calls from a script, fail, or never end. (The PostgreSQL source runs through it in
tests/unit/upstream/test_pg_source.py; with real servers in tests/e2e/test_puller_process.py.)"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cdc.errors import DdlRejected, SlotLost, TidewaterError, UpstreamUnavailable
from cdc.ts import Watermark
from processor.source_process import BATCH_BYTES, BATCH_ROWS, PIPE_BYTES, ChildSpanSource, Spawner
from sorter.memory import MemorySorter
from tests.settle import SETTLE_S
from upstream.base import ChangeBuffer, ChangeDecoder, SpanSource

pytestmark = pytest.mark.unit


class ScriptSource(SpanSource):
    """Runs ``script``: ("add", xid, payload) / ("many", xid, [payloads]) / ("abort", xid) / ("commit", xid, ts) /
    ("raise", class, args) / ("log", text) / ("state", value), reporting a watermark after each commit; then waits
    for ``stop`` unless ``end``. Its state is a list of values (``put_state`` appends them)."""

    runs_in_child = True

    def __init__(self, script: list[tuple[Any, ...]], end: bool = True) -> None:
        self.script = script
        self.end = end
        self.state: list[Any] = []
        self._pending: list[Any] = []
        self.acked: list[int] = []

    def open(self) -> None: ...

    def close(self) -> None: ...

    def ack(self, ts: int) -> None:
        self.acked.append(ts)

    def decoder(self) -> ChangeDecoder:
        raise NotImplementedError

    def take_state(self) -> object:
        out, self._pending = self._pending, []
        return out or None

    def put_state(self, state: object) -> None:
        assert isinstance(state, list)
        self.state.extend(state)

    def run(self, buffer: ChangeBuffer, stop: threading.Event, on_resolved: Callable[[Watermark], None]) -> None:
        import logging

        for step in self.script:
            kind = step[0]
            if kind == "add":
                buffer.add(step[1], step[1], step[2])
            elif kind == "many":
                buffer.add_many(step[1], step[1], step[2])
            elif kind == "abort":
                buffer.abort(step[1], step[1])
            elif kind == "commit":
                buffer.commit(step[1], step[2], float(step[2]))
                on_resolved(Watermark(step[2], float(step[2])))
            elif kind == "state":
                self._pending.append(step[1])
            elif kind == "log":
                logging.getLogger("upstream.scripted").warning("%s", step[1])
            else:  # ("raise", class, args): made here (an exception object of some classes does not unpickle)
                raise step[1](*step[2])
        if not self.end:
            stop.wait()


class EndlessSource(ScriptSource):
    """Adds 1 KiB rows as fast as the buffer takes them, writing how many to ``progress`` (a file) as it goes."""

    def __init__(self, progress: str) -> None:
        super().__init__([])
        self.progress = progress

    def run(self, buffer: ChangeBuffer, stop: threading.Event, on_resolved: Callable[[Watermark], None]) -> None:
        fill = b"x" * 1016
        n = 0
        while not stop.is_set():  # (distinct rows: pickle would send one shared object once)
            buffer.add_many(1, 1, [b"%08d" % (n + i) + fill for i in range(64)])
            n += 64
            with open(self.progress + ".new", "w") as f:
                f.write(str(n))
            os.replace(self.progress + ".new", self.progress)


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_child(source: SpanSource, stop: threading.Event | None = None) -> tuple[ChildSpanSource, Any, list[Watermark]]:
    sorter = MemorySorter().span("cf/0")
    marks: list[Watermark] = []
    child = ChildSpanSource(source, "cf/0", stop_timeout=5.0)
    child.open()
    try:
        child.run(sorter, stop or threading.Event(), marks.append)
    finally:
        child.close()
    return child, sorter, marks


def test_buffer_calls_state_and_watermarks_arrive_in_order() -> None:
    script: list[tuple[Any, ...]] = [("state", "v1"), ("add", 5, b"a"), ("many", 5, [b"b", b"c"]), ("commit", 5, 10),
                                     ("add", 6, b"gone"), ("abort", 6), ("state", "v2"), ("log", "hello"),
                                     ("many", 7, [b"r%d" % i for i in range(3 * BATCH_ROWS)]), ("commit", 7, 20)]
    source = ScriptSource(script)
    child, sorter, marks = run_child(source)
    txns = list(sorter.read_txns(0, 100))
    assert [(t.commit_ts, len(t.payloads)) for t in txns] == [(10, 3), (20, 3 * BATCH_ROWS)]
    assert txns[0].payloads == [b"a", b"b", b"c"] and txns[1].payloads[-1] == b"r%d" % (3 * BATCH_ROWS - 1)
    assert source.state == ["v1", "v2"]  # the parent's instance got the child's state
    assert marks[-1] == Watermark(20, 20.0) and marks == sorted(marks, key=lambda w: w.ts)
    assert child.proc is not None and child.proc.returncode == 0


def test_the_childs_log_records_are_logged_by_the_parent(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        run_child(ScriptSource([("log", "from the child")]))
    assert [(r.name, r.levelname) for r in caplog.records if r.getMessage() == "from the child"] == [
        ("upstream.scripted", "WARNING")]


@pytest.mark.parametrize("cls, args", [(SlotLost, ("slot gone",)), (UpstreamUnavailable, ("stream broke",)),
                                       (DdlRejected, ("ALTER x", "public.t", "no such type"))])
def test_an_error_of_the_child_is_the_same_error_in_the_parent(cls: type[TidewaterError], args: tuple[Any, ...]) -> None:
    exc = cls(*args)
    with pytest.raises(cls) as raised:
        run_child(ScriptSource([("add", 1, b"a"), ("raise", cls, args)]))
    assert type(raised.value) is cls
    assert raised.value.message == exc.message and raised.value.retryable == exc.retryable
    assert vars(raised.value) == vars(exc)  # (DdlRejected's table and the like too)


def test_an_error_that_is_not_ours_keeps_its_type_and_message() -> None:
    with pytest.raises(ZeroDivisionError, match="boom"):
        run_child(ScriptSource([("raise", ZeroDivisionError, ("boom",))]))


def test_a_killed_child_is_a_retryable_upstream_error() -> None:
    source = ScriptSource([("add", 1, b"a")], end=False)
    child = ChildSpanSource(source, "cf/0")
    child.open()
    assert child.pid is not None
    killer = threading.Timer(0.5, os.kill, (child.pid, signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(UpstreamUnavailable, match="killed by signal 9") as raised:
            child.run(MemorySorter().span("cf/0"), threading.Event(), lambda w: None)
        assert raised.value.retryable
    finally:
        child.close()
    assert child.proc is not None and child.proc.returncode == -signal.SIGKILL  # reaped


def test_stop_ends_the_child_and_acks_reach_it() -> None:
    source = ScriptSource([("add", 1, b"a"), ("commit", 1, 10)], end=False)
    child = ChildSpanSource(source, "cf/0")
    stop = threading.Event()
    marks: list[Watermark] = []
    child.open()
    runner = threading.Thread(target=child.run, args=(MemorySorter().span("cf/0"), stop, marks.append))
    runner.start()
    deadline = time.monotonic() + SETTLE_S
    while not marks and time.monotonic() < deadline:
        time.sleep(0.01)
    child.ack(10)  # (nothing to see in the parent: the child's instance acks; it must not break anything)
    stop.set()
    runner.join(10)
    assert not runner.is_alive()
    assert child.proc is not None and child.proc.returncode == 0  # told to stop, it returned and was reaped
    child.close()


def test_a_full_pipe_blocks_the_child(tmp_path: Path) -> None:
    """Backpressure: while the parent reads nothing, the child adds at most a few batches and the pipe's content."""
    progress = tmp_path / "progress"
    child = ChildSpanSource(EndlessSource(str(progress)), "cf/0")
    child.open()
    try:
        # the child's start (a process, its imports) takes seconds on a loaded host: wait for its first rows, then
        # until it stands still for a whole second (blocked on the full pipe), instead of reading it at a fixed time
        bound = 3 * max(BATCH_ROWS, BATCH_BYTES // 1024) + PIPE_BYTES // 1024 + 64
        deadline = time.monotonic() + 60
        held, still_since = 0, time.monotonic()
        while time.monotonic() < deadline:
            now = int(progress.read_text()) if progress.exists() else 0
            assert now <= bound, f"the child went on to {now} rows with nobody reading (bound {bound})"
            if now != held or now == 0:
                held, still_since = now, time.monotonic()
            elif time.monotonic() - still_since >= 1.0:
                break
            time.sleep(0.05)
        assert 0 < held <= bound, f"the child never stood still within 60 s: {held} rows (bound {bound})"
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()
        child.run(MemorySorter().span("cf/0"), stop, lambda w: None)  # drains, then stops it
    finally:
        child.close()
    assert child.proc is not None and child.proc.returncode is not None


def test_a_source_that_cannot_run_in_a_child_is_refused() -> None:
    class Plain(ScriptSource):
        runs_in_child = False

    with pytest.raises(ValueError, match="cannot run in a process of its own"):
        ChildSpanSource(Plain([]), "cf/0")


def test_a_span_takes_the_spare_process_and_a_dead_spare_is_replaced() -> None:
    spawner = Spawner()
    first = spawner.take(__name__)
    deadline = time.monotonic() + SETTLE_S
    while spawner.spare is None and time.monotonic() < deadline:
        time.sleep(0.01)
    spare = spawner.spare
    assert spare is not None and spare.proc.poll() is None and spare.proc.pid != first.proc.pid
    assert spawner.take(__name__) is spare  # (started before it was asked for)
    while spawner.spare is None and time.monotonic() < deadline:
        time.sleep(0.01)
    dead = spawner.spare
    assert dead is not None
    dead.proc.kill()
    dead.proc.wait()
    fresh = spawner.take(__name__)
    assert fresh is not dead and fresh.proc.poll() is None
    for started in (first, spare, fresh, spawner.spare):
        if started is not None:
            started.discard()
            assert started.proc.returncode is not None  # reaped


def test_the_child_dies_with_its_parent_even_when_it_never_writes(tmp_path: Path) -> None:
    """A capture killed with SIGKILL: its source process (here one whose source sends nothing, so no failed write
    could end it) exits at the EOF of its control pipe / by PR_SET_PDEATHSIG."""
    import subprocess
    import sys

    script = (
        "import sys, threading, time\n"
        "from processor.source_process import ChildSpanSource\n"
        "from tests.unit.processor.test_source_process import ScriptSource\n"
        "child = ChildSpanSource(ScriptSource([], end=False), 'cf/0')\n"
        "child.open()\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n")
    root = Path(__file__).resolve().parents[3]
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert running(pid)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + SETTLE_S
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(pid), f"source process {pid} outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_drop_spare_ends_the_spare_child() -> None:
    """``puller-process`` turned off by a SIGHUP (capture.server.Server.apply_config): the child started for the next
    span is ended, not left waiting for a span that runs its source in a thread."""
    spawner = Spawner()
    first = spawner.take(__name__)
    deadline = time.monotonic() + SETTLE_S
    while spawner.spare is None and time.monotonic() < deadline:
        time.sleep(0.01)
    spare = spawner.spare
    assert spare is not None and spare.proc.poll() is None
    spawner.drop_spare()
    assert spawner.spare is None and spare.proc.returncode is not None  # ended and reaped
    spawner.drop_spare()  # none left: nothing to do
    first.discard()
