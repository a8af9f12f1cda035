"""A target table dropped behind the changefeed's back is refused, never created again empty
(``sinks.sql.target.table_record``), on real MariaDB, PostgreSQL and SQLite targets: the sink records the target tables
its changefeed has had, a later sink of the same changefeed (a restart) refuses to create one that is missing with
``CDC:ErrTargetTableDropped`` naming the table and the fix; the legitimate ways a table leaves (an upstream DROP or
RENAME TABLE through the DDL path, a resync, ``changefeed remove``, a changefeed re-created under the same id) let a
table of that name be created again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.errors import TargetTableDropped, TidewaterError
from cdc.events import ColumnSchema, DdlChange, DdlEvent, DdlKind, OpType, RowChange, TableName, TableSchema
from sinks.factory import open_sink
from sinks.sql.sink import SQLSink
from tests.sql_targets import SqlTarget, make_target

pytestmark = pytest.mark.integration
K = DdlKind
ORIGIN = 50


class Target(SqlTarget):
    def sink(self, workers: int = 1) -> SQLSink:
        s = open_sink(self.uri, SinkConfig(worker_count=workers))
        assert isinstance(s, SQLSink)
        s.check()
        return s

    def rows(self, name: str) -> list[tuple[Any, ...]]:
        return sorted(tuple(r) for r in self.execute(f"SELECT * FROM {self.qualified(name)}"))

    def drop(self, name: str) -> None:
        self.execute(f"DROP TABLE {self.qualified(name)}")


@pytest.fixture(params=["mariadb", "postgresql", "sqlite"])
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Target:
    return make_target(Target, request, tmp_path)


def schema(name: str, *extra: str) -> TableSchema:
    cols = (ColumnSchema("id", 0, "int4", nullable=False, is_key=True), ColumnSchema("v", 0, "text"),
            *(ColumnSchema(c, 0, "int4") for c in extra))
    return TableSchema(TableName("public", name), cols, ("id",))


def ins(s: TableSchema, ts: int, *ids: int) -> list[RowChange]:
    return [RowChange(OpType.INSERT, s, ts, values={"id": i, "v": f"r{i}", **{c: i for c in s.column_names[2:]}})
            for i in ids]


class Feed:
    """The sinks of one span of changefeed ``cf`` on ``target``, one at a time (``restart`` closes one and opens the
    next, as a span restart does); ``ts`` is the next commit Ts."""

    def __init__(self, target: Target, cf: str, origin: int = ORIGIN, workers: int = 1) -> None:
        self.target, self.cf, self.origin, self.workers = target, cf, origin, workers
        self.ts = origin + 10
        self.sink = self._open()

    def _open(self) -> SQLSink:
        s = self.target.sink(self.workers)
        s.open_position(self.cf, 0, self.origin)
        return s

    def restart(self) -> None:
        self.sink.close()
        self.sink = self._open()

    def next_ts(self) -> int:
        self.ts += 10
        return self.ts

    def write(self, s: TableSchema, *ids: int) -> None:
        self.sink.write(ins(s, self.next_ts(), *ids))

    def ddl(self, table: str, *changes: DdlChange, before: TableSchema | None, after: TableSchema | None,
            query: str, new_table: str | None = None) -> None:
        ev = DdlEvent(self.next_ts(), 0.0, TableName("public", table), changes, before, after, query,
                      new_table=TableName("public", new_table) if new_table else None)
        assert self.sink.apply_ddl(ev) is True


@pytest.fixture
def feed(target: Target) -> Iterator[Feed]:
    f = Feed(target, f"cf-{uuid.uuid4().hex[:8]}")
    yield f
    f.sink.close()


def _label(target: Target, table: str) -> str:
    return f"public.{table}" if target.kind == "postgresql" else table


def test_a_table_dropped_behind_the_changefeed_is_refused_after_a_restart_not_created_empty(
        feed: Feed, target: Target) -> None:
    t = schema("t")
    feed.write(t, 1, 2, 3)
    target.drop("t")
    feed.restart()
    with pytest.raises(TargetTableDropped) as err:
        feed.write(t, 4)
    msg = str(err.value)
    assert err.value.code == "CDC:ErrTargetTableDropped" and not err.value.retryable
    assert f"target table {_label(target, 't')} (upstream public.t)" in msg
    assert f"cdc cli changefeed snapshot -c {feed.cf} --table public.t" in msg
    assert "t" not in target.tables()
    with pytest.raises(TargetTableDropped):  # and again: retrying cannot help
        feed.write(t, 5)
    assert "t" not in target.tables()


def test_parallel_apply_records_the_tables_its_planning_binds(target: Target) -> None:
    """The parallel apply's planning binds tables in a transaction it rolls back: the record must not go with it."""
    if target.kind == "sqlite":
        pytest.skip("one writer per file: no parallel apply")
    feed = Feed(target, f"cf-{uuid.uuid4().hex[:8]}", workers=2)
    try:
        t, u = schema("t"), schema("u")
        changes = [ch for i in range(1, 9) for ch in ins(t if i % 2 else u, feed.next_ts(), i)]
        feed.sink.write(changes)
        assert feed.sink.parallel_writes == 1  # (planned and applied on two connections)
        target.drop("t")
        feed.restart()
        with pytest.raises(TargetTableDropped):
            feed.write(t, 20)
        assert "t" not in target.tables()
    finally:
        feed.sink.close()


