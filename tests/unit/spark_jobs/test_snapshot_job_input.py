"""spark_jobs: the job's plan file, its error lines, and one chunk's write (fakes, no servers, no Spark)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc.config import DEFAULT_CHUNK_ROWS
from cdc.errors import (
    InvalidArgument,
    InvalidConfig,
    InvalidURI,
    SinkUnavailable,
    SnapshotExpired,
    TidewaterError,
    UpstreamUnavailable,
)
from cdc.errors import error_for_code as _error
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from cdc.snapshot import PG_COPY_TEXT, CopyText, SnapshotChunk, TablePlan, plan_from_bounds
from sinks.testing import MemorySink, MemoryTextCopySink
from spark_jobs.copy import ChunkTask, copy_one, one_line
from spark_jobs.plan import SnapshotJob, read_job, write_job
from spark_jobs.snapshot import exit_code, message
from upstream.base import SnapshotReader

pytestmark = pytest.mark.unit

JOB = SnapshotJob(changefeed="cf-1", upstream="postgresql://u:pw@h:5432/db", sink="sqlite:///t.db",
                  tables=("public.a", "s.b"), etcd=("http://127.0.0.1:2379",))


def test_the_plan_file_round_trips_and_is_private(tmp_path: Path) -> None:
    path = write_job(JOB, tmp_path / "job.json")
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_job(path) == JOB
    assert JOB.chunk_rows == DEFAULT_CHUNK_ROWS and JOB.spark_master == "local[*]" and JOB.snapshot is None
    assert JOB.table_names == [TableName("public", "a"), TableName("s", "b")]


@pytest.mark.parametrize(("change", "error", "match"), [
    ({"chunk_rows": 0}, InvalidConfig, "chunk-rows must be at least 1"),
    ({"tables": ()}, InvalidConfig, "no tables"),
    ({"etcd": ()}, InvalidConfig, "no etcd endpoints"),
    ({"changefeed": "bad/id"}, InvalidConfig, "invalid changefeed id"),
    ({"sink": "nope://u:pw@h/x"}, InvalidURI, "not supported"),
])
def test_a_bad_plan_is_refused_naming_the_field(change: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match) as ei:
        SnapshotJob(**{**JOB.__dict__, **change})
    assert "pw" not in str(ei.value)


def test_a_plan_file_that_is_not_a_plan(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cannot read the snapshot job plan"):
        read_job(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("[1]")
    with pytest.raises(InvalidConfig, match="must be a JSON object"):
        read_job(tmp_path / "x.json")
    (tmp_path / "y.json").write_text('{"changefeed": "cf"}')
    with pytest.raises(InvalidConfig, match="lacks upstream, sink, tables, etcd"):
        read_job(tmp_path / "y.json")


def test_error_lines_codes_and_fixes() -> None:
    err = _error("CDC:ErrSnapshotExpired", "gone")
    assert type(err) is SnapshotExpired and err.message == "gone"
    assert type(_error("CDC:ErrNoSuchCode", "x")) is TidewaterError
    assert exit_code(SnapshotExpired("x")) == 1 and exit_code(InvalidURI("x")) == 1
    assert exit_code(UpstreamUnavailable("x")) == 2 and exit_code(TidewaterError("x")) == 3
    line = message(SinkUnavailable("MySQL at h:1 is unavailable:\n refused mysql://root:pw@h:1/x."))
    assert line.startswith("[CDC:ErrSinkUnavailable] MySQL at h:1 is unavailable: refused mysql://root:***@h:1/x.")
    assert "\n" not in line and ". Fix: start the target or correct the sink URI" in line
    assert message(SnapshotExpired("gone. Fix: do this")).count("Fix:") == 1
    assert one_line("a\n b  postgresql://u:secret@h/db") == "a b postgresql://u:***@h/db"


# ---- one chunk's write, with in-memory twins -------------------------------------------------------------
SCHEMA = TableSchema(TableName("public", "a"), (ColumnSchema("id", 23, "int4", is_key=True),
                                                ColumnSchema("v", 25, "text")), ("id",))


class ListReader(SnapshotReader):
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def table_schema(self, table: TableName) -> TableSchema:
        return SCHEMA

    def plan(self, schema: TableSchema, chunk_rows: int) -> TablePlan:
        return plan_from_bounds(schema.name, len(self.rows), chunk_rows, tuple(schema.key))

    def read_chunk(self, schema: TableSchema, chunk: SnapshotChunk, *, commit_ts: int = 0,
                   commit_time: float = 0.0) -> Iterator[RowChange]:
        for r in self.rows:
            yield RowChange(OpType.INSERT, schema, commit_ts, commit_time, row=r, row_text=[str(x) for x in r])

    def close(self) -> None:
        pass


class RecordingSink(MemorySink):
    """The write twin (``sinks.testing``) recording each write's changes and whether it was fenced."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[list[RowChange], bool]] = []  # type: ignore[assignment]

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        batch = list(changes)
        if fence is not None:
            fence()
        self.calls.append((batch, fence is not None))
        return len(batch)


