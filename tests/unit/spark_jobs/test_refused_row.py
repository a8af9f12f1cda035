"""The row a target refuses: after a chunk failed with DataRejected, the chunk is written again in probes that are
all rolled back, and the error names the table, the row's key and the target's reason (spark_jobs.rejected); the
copy's task reports it instead of the chunk's own error. Fakes: the real targets are in
tests/integration/test_spark_snapshot_errors.py."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from cdc.errors import DataRejected, SinkUnavailable
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from cdc.snapshot import SnapshotChunk
from sinks.testing import MemoryAtomicSink, MemorySink
from spark_jobs import copy as copy_mod
from spark_jobs import rejected
from spark_jobs.copy import ChunkTask
from spark_jobs.plan import SnapshotJob
from spark_jobs.rejected import find_refused_row, key_text

pytestmark = pytest.mark.unit

KEYED = TableSchema(TableName("public", "orders"), (ColumnSchema("id", 23, "int4", is_key=True),
                                                    ColumnSchema("region", 25, "text", is_key=True),
                                                    ColumnSchema("qty", 23, "int4")), ("id", "region"))
KEYLESS = TableSchema(TableName("public", "bag"), (ColumnSchema("g", 23, "int4"), ColumnSchema("s", 25, "text")),
                      ("g", "s"), replica_identity="f", has_key=False)
JOB = SnapshotJob(changefeed="cf", upstream="postgresql://u@127.0.0.1/db", sink="postgresql://u:pw@127.0.0.1/t",
                  tables=("public.orders",), etcd=("http://127.0.0.1:2379",), commit_ts=77)


def _rows(schema: TableSchema, n: int, bad: set[int]) -> list[RowChange]:
    out = []
    for i in range(n):
        values = ({"id": i, "region": "eu", "qty": -1 if i in bad else i} if schema.has_key
                  else {"g": i, "s": "neg" if i in bad else "ok"})
        out.append(RowChange(OpType.INSERT, schema, 77, 0.0, values))
    return out


class Reader:
    def __init__(self, rows: list[RowChange]) -> None:
        self.rows = rows
        self.reads = 0
        self.released = 0

    def read_chunk(self, schema: TableSchema, chunk: SnapshotChunk, **_: Any) -> Iterator[RowChange]:
        self.reads += 1
        yield from self.rows

    def read_chunk_text(self, schema: TableSchema, chunk: SnapshotChunk) -> None:
        return None

    def release(self) -> None:
        self.released += 1

    def close(self) -> None:
        pass


class Target(MemoryAtomicSink):
    """A transactional target with a CHECK (qty >= 0 / s <> 'neg') on the atomic twin (``sinks.testing``): a write is
    refused at its first bad row, a write whose fence raises is rolled back; ``committed`` holds what was committed,
    ``attempts`` counts the writes."""

    def __init__(self, refuse: Callable[[RowChange], bool] | None = None) -> None:
        bad = refuse or (lambda r: (r.values or {}).get("qty") == -1 or (r.values or {}).get("s") == "neg")
        super().__init__(lambda r: 'new row violates check constraint "chk"' if r.op is OpType.INSERT and bad(r)
                         else None)

    @property
    def committed(self) -> list[RowChange]:
        return [r for r in self.rows if r.op is OpType.INSERT]


def _task(schema: TableSchema, whole: bool = False) -> ChunkTask:
    chunk = (SnapshotChunk(schema.name.schema, schema.name.table, 0, 1, whole=True) if whole
             else SnapshotChunk(schema.name.schema, schema.name.table, 2, 5, ("id", "region"), ("100", "eu"), ("200", "eu")))
    return ChunkTask(JOB, schema, chunk)


@pytest.mark.parametrize("bad", [0, 1, 999, 1000, 2345, 2499])
def test_the_refused_row_is_found_and_nothing_of_the_search_stays(bad: int) -> None:
    reader, sink = Reader(_rows(KEYED, 2500, {bad})), Target()
    got = find_refused_row(reader, sink, _task(KEYED), DataRejected("chunk refused"))
    assert got is not None and got.code == "CDC:ErrSinkDataRejected" and not got.retryable
    assert f"table public.orders: the target refused the row with key (id, region)=({bad}, 'eu')" in got.message
    assert 'new row violates check constraint "chk"' in got.message and "Fix:" in got.message
    assert sink.committed == []  # every probe was rolled back
    assert sink.attempts <= 2500 // rejected.PROBE_ROWS + 1 + 12  # batches up to the refused one, a bisection, alone
    assert reader.reads == 1 and reader.released == 1


def test_the_first_refused_row_is_named_when_several_are() -> None:
    got = find_refused_row(Reader(_rows(KEYED, 3000, {1500, 1200, 2900})), Target(), _task(KEYED), DataRejected("x"))
    assert got is not None and "(id, region)=(1200, 'eu')" in got.message


def test_a_keyless_tables_row_is_named_by_all_its_values_after_the_same_truncate() -> None:
    seen: list[list[OpType]] = []

    class Recording(Target):
        def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
            rows = list(changes)
            seen.append([r.op for r in rows[:1]])
            return super().write(rows, fence)

    got = find_refused_row(Reader(_rows(KEYLESS, 10, {7})), Recording(), _task(KEYLESS, whole=True),
                           DataRejected("x"))
    assert got is not None and "the row with key (g, s)=(7, 'neg')" in got.message
    assert all(ops == [OpType.TRUNCATE] for ops in seen)  # probed as copied: the table's rows replaced


def test_a_long_key_value_is_cut_with_its_length() -> None:
    row = RowChange(OpType.INSERT, KEYED, 1, 0.0, {"id": 1, "region": "x" * 500, "qty": 1})
    assert key_text(row) == f"(id, region)=(1, {repr('x' * 500)[:80]}... (502 characters))"


def test_nothing_is_named_when_no_row_is_refused_parsed_or_the_target_fails_otherwise() -> None:
    assert find_refused_row(Reader(_rows(KEYED, 50, set())), Target(), _task(KEYED), DataRejected("x")) is None

    class Gone(Target):
        def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
            raise SinkUnavailable("target is unavailable")

    assert find_refused_row(Reader(_rows(KEYED, 50, {3})), Gone(), _task(KEYED), DataRejected("x")) is None


def test_a_sink_that_cannot_roll_back_or_a_deferred_key_is_not_searched() -> None:
    class Kafka(MemorySink):  # (not an AtomicTxnSink: its writes are not rolled back)
        pass

    reader = Reader(_rows(KEYED, 5, {1}))
    assert find_refused_row(reader, Kafka(), _task(KEYED), DataRejected("x")) is None
    task = ChunkTask(JOB, KEYED, _task(KEYED).chunk, deferred=True)
    assert find_refused_row(reader, Target(), task, DataRejected("x")) is None
    assert reader.reads == 0


def test_the_copy_reports_the_refused_row_instead_of_the_chunks_error(monkeypatch: pytest.MonkeyPatch) -> None:
    reader, sink = Reader(_rows(KEYED, 30, {17})), Target()
    recorded: list[Any] = []

    class Store:
        def __init__(self, *a: Any) -> None:
            pass

        def record_chunk(self, *a: Any) -> None:
            recorded.append(a)

    class Upstream:
        def snapshot_reader(self, *a: Any, **k: Any) -> Reader:
            return reader

    monkeypatch.setattr(copy_mod, "open_upstream", lambda uri: Upstream())
    monkeypatch.setattr(copy_mod, "open_sink", lambda uri, cfg: sink)
    monkeypatch.setattr(copy_mod, "EtcdClient", lambda endpoints: type("C", (), {"close": lambda self: None})())
    monkeypatch.setattr(copy_mod, "SnapshotProgressStore", Store)
    [result] = list(copy_mod.copy_chunks([_task(KEYED)]))
    assert result.error_code == "CDC:ErrSinkDataRejected" and recorded == [] and sink.committed == []
    assert result.error is not None and "the row with key (id, region)=(17, 'eu')" in result.error
    assert "pw" not in result.error  # (no URI in it; a URI would be redacted by one_line)


def test_a_real_sqlite_target_keeps_nothing_of_the_search(tmp_path: Any) -> None:
    """The probes through the real SQL sink (SQLite, in process): the CHECK's refusal is DataRejected, every probe is
    rolled back, and the rows the target took before stay as they were."""
    import sqlite3

    from sinks.sql.sink import SQLSink

    db = tmp_path / "t.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE orders (id integer, region text, qty integer CHECK (qty >= 0), PRIMARY KEY (id, region))")
    conn.execute("INSERT INTO orders VALUES (-1, 'kept', 5)")
    conn.commit()
    conn.close()
    sink = SQLSink(f"sqlite:///{db}")
    try:
        with pytest.raises(DataRejected) as first:
            sink.write(_rows(KEYED, 300, {123}))
        assert "CHECK constraint failed" in first.value.reason
        got = find_refused_row(Reader(_rows(KEYED, 300, {123})), sink, _task(KEYED), first.value)
    finally:
        sink.close()
    assert got is not None and "the row with key (id, region)=(123, 'eu'): CHECK constraint failed" in got.message
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT id, region, qty FROM orders").fetchall() == [(-1, "kept", 5)]
    finally:
        conn.close()