def test_a_table_dropped_while_a_parallel_sink_runs_fails_with_the_coded_error_not_the_targets_own(
        target: Target) -> None:
    """worker-count > 1: the write's transactions go to several workers; the one of the dropped table fails with the
    target's "no such table", which the caller turns into ``TargetTableDropped`` (before: ``CDC:ErrSinkFatal``, and
    only the next sink's first write was refused)."""
    if target.kind == "sqlite":
        pytest.skip("one writer per file: no parallel apply")
    feed = Feed(target, f"cf-{uuid.uuid4().hex[:8]}", workers=2)
    try:
        t, u = schema("t"), schema("u")
        feed.sink.write([ch for i in range(1, 9) for ch in ins(t if i % 2 else u, feed.next_ts(), i)])
        assert feed.sink.parallel_writes == 1  # (writes of this shape are applied on two connections)
        target.drop("t")
        with pytest.raises(TargetTableDropped) as err:  # (the same shape: planned, both bindings cached)
            feed.sink.write([ch for i in range(11, 19) for ch in ins(t if i % 2 else u, feed.next_ts(), i)])
        assert err.value.code == "CDC:ErrTargetTableDropped"
        assert f"cdc cli changefeed snapshot -c {feed.cf} --table public.t" in str(err.value)
        assert "t" not in target.tables()
    finally:
        feed.sink.close()


def test_a_table_dropped_while_the_sink_runs_is_refused_at_the_write_that_finds_it_missing(
        feed: Feed, target: Target) -> None:
    t = schema("t")
    feed.write(t, 1, 2)
    feed.write(schema("side"), 1)
    target.drop("t")
    feed.write(schema("side"), 2)  # (the other table: unaffected)
    with pytest.raises(TargetTableDropped, match="cdc cli changefeed snapshot"):  # the cached statement failed
        feed.write(t, 3)
    with pytest.raises(TargetTableDropped):  # a retry binds again: refused, not created
        feed.write(t, 3)
    assert "t" not in target.tables()


def test_a_schema_change_of_a_table_dropped_behind_the_changefeed_is_refused_not_recorded(
        feed: Feed, target: Target) -> None:
    t = schema("t")
    feed.write(t, 1)
    target.drop("t")
    feed.restart()
    with pytest.raises(TargetTableDropped, match="ADD COLUMN"):
        feed.ddl("t", DdlChange(K.ADD_COLUMN, "c"), before=t, after=schema("t", "c"),
                 query="ALTER TABLE t ADD COLUMN c int")
    if target.kind != "sqlite" or "tidewater_ddl" in target.tables():  # (SQLite: created in the rolled-back one)
        rec = "tidewater.tidewater_ddl" if target.kind == "postgresql" else "tidewater_ddl"
        assert target.execute(f"SELECT count(*) FROM {rec} WHERE changefeed = '{feed.cf}'")[0][0] == 0
    assert "t" not in target.tables()


def test_a_table_new_to_the_changefeed_is_still_created_at_its_first_rows(feed: Feed, target: Target) -> None:
    feed.write(schema("t"), 1)
    feed.restart()
    feed.write(schema("fresh"), 7)  # never had: created as before
    assert target.rows("fresh") == [(7, "r7")]