def test_a_chunk_is_one_write_and_a_keyless_chunk_replaces_the_table() -> None:
    job = SnapshotJob(**{**JOB.__dict__, "commit_ts": 42})
    sink = RecordingSink()
    keyed = plan_from_bounds(SCHEMA.name, 2, 10, ("id",)).chunks[0]
    assert copy_one(ListReader([(1, "a"), (2, "b")]), sink, ChunkTask(job, SCHEMA, keyed)) == 2
    [(batch, fenced)] = sink.calls
    assert [c.op for c in batch] == [OpType.INSERT, OpType.INSERT] and {c.commit_ts for c in batch} == {42}
    assert not fenced

    whole = plan_from_bounds(SCHEMA.name, 2, 10, None).chunks[0]
    calls: list[int] = []
    assert copy_one(ListReader([(1, "a"), (1, "a")]), sink, ChunkTask(job, SCHEMA, whole),
                    fence=lambda: calls.append(1)) == 2  # rows, not the TRUNCATE
    batch, fenced = sink.calls[1]
    assert [c.op for c in batch] == [OpType.TRUNCATE, OpType.INSERT, OpType.INSERT] and fenced and calls == [1]


def test_partitions_a_few_per_core_one_for_sqlite() -> None:
    from spark_jobs.snapshot import partitions

    assert partitions(100, 2, "postgresql://h/db") == 6
    assert partitions(4, 2, "mysql://h/db") == 4  # never more than one per chunk
    assert partitions(100, 2, "sqlite:///t.db") == 1 and partitions(100, 2, "SQLITE:///t.db") == 1
    assert partitions(1, 0, "postgresql://h/db") == 1


class TextReader(ListReader):
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        super().__init__(rows)
        self.text_reads = 0
        self.released = 0

    def read_chunk_text(self, schema: TableSchema, chunk: SnapshotChunk) -> CopyText | None:
        self.text_reads += 1
        data = "".join("\t".join(map(str, r)) + "\n" for r in self.rows).encode()
        return CopyText(PG_COPY_TEXT, "UTF8", iter([data]))

    def release(self) -> None:
        self.released += 1


def test_a_chunk_goes_as_text_where_the_sink_takes_it_else_parsed() -> None:
    keyed = plan_from_bounds(SCHEMA.name, 2, 10, ("id",)).chunks[0]
    whole = plan_from_bounds(SCHEMA.name, 2, 10, None).chunks[0]
    reader, sink = TextReader([(1, "a"), (2, "b")]), MemoryTextCopySink(accept=True)
    assert copy_one(reader, sink, ChunkTask(JOB, SCHEMA, keyed), fence=lambda: None) == 2
    assert copy_one(reader, sink, ChunkTask(JOB, SCHEMA, whole)) == 2
    assert sink.texts == [(b"1\ta\n2\tb\n", False, True), (b"1\ta\n2\tb\n", True, False)]  # whole: replace
    assert sink.calls == [] and reader.released == 2  # the table's lock is released after each chunk

    reader, sink = TextReader([(1, "a"), (2, "b")]), MemoryTextCopySink(accept=False)
    assert copy_one(reader, sink, ChunkTask(JOB, SCHEMA, keyed)) == 2
    assert reader.text_reads == 0 and len(sink.calls) == 1  # refused: parsed, and the text was never read


