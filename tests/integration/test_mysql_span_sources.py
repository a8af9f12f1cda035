"""Several spans of one MariaDB changefeed, each a real binlog connection (upstream.mysql.source with the span-set
rule of upstream.mysql.span_set): every span reads the whole binlog and keeps only its own tables' rows, a
transaction touching tables of two spans arrives split, with the same commit Ts, in both; a table created later and
a table renamed into the changefeed are carried by exactly one span; a rename across spans is refused at its position
by both spans it concerns; an idle span's resolved Ts still advances. Taken together no row is lost or doubled."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from cdc.errors import DdlRejected
from cdc.events import TableName
from cdc.filter import TableFilter
from cdc.model import SpanInfo
from cdc.spans import resource_name, span_of
from cdc.ts import Watermark
from playground.servers import MariaDBServer
from tests.integration.test_mysql_source import Recorder, rows_of, stop_source, wait_for
from upstream import open_upstream
from upstream.base import SCHEMA_CHANGE, SpanPlan, decode_payload

pytestmark = pytest.mark.integration

COUNT = 2


def names_of(db: str, span: int, how_many: int, prefix: str) -> list[str]:
    """``how_many`` table names of ``db`` that the rule gives to ``span`` of :data:`COUNT`."""
    out = [n for n in (f"{prefix}{i}" for i in range(200)) if span_of(TableName(db, n), COUNT) == span]
    return out[:how_many]


class Running:
    """One span's source running in a thread into a Recorder."""

    def __init__(self, uri: str, span: SpanInfo) -> None:
        self.up = open_upstream(uri)
        self.src: Any = self.up.span_source(span, Watermark(span.start_ts, 0.0), TableFilter(("*.*",)),
                                            label=f"test/{span.index}", holder="test")
        self.src.open()
        self.rec = Recorder()
        self.resolved: list[Watermark] = []
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _run(self) -> None:
        try:
            self.src.run(self.rec, self.stop, self.resolved.append)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            self.errors.append(exc)

    def close(self) -> None:
        stop_source(self.src, self.th, self.stop)
        self.up.close()
        assert not self.errors, self.errors

    def content(self) -> tuple[list[tuple[int, str, Any]], list[tuple[int, str]]]:
        """(commit Ts, table, id) of every row stored, and (commit Ts, table) of every refused schema change."""
        rows, refused = [], []
        dec = self.src.decoder()
        for ts, _, payloads in self.rec.commits:
            for p in payloads:
                version, raw = decode_payload(p)
                if version == SCHEMA_CHANGE:
                    try:
                        dec.schema_changes(raw, ts, 0.0)
                    except DdlRejected as exc:
                        refused.append((ts, exc.table))
                    continue
                (kind, new, old), = rows_of(self.src, [p])
                rows.append((ts, dec.schema(version).name.table, (new or old or {})["id"]))
        return rows, refused


def test_each_span_carries_its_own_tables_and_together_they_carry_every_row_once(
        mariadb_server: MariaDBServer, mariadb_database: str) -> None:
    db = mariadb_database
    a, b = names_of(db, 0, 1, "a")[0], names_of(db, 1, 1, "b")[0]
    renamed, onto = names_of(db, 0, 1, "r")[0], names_of(db, 1, 1, "n")[0]  # renamed from span 0 onto span 1
    created = names_of(db, 1, 1, "c")[0]
    for t in (a, b, renamed):
        mariadb_server.execute(f"CREATE TABLE {db}.{t} (id INT PRIMARY KEY, v VARCHAR(10))")
    with open_upstream(mariadb_server.uri(db)) as up:
        tables = up.list_tables()
        spans = up.create_spans([SpanPlan(i, resource_name("slot", "multi", i), resource_name("pub", "multi", i),
                                          tuple(t for t in tables if span_of(t, COUNT) == i)) for i in range(COUNT)])
        assert [sorted(t.table for t in up.span_tables(s) or ()) for s in spans] == [sorted([a, renamed]), [b]]
    runs = [Running(mariadb_server.uri(db), s) for s in spans]
    try:
        sql = mariadb_server.execute
        sql(f"INSERT INTO {db}.{a} VALUES (1, 'x'), (2, 'x')")
        conn = mariadb_server.connect(db)
        try:
            with conn.cursor() as cur:
                for stmt in ("START TRANSACTION", f"INSERT INTO {a} VALUES (3, 'both')",
                             f"INSERT INTO {b} VALUES (1, 'both')", f"UPDATE {a} SET v = 'y' WHERE id = 1", "COMMIT"):
                    cur.execute(stmt)
        finally:
            conn.close()
        sql(f"INSERT INTO {db}.{renamed} VALUES (1, 'r')")
        sql(f"CREATE TABLE {db}.{created} (id INT PRIMARY KEY)")
        sql(f"INSERT INTO {db}.{created} VALUES (7)")
        sql(f"RENAME TABLE {db}.{renamed} TO {db}.{onto}")
        sql(f"INSERT INTO {db}.{onto} VALUES (2, 'after')")
        sql(f"DELETE FROM {db}.{b} WHERE id = 1")
        with open_upstream(mariadb_server.uri(db)) as up:
            end = up.current_position()
        # every span passes the binlog end, also span 0, whose tables are idle since the rename
        for r in runs:
            wait_for(lambda r=r: bool(r.errors) or (bool(r.resolved) and r.resolved[-1].ts >= end))
        time.sleep(0.3)
    finally:
        for r in runs:
            r.close()
    (rows0, refused0), (rows1, refused1) = (r.content() for r in runs)
    assert {t for _, t, _ in rows0} == {a, renamed}
    assert {t for _, t, _ in rows1} == {b, created, onto}
    # the cross-span transaction: split, each part at the same commit Ts
    both0 = [ts for ts, t, i in rows0 if t == a and i == 3]
    both1 = [ts for ts, t, i in rows1 if t == b and i == 1]
    assert len(both0) == 1 and both0[0] == both1[0]
    assert sorted((t, i) for _, t, i in rows0 if t == a) == [(a, 1), (a, 1), (a, 2), (a, 3)]
    # the rename: refused at the same position by the span of the old name and the span of the new one; the new
    # name's rows after it are span 1's only
    assert [t for _, t in refused0] == [f"{db}.{renamed}"]
    assert [t for _, t in refused1] == [f"{db}.{onto}"]
    assert refused0[0][0] == refused1[0][0]
    assert [(t, i) for ts, t, i in rows1 if t == onto] == [(onto, 2)]
    assert all(ts > refused1[0][0] for ts, t, _ in rows1 if t == onto)
    # the table created later: its create event and row in span 1 only
    assert [(t, i) for _, t, i in rows1 if t == created] == [(created, 7)]
    # together: every row change of the workload exactly once (7 inserts, 1 update, 1 delete)
    assert len(rows0) + len(rows1) == 9


