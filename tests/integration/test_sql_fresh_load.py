"""MySQL/MariaDB: upstream INSERTs with their text go by ``LOAD DATA LOCAL INFILE`` straight into the table under a
savepoint (``sinks.sql.ops.fresh_load``), against a real MariaDB. What the load does not store exactly as the
statements would (an existing key, a key twice, a value the strict statements refuse) is rolled back to its
savepoint and written by the statements, so the target always ends as the upsert path leaves it. Which path ran is
read from the server's own statement counters (``Com_load``, ``Com_rollback_to_savepoint``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.errors import SinkError
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.factory import open_sink
from sinks.sql.ops import fresh_load, output
from sinks.sql.sink import SQLSink

pytestmark = pytest.mark.integration

USERS = TableSchema(TableName("public", "users"), (
    ColumnSchema("id", 0, "int4", nullable=False, is_key=True), ColumnSchema("name", 0, "text"),
    ColumnSchema("score", 0, "int4")), ("id",))


def fresh(i: int, name: str) -> RowChange:
    return RowChange(OpType.INSERT, USERS, 1, row=(i, name, i), row_text=(str(i), name, str(i)))


class Maria:
    def __init__(self, server: Any, db: str) -> None:
        self.server, self.db = server, db

    def sql(self, sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.server.execute(sql, db=self.db) or []]

    def counters(self) -> dict[str, int]:
        got = self.sql("SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_load', 'Com_rollback_to_savepoint')")
        return {str(k): int(v) for k, v in got}

    def sink(self, batch_rows: int) -> SQLSink:
        s = open_sink(self.server.uri(self.db), SinkConfig(batch_rows=batch_rows))
        assert isinstance(s, SQLSink)
        s.check()
        return s


@pytest.fixture(autouse=True)
def _small_groups_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fresh_load, "MIN_ROWS", 32)  # (the tests' groups are small: 40-50 rows)


@pytest.fixture
def maria(mariadb_server: Any, mariadb_database: str) -> Iterator[Maria]:
    yield Maria(mariadb_server, mariadb_database)


def delta(before: dict[str, int], after: dict[str, int]) -> tuple[int, int]:
    return (after["Com_load"] - before["Com_load"],
            after["Com_rollback_to_savepoint"] - before["Com_rollback_to_savepoint"])


def test_fresh_rows_load_and_fall_back_to_the_upsert_where_a_key_exists_or_repeats(maria: Maria) -> None:
    """Groups of fresh rows are loaded; a group meeting keys the target holds, or holding a key twice, is rolled back
    to its savepoint (the groups before it in the transaction stay) and upserted: the new rows win, in order, nothing
    is duplicated or lost."""
    sink = maria.sink(batch_rows=50)
    try:
        c0 = maria.counters()
        sink.write([fresh(1000 + i, f"x{i}") for i in range(100)])
        assert delta(c0, maria.counters()) == (2, 0)  # two groups of 50, each one load, both clean
        maria.sql("INSERT INTO users VALUES (55, 'before', -1), (99, 'before', -1)")
        c1 = maria.counters()
        # one transaction, groups of 50: 0..49 (new), 50..99 (55 and 99 exist: rolled back, upserted), then 5 again
        # (a single row: statements)
        sink.write([fresh(i, f"n{i}") for i in range(100)] + [fresh(5, "again")])
        assert delta(c1, maria.counters()) == (2, 1)
        c2 = maria.counters()
        # a key twice in one group: the load would keep the first (LOCAL skips duplicates); the upsert keeps the last
        sink.write([fresh(200 + i, f"d{i}") for i in range(40)] + [fresh(210, "last")])
        assert delta(c2, maria.counters()) == (1, 1)
    finally:
        sink.close()
    want = sorted([(i, "again" if i == 5 else f"n{i}", i) for i in range(100)]
                  + [(1000 + i, f"x{i}", 1000 + i) for i in range(100)]
                  + [(200 + i, "last" if i == 10 else f"d{i}", 200 + i) for i in range(40)])
    assert maria.sql("SELECT * FROM users ORDER BY id") == want


def test_a_table_whose_loads_keep_meeting_existing_keys_takes_the_statements(maria: Maria) -> None:
    sink = maria.sink(batch_rows=40)
    try:
        sink.write([fresh(i, "first") for i in range(40)])  # (loaded, creates the table)
        c0 = maria.counters()
        for _ in range(output.FRESH_CONFLICTS_TO_STOP):  # every group meets its keys: rolled back, upserted
            sink.write([fresh(i, "again") for i in range(40)])
        assert delta(c0, maria.counters()) == (output.FRESH_CONFLICTS_TO_STOP,) * 2
        c1 = maria.counters()
        sink.write([fresh(i, "last") for i in range(40, 80)])  # new keys, but the table now takes the statements
        assert delta(c1, maria.counters()) == (0, 0)
    finally:
        sink.close()
    assert maria.sql("SELECT * FROM users ORDER BY id") == (
        [(i, "again", i) for i in range(40)] + [(i, "last", i) for i in range(40, 80)])


def test_a_value_the_statements_refuse_is_refused_not_stored_truncated(maria: Maria) -> None:
    """``LOAD DATA LOCAL`` turns a too-long string into a warning and stores it cut; the load is rolled back and the
    strict statements refuse the write, so nothing of it stays."""
    maria.sql("CREATE TABLE users (id INT PRIMARY KEY, name VARCHAR(3), score INT)")
    sink = maria.sink(batch_rows=1000)
    try:
        c0 = maria.counters()
        with pytest.raises(SinkError, match=r"(?i)data too long for column 'name'"):
            sink.write([fresh(i, "abc") for i in range(39)] + [fresh(39, "abcd")])
        assert delta(c0, maria.counters()) == (1, 1)
    finally:
        sink.close()
    assert maria.sql("SELECT COUNT(*) FROM users") == [(0,)]


def test_the_switch_and_small_groups_keep_the_statements(maria: Maria, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = maria.sink(batch_rows=1000)
    try:
        c0 = maria.counters()
        sink.write([fresh(i, "small") for i in range(fresh_load.MIN_ROWS - 1)])
        assert delta(c0, maria.counters()) == (0, 0)
    finally:
        sink.close()
    monkeypatch.setenv("TIDEWATER_FRESH_LOAD", "off")
    sink = maria.sink(batch_rows=1000)
    try:
        c1 = maria.counters()
        sink.write([fresh(i, "off") for i in range(100, 200)])
        assert delta(c1, maria.counters()) == (0, 0)
    finally:
        sink.close()
    assert maria.sql("SELECT COUNT(*) FROM users") == [(fresh_load.MIN_ROWS - 1 + 100,)]


def test_edge_values_streamed_are_stored_by_the_load_as_the_statements_store_them(
        pg_server: Any, pg_database: str, mariadb_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The initial copy's edge values (every C kind: escapes, tabs, newlines, backslashes, 4-byte UTF-8, NULLs,
    numeric scales, float extremes, dates, times, timestamps, UUIDs), as a PostgreSQL upstream streams them through
    pgoutput, our decoder and mounter, written once by the load and once by the statements
    (``TIDEWATER_FRESH_LOAD=off``) into two MariaDB databases: stored byte for byte alike, and equal to the
    upstream row by row."""
    import uuid

    from playground.compare import compare_tables
    from sinks.sql.dialect import copy_literals
    from tests.integration.test_snapshot_literal_copy import EDGE, ROWS
    from tests.integration.test_values_exact import Upstream

    if copy_literals.native() is None:
        pytest.skip("the C renderer cannot be built here")
    up = Upstream(pg_server, pg_database)
    dbs = [f"fresh_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    try:
        up.sql(EDGE)
        changes = up.changes()  # (one implicit transaction)
        assert len(changes) == ROWS
        for db, switch in zip(dbs, ("on", "off"), strict=True):
            mariadb_server.create_database(db)
            monkeypatch.setenv("TIDEWATER_FRESH_LOAD", switch)
            maria = Maria(mariadb_server, db)
            sink = maria.sink(batch_rows=700)  # several loads, one pipelined after the other
            try:
                c0 = maria.counters()
                sink.write(changes)
                loaded, rolled_back = delta(c0, maria.counters())
                assert (loaded >= ROWS // 700 if switch == "on" else loaded == 0) and rolled_back == 0
            finally:
                sink.close()
        fast, statements = (Maria(mariadb_server, db).sql("SELECT *, HEX(t), HEX(vc), HEX(bp) FROM lit ORDER BY id")
                            for db in dbs)
        assert fast == statements and len(fast) == ROWS
        (diff,) = compare_tables(up.conn, ["public.lit"], mariadb_server.uri(dbs[0]))
        assert diff.equal and diff.source_rows == diff.target_rows == ROWS, diff
    finally:
        up.close()
        for db in dbs:
            mariadb_server.drop_database(db)