def test_chunks_are_copied_here_while_spark_starts_and_the_rest_is_left_for_spark() -> None:
    import threading

    from spark_jobs.copy import ChunkResult
    from spark_jobs.snapshot import CopyWhileStarting

    chunks = plan_from_bounds(SCHEMA.name, 50, 10, ("id",), [(str(i),) for i in (10, 20, 30, 40)]).chunks
    tasks = [ChunkTask(JOB, SCHEMA, c) for c in chunks]
    gate, second = threading.Semaphore(0), threading.Event()

    def copy(it: Iterator[ChunkTask]) -> Iterator[ChunkResult]:
        for t in it:
            if t.chunk.index == 1:
                second.set()
            assert gate.acquire(timeout=5)
            yield ChunkResult(t.chunk.table, t.chunk.index, 10)

    local = CopyWhileStarting(tasks, "cf", copy=copy)
    local.start()
    gate.release()  # chunk 0 is copied
    assert second.wait(5)  # chunk 1 is in progress when Spark is up ...
    threading.Timer(0.2, gate.release).start()  # ... and ends only after finish() was called
    done, left = local.finish()
    assert [r.chunk for r in done] == [0, 1], "the chunk in progress is finished, no new one is started"
    assert [t.chunk.index for t in left] == [2, 3, 4]

    def failing(it: Iterator[ChunkTask]) -> Iterator[ChunkResult]:
        for t in it:
            yield ChunkResult(t.chunk.table, t.chunk.index, error_code="CDC:ErrSinkFatal", error="refused")
            return

    local = CopyWhileStarting(tasks, "cf", copy=failing)
    local.start()
    done, left = local.finish()
    assert len(done) <= 1 and len(done) + len(left) == 5


def test_a_stop_request_lets_the_chunk_in_progress_end_and_takes_no_further_chunk() -> None:
    """SIGTERM sets the job's stop event: the driver's copy threads take no new chunk at once (the fence-out in
    etcd, a thread start and a write, came too late under load for a small table's last chunks)."""
    import threading

    from spark_jobs.copy import ChunkResult
    from spark_jobs.snapshot import CopyWhileStarting

    chunks = plan_from_bounds(SCHEMA.name, 50, 10, ("id",), [(str(i),) for i in (10, 20, 30, 40)]).chunks
    tasks = [ChunkTask(JOB, SCHEMA, c) for c in chunks]
    halt, started, gate = threading.Event(), threading.Event(), threading.Semaphore(0)

    def copy(it: Iterator[ChunkTask]) -> Iterator[ChunkResult]:
        for t in it:
            started.set()
            assert gate.acquire(timeout=5)
            yield ChunkResult(t.chunk.table, t.chunk.index, 10)

    idle = threading.Event()
    local = CopyWhileStarting(tasks, "cf", copy=copy, on_idle=idle.set, halt=halt)
    local.start()
    assert started.wait(5)  # chunk 0 is in progress
    halt.set()
    gate.release()
    assert idle.wait(5), "the thread stopped by itself"
    done, left = local.finish()
    assert [r.chunk for r in done] == [0] and [t.chunk.index for t in left] == [1, 2, 3, 4]


def test_a_chunk_into_a_buffering_sink_is_flushed_into_a_file_before_copy_one_returns(tmp_path: Path) -> None:
    from sinks.factory import open_sink
    from sinks.storage.reader import rebuild

    uri = f"file://{tmp_path}/lake?protocol=csv&date-separator=none&flush-interval=10m"
    job = SnapshotJob(**{**JOB.__dict__, "commit_ts": 42, "sink": uri})
    sink = open_sink(job.sink)
    sink.set_bulk_load()
    keyed = plan_from_bounds(SCHEMA.name, 2, 10, ("id",)).chunks[0]
    assert copy_one(ListReader([(1, "a"), (2, "b")]), sink, ChunkTask(job, SCHEMA, keyed)) == 2
    published = sorted(p.name for p in (tmp_path / "lake").rglob("CDC*.csv"))
    assert published == [f"CDC{1:020d}.csv"]  # visible without any further call: the copy records it next
    sink.publish_checkpoint(42)
    sink.close()
    _, states = rebuild(uri)
    assert sorted(r["id"] for r in states[SCHEMA.name].rows()) == [1, 2]