def test_a_table_renamed_in_from_outside_the_changefeed_is_refused_not_taken_up_without_its_rows(
        mariadb_server: MariaDBServer, mariadb_database: str) -> None:
    """One span: ``RENAME TABLE other.t TO db.t`` brings rows the binlog never carried for this changefeed. Before,
    the span took ``db.t`` up at its first row and the target got only the rows written after (the older ones were
    silently missing); now the rename is refused at its position (skippable once the operator copied the table)."""
    db, other = mariadb_database, f"{mariadb_database[:50]}_o"
    mariadb_server.create_database(other)
    try:
        mariadb_server.execute(f"CREATE TABLE {other}.moved (id INT PRIMARY KEY)")
        mariadb_server.execute(f"INSERT INTO {other}.moved VALUES (1), (2)")
        with open_upstream(mariadb_server.uri(db)) as up:
            [span] = up.create_spans([SpanPlan(0, "slot_in", "pub_in", ())])
        run = Running(mariadb_server.uri(db), span)
        try:
            mariadb_server.execute(f"RENAME TABLE {other}.moved TO {db}.moved")
            mariadb_server.execute(f"INSERT INTO {db}.moved VALUES (3)")
            with open_upstream(mariadb_server.uri(db)) as up:
                end = up.current_position()
            wait_for(lambda: bool(run.errors) or (bool(run.resolved) and run.resolved[-1].ts >= end))
        finally:
            run.close()
        rows, refused = run.content()
        assert [t for _, t in refused] == [f"{db}.moved"]
        assert [(t, i) for _, t, i in rows] == [("moved", 3)] and rows[0][0] > refused[0][0]
    finally:
        mariadb_server.drop_database(other)


def test_one_drop_table_of_two_spans_tables_keeps_each_tables_place_in_the_statement(
        mariadb_server: MariaDBServer, mariadb_database: str) -> None:
    """``DROP TABLE x, y`` with x in span 0 and y in span 1: each span stores only its own table's drop, at the
    table's place in the statement (DdlEvent.seq 0 and 1), the same position the changefeed barrier orders by in
    every span."""
    db = mariadb_database
    x, y = names_of(db, 0, 1, "x")[0], names_of(db, 1, 1, "y")[0]
    for t in (x, y):
        mariadb_server.execute(f"CREATE TABLE {db}.{t} (id INT PRIMARY KEY)")
    with open_upstream(mariadb_server.uri(db)) as up:
        tables = up.list_tables()
        spans = up.create_spans([SpanPlan(i, resource_name("slot", "drop2", i), resource_name("pub", "drop2", i),
                                          tuple(t for t in tables if span_of(t, COUNT) == i)) for i in range(COUNT)])
    runs = [Running(mariadb_server.uri(db), s) for s in spans]
    try:
        mariadb_server.execute(f"DROP TABLE {db}.{y}, {db}.{x}")
        for r in runs:
            wait_for(lambda r=r: bool(r.errors) or bool(r.rec.commits))
    finally:
        for r in runs:
            r.close()
    events = []
    for r in runs:
        [(ts, _, [stored])] = r.rec.commits
        version, raw = decode_payload(stored)
        assert version == SCHEMA_CHANGE
        [event] = r.src.decoder().schema_changes(raw, ts, 0.0)
        events.append((ts, event.table.table, [c.kind.value for c in event.changes], event.seq))
    assert events[0][0] == events[1][0]
    assert [e[1:] for e in events] == [(x, ["drop table"], 1), (y, ["drop table"], 0)]
