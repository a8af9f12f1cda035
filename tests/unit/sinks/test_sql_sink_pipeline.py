"""The SQL sink's pipelined execution: statements run in a worker thread while the sink builds the next one,
strictly in submit order, never two at a time and never while the sink's own thread uses the connection;
the first failure is raised (naming its table) once the worker is idle, later statements are dropped."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.sql.ops.writer import Writer
from sinks.sql.sink import SQLSink
from sinks.sql.target.pipeline import Pipeline
from tests.sql_sink_fakes import URIS, assume_tables, fake_connection

pytestmark = pytest.mark.unit


def table(name: str) -> TableSchema:
    cols = (ColumnSchema("id", 0, "int4", nullable=False, is_key=True), ColumnSchema("name", 0, "text", nullable=True))
    return TableSchema(TableName("public", name), cols, ("id",), has_key=True, replica_identity="d")


A, B, C = table("a"), table("b"), table("c")


def ins(s: TableSchema, i: int) -> RowChange:
    return RowChange(OpType.INSERT, s, 1, values={"id": i, "name": f"n{i}"})


class DriverError(Exception):
    pass


class SlowCursor:
    """Records every call with the thread that made it; fails when used by two threads at once."""

    def __init__(self, delay: float = 0.0, fail_on: int | None = None) -> None:
        import pymysql.converters

        self.delay = delay
        self.fail_on = fail_on  # index of the execute call that raises
        self.calls: list[tuple[str, str, int]] = []  # (kind, sql, thread ident)
        self.active = 0
        self.overlaps = 0
        self.lock = threading.Lock()
        self.rowcount = 1
        self.gate: threading.Event | None = None  # the first execute waits for it (up to 5 s)
        self.gate_opened_in_time: bool | None = None
        self.connection = SimpleNamespace(
            server_status=0, escape=lambda v: pymysql.converters.escape_item(v, "utf8mb4"))

    def _enter(self) -> None:
        with self.lock:
            self.active += 1
            if self.active > 1:
                self.overlaps += 1

    def _leave(self) -> None:
        with self.lock:
            self.active -= 1

    def execute(self, sql: str, params: Any = None) -> None:
        self._enter()
        try:
            n = len(self.calls)
            self.calls.append(("execute", sql, threading.get_ident()))
            if n == 0 and self.gate is not None:
                self.gate_opened_in_time = self.gate.wait(5)
            if self.delay:
                time.sleep(self.delay)
            if self.fail_on == n:
                raise DriverError(f"statement {n} failed")
        finally:
            self._leave()

    def executemany(self, sql: str, params: Any) -> None:
        self.execute(sql, params)

    def fetchall(self) -> list[Any]:
        self._enter()
        try:
            self.calls.append(("fetchall", "", threading.get_ident()))
            return [(1,)]  # the row of a partial update exists downstream
        finally:
            self._leave()

    def fetchone(self) -> Any:
        return (1,)

    def close(self) -> None:
        self.calls.append(("close", "", threading.get_ident()))


def make_sink(dialect: str, **config: Any) -> SQLSink:
    sink = SQLSink(URIS[dialect], SinkConfig(**config))
    assume_tables(sink, dialect, A, B, C)
    return sink


def run(sink: SQLSink, cur: SlowCursor, changes: Any) -> Writer:
    conn = fake_connection(cur)
    writer = sink.writer(conn)
    writer.run(changes)
    return writer


def statements(cur: SlowCursor) -> list[str]:
    return [sql for kind, sql, _ in cur.calls if kind == "execute"]


def mixed(n: int) -> list[RowChange]:
    return [ins((A, B, C)[i % 3], i) for i in range(n)]


@pytest.mark.parametrize("dialect", ["mysql", "postgresql"])
def test_statements_run_in_a_worker_in_submit_order_one_at_a_time(dialect: str) -> None:
    changes = mixed(90)
    sink = make_sink(dialect, batch_rows=5, txn_rows=15)
    sink.target.pipeline = Pipeline(threaded=False)
    inline = SlowCursor()
    try:
        run(sink, inline, changes)
    finally:
        sink.close()
    sink = make_sink(dialect, batch_rows=5, txn_rows=15)
    cur = SlowCursor(delay=0.002)
    try:
        run(sink, cur, changes)
        assert sink.target.pipeline.worker is not None and sink.target.pipeline.worker.is_alive()
    finally:
        sink.close()
    assert sink.target.pipeline.worker is not None and not sink.target.pipeline.worker.is_alive()  # close stops the worker
    assert statements(cur) == statements(inline) and len(statements(cur)) == 18
    assert cur.overlaps == 0
    caller = threading.get_ident()
    assert {t for kind, _, t in cur.calls if kind == "execute"} == {sink.target.pipeline.worker.ident} != {caller}
    assert cur.calls[-1] == ("close", "", caller)  # closed by the caller after the last statement ran


def test_the_next_statement_is_built_while_the_previous_one_executes() -> None:
    cur = SlowCursor()
    cur.gate = threading.Event()
    sink = make_sink("postgresql", batch_rows=10, txn_rows=10)

    def changes() -> Iterator[RowChange]:
        for i in range(30):
            if i == 15:  # the first statement (rows 0-9) was submitted: it is still executing, blocked
                cur.gate.set()  # type: ignore[union-attr]
            yield ins(A, i)

    try:
        run(sink, cur, changes())
    finally:
        sink.close()
    assert cur.gate_opened_in_time is True  # sequential execution would have waited 5 s
    assert len(statements(cur)) == 3 and cur.overlaps == 0


@pytest.mark.parametrize("dialect", ["mysql", "postgresql"])
def test_a_failed_statement_is_raised_with_its_table_and_later_ones_never_run(dialect: str) -> None:
    cur = SlowCursor(delay=0.001, fail_on=1)  # the second statement: table b's first
    sink = make_sink(dialect, batch_rows=3, txn_rows=1000)
    conn = fake_connection(cur)
    writer = sink.writer(conn)
    changes = [ins(A, i) for i in range(3)] + [ins(B, i) for i in range(3)] + [ins(C, i) for i in range(30)]
    try:
        with pytest.raises(DriverError, match="statement 1 failed"):
            writer.run(changes)
        assert writer.current == "b"
        assert sink.target.pipeline.queued() == 0
        # the statements after the failed one were dropped (at most the pipeline depth were queued)
        assert len(statements(cur)) == 2 and cur.overlaps == 0
        assert cur.calls[-1][0] == "close"
        # the next write starts clean
        cur2 = SlowCursor()
        run(sink, cur2, [ins(A, 1)])
        assert len(statements(cur2)) == 1
    finally:
        sink.close()


def test_an_earlier_statement_failure_wins_over_a_later_caller_error() -> None:
    cur = SlowCursor(fail_on=0)
    sink = make_sink("postgresql", batch_rows=2, txn_rows=1000)

    def changes() -> Iterator[RowChange]:
        yield ins(A, 1)
        yield ins(A, 2)  # the group is submitted at 2 rows and fails in the worker
        time.sleep(0.05)
        raise ValueError("the caller's own failure")

    conn = fake_connection(cur)
    writer = sink.writer(conn)
    try:
        with pytest.raises(DriverError) as info:
            writer.run(changes())
        assert isinstance(info.value.__context__, ValueError)
        assert writer.current == "a"
    finally:
        sink.close()


def test_a_caller_error_waits_until_the_running_statement_finished() -> None:
    cur = SlowCursor(delay=0.2)
    sink = make_sink("postgresql", batch_rows=2, txn_rows=1000)

    def changes() -> Iterator[RowChange]:
        yield ins(A, 1)
        yield ins(A, 2)
        raise ValueError("boom")

    try:
        with pytest.raises(ValueError, match="boom"):
            run(sink, cur, changes())
        assert cur.active == 0 and len(statements(cur)) == 1  # idle when the caller would roll back
        assert cur.calls[-1][0] == "close"
    finally:
        sink.close()


def test_reads_drain_the_pipeline_first() -> None:
    """A partial update (UNCHANGED columns) counts the existing rows: that read runs in the caller's thread
    after every statement before it finished, and before the statement that follows it."""
    cur = SlowCursor(delay=0.01)
    sink = make_sink("postgresql", batch_rows=2, txn_rows=1000)
    changes = [ins(A, 1), ins(A, 2), ins(B, 1), ins(B, 2),
               RowChange(OpType.UPDATE, A, 1, values={"id": 1, "name": UNCHANGED})]
    try:
        run(sink, cur, changes)
    finally:
        sink.close()
    kinds = [kind for kind, _, _ in cur.calls]
    assert kinds == ["execute", "execute", "execute", "fetchall", "execute", "close"]
    caller = threading.get_ident()
    worker = cur.calls[0][2]
    assert worker != caller and cur.calls[1][2] == worker
    assert cur.calls[2][1].startswith("SELECT") and cur.calls[2][2] == cur.calls[3][2] == caller  # the read
    assert cur.calls[4][1].startswith("INSERT") and cur.calls[4][2] == worker  # then the upsert, pipelined
    assert cur.overlaps == 0


def test_the_pipeline_bounds_what_is_queued() -> None:
    pipe = Pipeline(depth=2)
    release = threading.Event()
    done: list[int] = []
    try:
        pipe.submit("t", release.wait, 5)
        pipe.submit("t", done.append, 1)
        blocked = threading.Thread(target=pipe.submit, args=("t", done.append, 2))
        blocked.start()
        blocked.join(0.2)
        assert blocked.is_alive() and done == []  # the third waits for room
        release.set()
        blocked.join(5)
        assert pipe.quiesce() is None and done == [1, 2]
    finally:
        release.set()
        pipe.close()


def test_the_error_is_kept_until_taken_and_submit_refuses_meanwhile() -> None:
    pipe = Pipeline()
    done: list[int] = []
    try:
        def fail() -> None:
            raise DriverError("x")

        assert pipe.submit("t1", fail)
        time.sleep(0.05)
        assert pipe.submit("t2", done.append, 1) is False
        error = pipe.quiesce()
        assert error is not None and isinstance(error[0], DriverError) and error[1] == "t1"
        assert pipe.quiesce() is None
        assert pipe.submit("t3", done.append, 3)
        pipe.drain()
        assert done == [3]
    finally:
        pipe.close()