def test_a_copy_without_spark_runs_on_as_many_threads_as_a_local_master_has_cores() -> None:
    import dataclasses
    import threading

    from spark_jobs.copy import ChunkResult
    from spark_jobs.snapshot import CopyWhileStarting, local_threads

    def job(master: str, sink: str = "postgresql://u@h/t") -> SnapshotJob:
        return dataclasses.replace(JOB, spark_master=master, sink=sink)

    assert local_threads(job("local[3]")) == 3
    assert local_threads(job("local[*]")) >= 1
    assert local_threads(job("local")) == 1
    assert local_threads(job("spark://h:7077")) == 1
    assert local_threads(job("local[4]", "sqlite:///t.db")) == 1  # one writer

    chunks = plan_from_bounds(SCHEMA.name, 50, 10, ("id",), [(str(i),) for i in (10, 20, 30, 40)]).chunks
    tasks = [ChunkTask(JOB, SCHEMA, c) for c in chunks]
    both = threading.Barrier(2, timeout=5)
    names: set[str] = set()

    def copy(it: Iterator[ChunkTask]) -> Iterator[ChunkResult]:
        for n, t in enumerate(it):
            if n == 0:
                both.wait()  # two chunks in progress at once
            names.add(threading.current_thread().name)
            yield ChunkResult(t.chunk.table, t.chunk.index, 10)

    idle = threading.Event()
    local = CopyWhileStarting(tasks, "cf", copy=copy, on_idle=idle.set, threads=2)
    local.start()
    assert idle.wait(5)
    done, left = local.finish()
    assert sorted(r.chunk for r in done) == [0, 1, 2, 3, 4] and left == []
    assert len(names) == 2

    def failing(it: Iterator[ChunkTask]) -> Iterator[ChunkResult]:
        for t in it:
            yield ChunkResult(t.chunk.table, t.chunk.index, error_code="CDC:ErrSinkFatal", error="refused")
            return

    idle.clear()
    local = CopyWhileStarting(tasks, "cf", copy=failing, on_idle=idle.set, threads=2)
    local.start()
    assert idle.wait(5)  # a failure stops every thread
    done, left = local.finish()
    assert 1 <= len(done) <= 2 and len(done) + len(left) == 5


def test_once_spark_is_up_the_driver_keeps_its_share_and_hands_the_rest_over_each_chunk_once() -> None:
    import threading

    from spark_jobs.copy import ChunkResult
    from spark_jobs.snapshot import CopyWhileStarting, driver_share

    assert driver_share(8, 2, "mysql://u@h/t") == 2  # one worker next to Spark's two: a third, rounded down
    assert driver_share(2, 2, "mysql://u@h/t") == 0
    assert driver_share(8, 2, "sqlite:///t.db") == 0  # one writer: every chunk in one Spark partition

    chunks = plan_from_bounds(SCHEMA.name, 90, 10, ("id",), [(str(i),) for i in range(10, 90, 10)]).chunks
    tasks = [ChunkTask(JOB, SCHEMA, c) for c in chunks]  # 9 chunks
    gate, first = threading.Semaphore(0), threading.Event()

    def copy(it: Iterator[ChunkTask]) -> Iterator[ChunkResult]:
        for t in it:
            first.set()
            assert gate.acquire(timeout=5)
            yield ChunkResult(t.chunk.table, t.chunk.index, 10)

    local = CopyWhileStarting(tasks, "cf", copy=copy)
    local.start()
    assert first.wait(5)  # chunk 0 in progress when Spark is up
    assert local.pending() == 8 and not local.failed()
    handed = local.hand_off(keep=driver_share(local.pending(), 2, "mysql://u@h/t"))
    assert [t.chunk.index for t in handed] == [3, 4, 5, 6, 7, 8]  # the back of the list, in order
    for _ in range(3):
        gate.release()
    done, left = local.finish(drain=True)  # not stopped: the driver copies its share to its end
    assert [r.chunk for r in done] == [0, 1, 2] and left == []
    assert sorted([r.chunk for r in done] + [t.chunk.index for t in handed]) == list(range(9))