def test_an_upstream_drop_then_create_of_the_same_name_works(feed: Feed, target: Target) -> None:
    t = schema("t")
    feed.write(t, 1, 2)
    feed.ddl("t", DdlChange(K.DROP_TABLE), before=t, after=None, query="DROP TABLE t")
    assert "t" not in target.tables()
    feed.restart()
    feed.write(t, 3)  # a new incarnation seen from its rows only (no CREATE event): created
    assert target.rows("t") == [(3, "r3")]
    feed.ddl("t", DdlChange(K.DROP_TABLE), before=t, after=None, query="DROP TABLE t")
    t2 = schema("t", "c")
    feed.ddl("t", DdlChange(K.CREATE_TABLE), before=None, after=t2, query="CREATE TABLE t (id int, v text, c int)")
    feed.restart()
    feed.write(t2, 4)
    assert target.rows("t") == [(4, "r4", 4)]
    target.drop("t")  # the new incarnation is the changefeed's too
    feed.restart()
    with pytest.raises(TargetTableDropped):
        feed.write(t2, 5)


def test_the_record_follows_an_upstream_rename(feed: Feed, target: Target) -> None:
    t = schema("t")
    feed.write(t, 1)
    feed.ddl("t", DdlChange(K.RENAME_TABLE, new_name="public.t2"), before=t, after=schema("t2"),
             query="ALTER TABLE t RENAME TO t2", new_table="t2")
    feed.restart()
    feed.write(schema("t"), 9)  # a new table of the old name: the changefeed never had it
    assert target.rows("t") == [(9, "r9")]
    target.drop("t2")
    feed.restart()
    with pytest.raises(TargetTableDropped, match="t2"):
        feed.write(schema("t2"), 2)


def test_remove_forgets_and_a_changefeed_recreated_under_the_same_id_starts_clean(target: Target) -> None:
    cf = f"cf-{uuid.uuid4().hex[:8]}"
    first = Feed(target, cf)
    first.write(schema("t"), 1)
    first.write(schema("u"), 1)
    target.drop("t")
    target.drop("u")
    assert first.sink.forget(cf) >= 0  # changefeed remove
    first.sink.close()
    again = Feed(target, cf)  # same id, same origin: only remove's forget makes it clean
    again.write(schema("t"), 2)
    assert target.rows("t") == [(2, "r2")]
    again.sink.close()
    # an earlier changefeed of the same id whose remove could not clean the target: its rows have another origin
    target.drop("t")
    later = Feed(target, cf, origin=ORIGIN + 1000)
    later.write(schema("t"), 3)
    assert target.rows("t") == [(3, "r3")]
    target.drop("t")  # and now the table is the new changefeed's
    later.restart()
    with pytest.raises(TargetTableDropped):
        later.write(schema("t"), 4)
    later.sink.close()


def test_a_resync_lets_the_copy_create_the_table_again(feed: Feed, target: Target) -> None:
    t = schema("t")
    feed.write(t, 1)
    target.drop("t")
    feed.restart()
    with pytest.raises(TargetTableDropped):
        feed.write(t, 2)
    other = target.sink()  # cdc cli changefeed snapshot --table public.t: on an instance of its own
    assert other.forget_tables_had(feed.cf, [TableName("public", "t")]) == 1
    other.close()
    feed.restart()
    feed.write(t, 2)
    assert target.rows("t") == [(2, "r2")]


def test_a_copy_that_starts_over_drops_and_creates_the_table_again(feed: Feed, target: Target) -> None:
    t = schema("t")
    feed.write(t, 1)
    copier = target.sink()
    copier.restart_copy_target(t, feed.cf, 0, feed.ts, 0.0)  # dropped by the copy: not behind the changefeed's back
    copier.close()
    assert "t" not in target.tables()
    feed.restart()
    feed.write(t, 2)
    assert target.rows("t") == [(2, "r2")]


def test_a_sink_of_no_changefeed_records_and_refuses_nothing(target: Target) -> None:
    s = target.sink()  # (a copy job's, a tool's: no open_position)
    try:
        s.write(ins(schema("t"), 10, 1))
        target.drop("t")
        s.write(ins(schema("t"), 20, 2))
    except TidewaterError:
        s.write(ins(schema("t"), 20, 2))
    finally:
        s.close()
    assert target.rows("t") == [(2, "r2")]
