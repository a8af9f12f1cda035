"""The MySQL/MariaDB span source (upstream.mysql.source) against a real MariaDB binlog and a real MySQL 8 one (every
test runs on both): whole transactions in commit order at increasing Ts, exact values, resume after a checkpoint,
heartbeats on an idle server, loud refusals."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime
from datetime import time as dtime
from decimal import Decimal
from typing import Any

import pytest

from cdc.errors import DdlRejected, DecodeError, SlotLost, UpstreamUnavailable
from cdc.events import TableName
from cdc.filter import TableFilter
from cdc.model import SpanInfo
from cdc.ts import Watermark
from playground.servers import MariaDBServer, MySQLServer
from upstream import open_upstream
from upstream.base import SCHEMA_CHANGE, SpanPlan, decode_payload
from upstream.mysql.positions import split_ts

TYPES_TABLE = """
CREATE TABLE {db}.types (
  id BIGINT UNSIGNED PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED,
  mi MEDIUMINT, iu INT UNSIGNED, bi BIGINT, d DECIMAL(65,30), d2 DECIMAL(10,2), fl FLOAT, db DOUBLE,
  c CHAR(5), v VARCHAR(20), t TEXT, tl TEXT CHARACTER SET latin1, b BLOB, vb VARBINARY(10), bn BINARY(4),
  dd DATE, dt DATETIME(6), dt0 DATETIME, ts TIMESTAMP(3) NULL, tm TIME(2), y YEAR, j JSON) DEFAULT CHARSET utf8mb4
"""


class Recorder:
    """A ChangeBuffer that keeps what the source hands it (the system under test is the source)."""

    def __init__(self) -> None:
        self.open: dict[int, list[bytes]] = {}
        self.commits: list[tuple[int, float, list[bytes]]] = []
        self.aborts: list[int] = []
        self.lock = threading.Lock()

    def add(self, xid: int, subxid: int, payload: bytes) -> None:
        self.open.setdefault(xid, []).append(payload)

    def add_many(self, xid: int, subxid: int, payloads: list[bytes]) -> None:
        self.open.setdefault(xid, []).extend(payloads)

    def abort(self, xid: int, subxid: int) -> None:
        self.open.pop(xid, None)
        self.aborts.append(xid)

    def commit(self, xid: int, commit_ts: int, commit_time: float) -> None:
        with self.lock:
            self.commits.append((commit_ts, commit_time, self.open.pop(xid, [])))


def start_source(uri: str, start_ts: int, *, slot: str = "slot_src") -> tuple[Any, Recorder, list[Watermark],
                                                                           threading.Thread, threading.Event,
                                                                           list[BaseException]]:
    up = open_upstream(uri)
    src = up.span_source(SpanInfo(0, slot, "pub", start_ts), Watermark(start_ts, 0.0), TableFilter(("*.*",)),
                         label="test", holder="test")
    src.open()
    rec = Recorder()
    resolved: list[Watermark] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            src.run(rec, stop, resolved.append)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return src, rec, resolved, th, stop, errors


def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def stop_source(src: Any, th: threading.Thread, stop: threading.Event) -> None:
    stop.set()
    src.close()
    th.join(10)
    assert not th.is_alive()


def _parse(columns: Any, parsers: list[Any], vals: list[Any] | None) -> dict[str, Any] | None:
    if vals is None:
        return None
    return {c.name: (None if v is None else p(v)) for c, p, v in zip(columns, parsers, vals, strict=True)}


def rows_of(src: Any, payloads: list[bytes]) -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    """(kind, new, old) of each stored change, values parsed as the mounter parses them."""
    dec = src.decoder()
    out = []
    for p in payloads:
        ver, raw = decode_payload(p)
        schema = dec.schema(ver)
        pc = dec.parse_change(raw)
        parsers = [dec.parser(c) for c in schema.columns]
        out.append((pc.kind, _parse(schema.columns, parsers, pc.new), _parse(schema.columns, parsers, pc.old)))
    return out


@pytest.fixture
def db(mysql_server: MariaDBServer, mysql_database: str) -> Iterator[str]:
    yield mysql_database


def start_ts(mysql_server: MariaDBServer, db: str) -> int:
    with open_upstream(mysql_server.uri(db)) as up:
        return up.create_spans([SpanPlan(0, "slot_src", "pub", tuple(up.list_tables()))])[0].start_ts


def test_transactions_arrive_whole_in_commit_order_and_resume_after_the_checkpoint(
        mysql_server: MariaDBServer, db: str) -> None:
    mysql_server.execute(f"CREATE TABLE {db}.acct (id INT PRIMARY KEY, bal DECIMAL(12,2), note VARCHAR(30))")
    mysql_server.execute(f"CREATE TABLE {db}.other (id INT PRIMARY KEY)")
    ts0 = start_ts(mysql_server, db)
    conn = mysql_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.executemany("INSERT INTO acct VALUES (%s, %s, %s)", [(i, Decimal(i) / 4, f"n{i}") for i in range(5)])
        cur.execute("COMMIT")
        cur.execute("BEGIN")
        cur.execute("UPDATE acct SET bal = bal + 1, note = NULL WHERE id = 1")
        cur.execute("DELETE FROM acct WHERE id = 2")
        cur.execute("INSERT INTO other VALUES (7)")
        cur.execute("COMMIT")
        cur.execute("INSERT INTO acct VALUES (10, 0.5, '')")  # autocommit: its own transaction
    src, rec, resolved, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    try:
        wait_for(lambda: len(rec.commits) >= 3)
        wait_for(lambda: bool(resolved) and resolved[-1].ts >= rec.commits[2][0])
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    tss = [c[0] for c in rec.commits]
    assert tss == sorted(tss) and len(set(tss)) == 3 and tss[0] > ts0
    first = rows_of(src, rec.commits[0][2])
    assert [(k, n["id"], n["bal"], n["note"]) for k, n, _ in first] == [
        ("I", i, Decimal(i) / 4 if i % 4 else Decimal(i // 4), f"n{i}") for i in range(5)]
    assert str(first[1][1]["bal"]) == "0.25" and str(first[0][1]["bal"]) == "0.00"  # the column's scale kept
    second = rows_of(src, rec.commits[1][2])
    assert [(k, (n or o)["id"]) for k, n, o in second] == [("U", 1), ("D", 2), ("I", 7)]
    assert second[0][1]["note"] is None and second[0][2]["note"] == "n1" and second[0][1]["bal"] == Decimal("1.25")
    third = rows_of(src, rec.commits[2][2])
    assert third == [("I", {"id": 10, "bal": Decimal("0.50"), "note": ""}, None)]
    assert abs(rec.commits[0][1] - time.time()) < 120  # the commit's wall-clock time

    # a restart from the first transaction's Ts delivers exactly the later ones
    src2, rec2, _, th2, stop2, errors2 = start_source(mysql_server.uri(db), tss[0])
    try:
        wait_for(lambda: len(rec2.commits) >= 2)
        time.sleep(0.5)
    finally:
        stop_source(src2, th2, stop2)
    assert not errors2, errors2
    assert [c[0] for c in rec2.commits] == tss[1:]
    assert rows_of(src2, rec2.commits[1][2]) == third


def test_every_supported_type_arrives_exactly(mysql_server: MariaDBServer, db: str) -> None:
    mysql_server.execute(TYPES_TABLE.format(db=db))
    ts0 = start_ts(mysql_server, db)
    mysql_server.execute(
        f"INSERT INTO {db}.types VALUES (18446744073709551615, -128, 255, -32768, 65535, -8388608, 4294967295, "
        f"-9223372036854775808, '-12345678901234567890123456789012345.123456789012345678901234567890', 1.50, 1.1, "
        f"0.1, 'ab', 'héllo 😀', 'long\ntext', 'café', x'00ff00', x'0001', x'6100', '2024-02-29', "
        f"'2024-01-02 03:04:05.123456', '9999-12-31 23:59:59', '2038-01-19 03:14:07.999', '23:59:59.99', 2155, "
        f"'{{\"a\": [1, 2]}}')")
    mysql_server.execute(f"INSERT INTO {db}.types (id, t, b, y) VALUES (0, '', x'', 0)")
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    try:
        wait_for(lambda: len(rec.commits) >= 2 or bool(errors))
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    [(_, full, _)] = rows_of(src, rec.commits[0][2])
    assert full == {
        "id": Decimal(18446744073709551615), "ti": -128, "tu": 255, "si": -32768, "su": 65535, "mi": -8388608,
        "iu": 4294967295, "bi": -9223372036854775808,
        "d": Decimal("-12345678901234567890123456789012345.123456789012345678901234567890"), "d2": Decimal("1.50"),
        "fl": 1.1, "db": 0.1, "c": "ab", "v": "héllo 😀", "t": "long\ntext", "tl": "café", "b": b"\x00\xff\x00",
        "vb": b"\x00\x01", "bn": b"a\x00\x00\x00", "dd": date(2024, 2, 29), "dt": datetime(2024, 1, 2, 3, 4, 5, 123456),
        "dt0": datetime(9999, 12, 31, 23, 59, 59), "ts": datetime(2038, 1, 19, 3, 14, 7, 999000, tzinfo=UTC),
        "tm": dtime(23, 59, 59, 990000), "y": 2155, "j": '{"a": [1, 2]}'}
    [(_, empty, _)] = rows_of(src, rec.commits[1][2])
    assert empty["t"] == "" and empty["b"] == b"" and empty["y"] == 0 and empty["v"] is None and empty["dd"] is None
    assert not src.take_warnings()  # full row images (MySQL 8 sets the bitmaps' unused bits) are not partial ones
    # the row reader gives the same values as the stream for the same row
    with open_upstream(mysql_server.uri(db)) as up:
        reader = up.row_source()
        try:
            [now] = reader(src.decoder().schema(1), [(Decimal(18446744073709551615),)])
            assert now == full
        finally:
            reader.close()


@pytest.mark.parametrize(("value_sql", "fragment"), [
    ("dd = '0000-00-00'", "out of date range"),
    ("dt0 = '0000-00-00 00:00:00'", "out of datetime"),
    ("ts = '0000-00-00 00:00:00'", "zero TIMESTAMP"),
    ("tm = '-01:00:00'", "outside 00:00:00..23:59:59.999999"),
    ("tm = '25:00:00'", "outside 00:00:00..23:59:59.999999"),
])
def test_values_a_type_cannot_hold_exactly_are_refused(mysql_server: MariaDBServer, db: str, value_sql: str,
                                                       fragment: str) -> None:
    mysql_server.execute(TYPES_TABLE.format(db=db))
    ts0 = start_ts(mysql_server, db)
    conn = mysql_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("SET sql_mode = ''")
        cur.execute(f"INSERT INTO types SET id = 1, {value_sql}")
    conn.close()
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    th.join(20)
    stop_source(src, th, stop)
    assert rec.commits == []
    assert len(errors) == 1 and isinstance(errors[0], DecodeError), errors
    assert fragment in str(errors[0]) and "types" in str(errors[0]), errors[0]


def test_add_and_drop_column_and_drop_table_are_schema_changes_at_their_position(
        mysql_server: MariaDBServer, db: str) -> None:
    mysql_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(10)) DEFAULT CHARSET utf8mb4")
    ts0 = start_ts(mysql_server, db)
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    mysql_server.execute(f"INSERT INTO {db}.t VALUES (1, 'a')")
    mysql_server.execute(f"CREATE TABLE {db}.newer (id INT PRIMARY KEY)")  # a new table: a create table event
    mysql_server.execute(f"ALTER TABLE {db}.t ADD COLUMN c VARCHAR(5) NOT NULL DEFAULT 'x', ADD d DECIMAL(6,2) "
                           f"DEFAULT 1.5 AFTER id")
    mysql_server.execute(f"INSERT INTO {db}.t (id, v, c, d) VALUES (2, 'b', 'y', NULL)")
    mysql_server.execute(f"ALTER TABLE {db}.t DROP COLUMN v")
    mysql_server.execute(f"UPDATE {db}.t SET c = 'z' WHERE id = 1")
    mysql_server.execute(f"DROP TABLE {db}.t")
    wait_for(lambda: len(rec.commits) == 7 or bool(errors))
    stop_source(src, th, stop)
    assert not errors, errors
    dec = src.decoder()
    created = rec.commits.pop(1)
    [create] = dec.schema_changes(decode_payload(created[2][0])[1], created[0], 0.0)
    assert create.kinds == ("create table",) and create.before is None and create.table.table == "newer"
    assert create.after is not None and create.after.column_names == ("id",) and create.after.key == ("id",)
    ddl_ts = [c[0] for c in rec.commits if decode_payload(c[2][0])[0] == SCHEMA_CHANGE]
    assert ddl_ts == [rec.commits[i][0] for i in (1, 3, 5)]
    assert set(ddl_ts) | {created[0]} <= src.schema_change_commits()
    add, drop_col, drop_table = (dec.schema_changes(decode_payload(rec.commits[i][2][0])[1], rec.commits[i][0], 0.0)
                                 for i in (1, 3, 5))
    [add] = add
    assert [(c.kind.value, c.column) for c in add.changes] == [("add column", "c"), ("add column", "d")]
    assert add.before is not None and add.after is not None
    assert add.before.column_names == ("id", "v") and add.after.column_names == ("id", "d", "v", "c")
    assert add.fill("c").value == "x" and add.fill("d").value == Decimal("1.50")
    assert add.commit_ts == rec.commits[1][0] and add.seq == 0
    assert rows_of(src, rec.commits[0][2]) == [("I", {"id": 1, "v": "a"}, None)]
    assert rows_of(src, rec.commits[2][2]) == [("I", {"id": 2, "d": None, "v": "b", "c": "y"}, None)]
    [drop_col] = drop_col
    assert [(c.kind.value, c.column) for c in drop_col.changes] == [("drop column", "v")]
    assert rows_of(src, rec.commits[4][2]) == [("U", {"id": 1, "d": Decimal("1.50"), "c": "z"},
                                               {"id": 1, "d": Decimal("1.50"), "c": "x"})]
    [drop_table] = drop_table
    assert drop_table.kinds == ("drop table",) and drop_table.after is None
    versions = src.take_schema_versions()
    assert [(ts, s.column_names) for ts, s in versions] == [(created[0], ("id",)), (ddl_ts[0], ("id", "d", "v", "c")),
                                                            (ddl_ts[1], ("id", "d", "c"))]


@pytest.mark.parametrize("statement", [
    "ALTER TABLE {db}.t DROP PRIMARY KEY", "ALTER TABLE {db}.t ADD INDEX p (v(3))",
    "CREATE OR REPLACE TABLE {db}.t (id INT PRIMARY KEY)", "ALTER TABLE {db}.t ADD COLUMN g INT AS (id + 1) VIRTUAL",
    "RENAME TABLE {db}.t TO {db}.t2", "ALTER TABLE {db}.t ADD COLUMN e POINT",
    "ALTER TABLE {db}.t ADD COLUMN e ENUM('a', 'b') DEFAULT 'b'",
    "ALTER TABLE {db}.t ADD COLUMN n INT NOT NULL",
])
def test_other_schema_changes_of_a_replicated_table_are_refused(mysql_server: MariaDBServer, db: str,
                                                                statement: str) -> None:
    if isinstance(mysql_server, MySQLServer) and statement.startswith("CREATE OR REPLACE"):
        pytest.skip("CREATE OR REPLACE TABLE is MariaDB's syntax")
    mysql_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(10))")
    ts0 = start_ts(mysql_server, db)
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    mysql_server.execute(f"INSERT INTO {db}.t VALUES (1, '2')")
    wait_for(lambda: len(rec.commits) == 1)
    mysql_server.execute(statement.format(db=db))
    table = "t2" if statement.startswith("RENAME") else "t"
    mysql_server.execute(f"INSERT INTO {db}.{table} SET id = 2" + (", n = 0" if "NOT NULL" in statement else ""))
    wait_for(lambda: len(rec.commits) >= 2 or bool(errors))
    time.sleep(0.5)
    stop_source(src, th, stop)
    assert not errors, errors
    # stored at its position and refused when decoded: DdlRejected at its commit Ts, which fails the changefeed
    # or is skipped knowingly (--skip-ddl-ts), as a DDL the sink rejects
    kind, raw = decode_payload(rec.commits[1][2][0])
    assert kind == SCHEMA_CHANGE
    with pytest.raises(DdlRejected) as exc:
        src.decoder().schema_changes(raw, rec.commits[1][0], 0.0)
    assert exc.value.table == f"{db}.t" and "cannot be replicated" in exc.value.reason, exc.value
    assert f"--skip-ddl-ts {rec.commits[1][0]}" in str(exc.value)
    # the rows after it decode with the table as the catalog shows it (none if the table is gone or ineligible)
    later = [r for c in rec.commits[2:] for r in rows_of(src, c[2])]
    assert all(r[1] is not None and r[1]["id"] == 2 for r in later), later


def test_rows_older_than_a_schema_change_made_while_the_span_was_down_are_refused(
        mysql_server: MariaDBServer, db: str) -> None:
    """The span reads the schema when it opens; rows written before a later ALTER do not fit it: refused, never
    decoded with the wrong columns (restart across DDL is issue 23 item 4)."""
    mysql_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(10))")
    ts0 = start_ts(mysql_server, db)
    mysql_server.execute(f"INSERT INTO {db}.t VALUES (1, '12')")
    mysql_server.execute(f"ALTER TABLE {db}.t MODIFY v INT")  # same names, another type
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    th.join(20)
    stop_source(src, th, stop)
    assert rec.commits == []
    assert len(errors) == 1 and isinstance(errors[0], DecodeError), errors
    assert "its schema changed" in str(errors[0])


def test_idle_server_heartbeats_advance_the_resolved_ts(mysql_server: MariaDBServer, db: str) -> None:
    mysql_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    ts0 = start_ts(mysql_server, db)
    mysql_server.execute(f"CREATE TABLE {db}.unrelated (id INT PRIMARY KEY)")  # moves the binlog end
    src, _, resolved, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    try:
        wait_for(lambda: len(resolved) >= 1 or bool(errors))
        assert not errors, errors
        first = resolved[-1]
        wait_for(lambda: resolved[-1].time > first.time)  # nothing was written: only heartbeats
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    with open_upstream(mysql_server.uri(db)) as up:
        assert resolved[-1].ts <= up.current_position()
    assert resolved[0].ts > ts0


def test_a_broken_stream_is_an_error_never_a_silent_reconnect(mysql_server: MariaDBServer, db: str) -> None:
    mysql_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    ts0 = start_ts(mysql_server, db)
    src, _, resolved, th, stop, errors = start_source(mysql_server.uri(db), ts0, slot="slot_kill")
    wait_for(lambda: any("Binlog Dump" in str(r[4]) for r in mysql_server.execute("SHOW PROCESSLIST") or []))
    for r in mysql_server.execute("SHOW PROCESSLIST") or []:
        if "Binlog Dump" in str(r[4]):
            mysql_server.execute(f"KILL {int(r[0])}")
    th.join(20)
    stop_source(src, th, stop)
    assert len(errors) == 1 and isinstance(errors[0], UpstreamUnavailable), errors


def test_a_purged_start_file_is_a_lost_slot(mysql_server: MariaDBServer, db: str) -> None:
    with open_upstream(mysql_server.uri(db)) as up:
        seq, _ = split_ts(up.current_position())
    src = open_upstream(mysql_server.uri(db)).span_source(SpanInfo(0, "s", "p", (seq + 1000) << 32),
                                                            Watermark((seq + 1000) << 32, 0), TableFilter(("*.*",)),
                                                            label="t", holder="h")
    with pytest.raises(SlotLost, match="no longer on MySQL"):
        src.open()
    src.close()


def test_rows_of_a_non_transactional_table_survive_a_rollback_and_xa_is_refused(
        mysql_server: MariaDBServer, db: str) -> None:
    mysql_server.execute(f"CREATE TABLE {db}.myi (id INT PRIMARY KEY) ENGINE=MyISAM")
    mysql_server.execute(f"CREATE TABLE {db}.inno (id INT PRIMARY KEY) ENGINE=InnoDB")
    ts0 = start_ts(mysql_server, db)
    conn = mysql_server.connect(db)
    try:
        with conn.cursor() as cur:
            if isinstance(mysql_server, MySQLServer):  # enforce_gtid_consistency refuses mixing the two engines
                cur.execute("INSERT INTO myi VALUES (1)")  # (autocommitted: a transaction of its own)
            else:
                cur.execute("BEGIN")
                cur.execute("INSERT INTO inno VALUES (1)")
                cur.execute("INSERT INTO myi VALUES (1)")  # kept upstream by the ROLLBACK
                cur.execute("ROLLBACK")
            cur.execute("XA START 'x1'")
            cur.execute("INSERT INTO inno VALUES (2)")
            cur.execute("XA END 'x1'")
            cur.execute("XA PREPARE 'x1'")
            cur.execute("XA COMMIT 'x1'")
            cur.execute("INSERT INTO inno VALUES (3)")
    finally:
        conn.close()
    assert mysql_server.execute(f"SELECT id FROM {db}.myi") == [(1,)]
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    th.join(20)
    stop_source(src, th, stop)
    assert [rows_of(src, c[2]) for c in rec.commits] == [[("I", {"id": 1}, None)]]
    assert len(errors) == 1 and isinstance(errors[0], DecodeError) and "XA" in str(errors[0]), errors


def test_a_span_restarted_before_an_alter_decodes_older_rows_with_the_recorded_schema(
        mysql_server: MariaDBServer, db: str) -> None:
    """Restart across ALTER TABLE: seeded with the schema history at its start (what the processor does), the span
    decodes the rows written before a later ADD/DROP COLUMN and DROP TABLE as they were written."""
    mysql_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(10), y YEAR) DEFAULT CHARSET utf8mb4")
    mysql_server.execute(f"CREATE TABLE {db}.old (id INT PRIMARY KEY, note TEXT)")
    with open_upstream(mysql_server.uri(db)) as up:
        before = {s.name.table: s for s in up.check_tables(up.list_tables())}
        ts0 = up.create_spans([SpanPlan(0, "slot_src", "pub", tuple(up.list_tables()))])[0].start_ts
    mysql_server.execute(f"INSERT INTO {db}.t VALUES (1, 'a', 2001)")
    mysql_server.execute(f"INSERT INTO {db}.old VALUES (1, 'x')")
    mysql_server.execute(f"ALTER TABLE {db}.t ADD COLUMN c INT DEFAULT 7, DROP COLUMN v")
    mysql_server.execute(f"INSERT INTO {db}.t VALUES (2, 2002, 8)")
    mysql_server.execute(f"DROP TABLE {db}.old")
    up = open_upstream(mysql_server.uri(db))
    src = up.span_source(SpanInfo(0, "slot_src", "pub", ts0), Watermark(ts0, 0.0), TableFilter(("*.*",)),
                         label="test", holder="test")
    src.seed_schemas(before.values())
    src.open()
    rec, stop, errors = Recorder(), threading.Event(), []
    th = threading.Thread(target=lambda: _run(src, rec, stop, errors), daemon=True)
    th.start()
    wait_for(lambda: len(rec.commits) == 5 or bool(errors))
    stop_source(src, th, stop)
    assert not errors, errors
    assert rows_of(src, rec.commits[0][2]) == [("I", {"id": 1, "v": "a", "y": 2001}, None)]
    assert rows_of(src, rec.commits[1][2]) == [("I", {"id": 1, "note": "x"}, None)]
    [alter] = src.decoder().schema_changes(decode_payload(rec.commits[2][2][0])[1], rec.commits[2][0], 0.0)
    assert alter.before.column_names == ("id", "v", "y") and alter.after.column_names == ("id", "y", "c")
    assert rows_of(src, rec.commits[3][2]) == [("I", {"id": 2, "y": 2002, "c": 8}, None)]
    [drop] = src.decoder().schema_changes(decode_payload(rec.commits[4][2][0])[1], rec.commits[4][0], 0.0)
    assert drop.kinds == ("drop table",) and str(drop.table) == f"{db}.old"


def _run(src: Any, rec: Recorder, stop: threading.Event, errors: list[BaseException]) -> None:
    try:
        src.run(rec, stop, lambda w: None)
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        errors.append(exc)


def test_a_table_created_later_that_cannot_be_replicated_is_a_data_warning(
        mysql_server: MariaDBServer, db: str) -> None:
    mysql_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    ts0 = start_ts(mysql_server, db)
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    mysql_server.execute(f"CREATE TABLE {db}.nokey (a INT)")
    mysql_server.execute(f"CREATE TABLE {db}.colors (id INT PRIMARY KEY, c ENUM('r', 'é'))")
    mysql_server.execute(f"CREATE TABLE {db}.fine (id INT PRIMARY KEY)")
    conn = mysql_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO nokey VALUES (1), (2)")
        cur.execute("INSERT INTO colors VALUES (1, 'r')")
        cur.execute("INSERT INTO fine VALUES (1)")
        cur.execute("INSERT INTO t VALUES (1)")
        cur.execute("COMMIT")
    conn.close()
    wait_for(lambda: len(rec.commits) == 2 or bool(errors))
    stop_source(src, th, stop)
    assert not errors, errors
    [(_, _, [created])] = rec.commits[:1]  # only the table that can be replicated is created downstream
    [create] = src.decoder().schema_changes(decode_payload(created)[1], rec.commits[0][0], 0.0)
    assert create.kinds == ("create table",) and create.table.table == "fine"
    assert rows_of(src, rec.commits[1][2]) == [("I", {"id": 1}, None), ("I", {"id": 1}, None)]
    warnings = {w.table: w for w in src.take_warnings()}  # (at the create, merged with the rows' own)
    assert set(warnings) == {f"{db}.nokey", f"{db}.colors"}, warnings
    assert "has no primary key" in warnings[f"{db}.nokey"].message
    assert "enum('r','é')" in warnings[f"{db}.colors"].message and "ASCII" in warnings[f"{db}.colors"].message
    assert all(w.code == "CDC:WarnTableIneligible" for w in warnings.values())


def test_columns_dropped_since_the_start_take_their_type_from_the_binlog(mysql_server: MariaDBServer, db: str) -> None:
    """A column the catalog no longer has is known only by its recorded description (varbinary, blob and binary(n)
    are all bytea; tinyint, smallint and year all smallint): its binlog column decides how its values render."""
    mysql_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, vb VARBINARY(8), bn BINARY(3), ti TINYINT, "
                           f"y YEAR, ch CHAR(4))")
    with open_upstream(mysql_server.uri(db)) as up:
        before = up.check_tables(up.list_tables())
        ts0 = up.create_spans([SpanPlan(0, "slot_src", "pub", tuple(up.list_tables()))])[0].start_ts
    mysql_server.execute(f"INSERT INTO {db}.t VALUES (1, x'0102', x'05', -3, 2000, 'ab')")
    mysql_server.execute(f"ALTER TABLE {db}.t DROP COLUMN vb, DROP COLUMN bn, DROP COLUMN ti, DROP COLUMN y, "
                           f"DROP COLUMN ch")
    up = open_upstream(mysql_server.uri(db))
    src = up.span_source(SpanInfo(0, "slot_src", "pub", ts0), Watermark(ts0, 0.0), TableFilter(("*.*",)),
                         label="test", holder="test")
    src.seed_schemas(before)
    src.open()
    rec, stop, errors = Recorder(), threading.Event(), []
    th = threading.Thread(target=lambda: _run(src, rec, stop, errors), daemon=True)
    th.start()
    wait_for(lambda: len(rec.commits) == 2 or bool(errors))
    stop_source(src, th, stop)
    assert not errors, errors
    assert rows_of(src, rec.commits[0][2]) == [
        ("I", {"id": 1, "vb": b"\x01\x02", "bn": b"\x05\x00\x00", "ti": -3, "y": 2000, "ch": "ab"}, None)]


MORE_TYPES = """
CREATE TABLE {db}.more (
  id INT PRIMARY KEY, b1 BIT(1), b13 BIT(13), b64 BIT(64), e ENUM('small', 'it''s', 'large') NULL,
  s SET('r', 'g', 'b') NULL, j JSON, gs INT AS (id * 2) STORED, gv VARCHAR(30) AS (CONCAT(e, '/', s)) VIRTUAL,
  lt VARCHAR(10) CHARACTER SET latin1, ub BIGINT UNSIGNED, d DECIMAL(65,30)) DEFAULT CHARSET utf8mb4
"""


def test_bit_enum_set_json_and_generated_columns_arrive_exactly(mysql_server: MariaDBServer, db: str) -> None:
    """BIT as bit(n) text, ENUM/SET as their members (SET in definition order, the empty set as '', distinct from
    NULL), MariaDB's JSON as its text, STORED and VIRTUAL generated columns with the upstream's computed value;
    the row reader (SELECT) gives the same values as the stream."""
    mysql_server.execute(MORE_TYPES.format(db=db))
    ts0 = start_ts(mysql_server, db)
    conn = mysql_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("SET sql_mode = ''")  # lets ENUM take its invalid value '' (index 0)
        cur.execute("INSERT INTO more (id, b1, b13, b64, e, s, j, lt, ub, d) VALUES "
                    "(1, b'1', b'1000000000001', x'FFFFFFFFFFFFFFFF', 'it''s', 'b,r', '{\"k\": [1, \"x\"]}', "
                    "'caf\xe9', 9223372036854775808, '12345678901234567890123456789012345.123456789012345678901234567890'),"
                    "(2, b'0', b'0', 0, '', '', '[]', '', 0, 0), "
                    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL), "
                    "(4, b'1', b'101', 5, 'nope', 'g', 'null', 'x', 18446744073709551615, -1.5)")
    conn.close()
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    try:
        wait_for(lambda: len(rec.commits) >= 1 or bool(errors))
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    rows = {r[1]["id"]: r[1] for r in rows_of(src, rec.commits[0][2])}
    assert rows[1] == {"id": 1, "b1": "1", "b13": "1000000000001", "b64": "1" * 64, "e": "it's", "s": "r,b",
                       "j": '{"k": [1, "x"]}', "gs": 2, "gv": "it's/r,b", "lt": "café", "ub": Decimal(2**63),
                       "d": Decimal("12345678901234567890123456789012345.123456789012345678901234567890")}
    assert rows[2] == {"id": 2, "b1": "0", "b13": "0" * 13, "b64": "0" * 64, "e": "", "s": "", "j": "[]", "gs": 4,
                       "gv": "/", "lt": "", "ub": Decimal(0), "d": Decimal("0E-30")}
    assert rows[3] == {"id": 3, "b1": None, "b13": None, "b64": None, "e": None, "s": None, "j": None, "gs": 6,
                       "gv": None, "lt": None, "ub": None, "d": None}
    assert rows[4]["e"] == "" and rows[4]["b13"] == "0000000000101" and rows[4]["ub"] == Decimal(2**64 - 1)
    schema = src.decoder().schema(1)
    assert {c.name: c.type_name for c in schema.columns if c.name in ("b13", "e", "s")} == {
        "b13": "bit(13)", "e": "text", "s": "text"}
    with open_upstream(mysql_server.uri(db)) as up:
        reader = up.row_source()
        try:
            assert reader(schema, [(1,), (2,), (3,), (4,)]) == [rows[1], rows[2], rows[3], rows[4]]
        finally:
            reader.close()


def test_modify_change_rename_column_index_and_truncate_are_schema_changes_at_their_position(
        mysql_server: MariaDBServer, db: str) -> None:
    mysql_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(10), n INT, k INT) "
                           f"DEFAULT CHARSET utf8mb4")
    ts0 = start_ts(mysql_server, db)
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    for stmt in [
        "INSERT INTO {db}.t VALUES (1, 'a', 5, 1)",
        "ALTER TABLE {db}.t MODIFY COLUMN n BIGINT, CHANGE v w VARCHAR(20) NOT NULL, RENAME COLUMN k TO kk",
        "INSERT INTO {db}.t VALUES (2, 'bb', 9223372036854775807, 2)",
        "ALTER TABLE {db}.t ADD INDEX by_w (w), ADD UNIQUE KEY u_n (n DESC)",
        "CREATE INDEX by_kk ON {db}.t (kk, w)",
        "DROP INDEX by_kk ON {db}.t",
        "ALTER TABLE {db}.t DROP INDEX by_w",
        "TRUNCATE TABLE {db}.t",
        "INSERT INTO {db}.t VALUES (3, 'c', 3, 3)",
    ]:
        mysql_server.execute(stmt.format(db=db))
    wait_for(lambda: len(rec.commits) == 9 or bool(errors))
    stop_source(src, th, stop)
    assert not errors, errors
    dec = src.decoder()
    events = [dec.schema_changes(decode_payload(c[2][0])[1], c[0], 0.0)[0] for c in rec.commits
              if decode_payload(c[2][0])[0] == SCHEMA_CHANGE]
    assert {c[0] for c in rec.commits if decode_payload(c[2][0])[0] == SCHEMA_CHANGE} <= src.schema_change_commits()
    shapes = [[(c.kind.value, c.column, c.new_name, c.index and (c.index.name, c.index.columns, c.index.unique))
               for c in e.changes] for e in events]
    assert shapes == [
        [("rename column", "v", "w", None), ("rename column", "k", "kk", None), ("alter column type", "n", None, None),
         ("alter column type", "w", None, None)],
        [("create index", None, None, ("by_w", ("w",), False)), ("create index", None, None, ("u_n", ("n",), True))],
        [("create index", None, None, ("by_kk", ("kk", "w"), False))],
        [("drop index", None, None, ("by_kk", (), False))],
        [("drop index", None, None, ("by_w", (), False))],
        [("truncate table", None, None, None)],
    ]
    modify = events[0]
    assert modify.before.column_names == ("id", "v", "n", "k") and modify.after.column_names == ("id", "w", "n", "kk")
    assert modify.after.column("n").type_name == "bigint" and modify.after.column("w").type_name == "character varying(20)"
    assert rows_of(src, rec.commits[0][2]) == [("I", {"id": 1, "v": "a", "n": 5, "k": 1}, None)]
    assert rows_of(src, rec.commits[2][2]) == [("I", {"id": 2, "w": "bb", "n": 9223372036854775807, "kk": 2}, None)]
    assert rows_of(src, rec.commits[8][2]) == [("I", {"id": 3, "w": "c", "n": 3, "kk": 3}, None)]
    assert events[5].before is events[5].after or events[5].before == events[5].after


def test_a_span_restarted_before_a_modify_decodes_older_rows_with_the_recorded_types(
        mysql_server: MariaDBServer, db: str) -> None:
    """Restart across MODIFY/CHANGE: rows written before the change decode with the types they were written with
    (the binlog's own column decides), rows after it with the new ones."""
    mysql_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, n SMALLINT, v VARCHAR(5)) DEFAULT CHARSET utf8mb4")
    with open_upstream(mysql_server.uri(db)) as up:
        before = up.check_tables(up.list_tables())
        ts0 = up.create_spans([SpanPlan(0, "slot_src", "pub", tuple(up.list_tables()))])[0].start_ts
    mysql_server.execute(f"INSERT INTO {db}.t VALUES (1, -7, 'abc')")
    mysql_server.execute(f"ALTER TABLE {db}.t MODIFY n BIGINT, CHANGE v w VARCHAR(30)")
    mysql_server.execute(f"INSERT INTO {db}.t VALUES (2, 9000000000, 'long enough text')")
    up = open_upstream(mysql_server.uri(db))
    src = up.span_source(SpanInfo(0, "slot_src", "pub", ts0), Watermark(ts0, 0.0), TableFilter(("*.*",)),
                         label="test", holder="test")
    src.seed_schemas(before)
    src.open()
    rec, stop, errors = Recorder(), threading.Event(), []
    th = threading.Thread(target=lambda: _run(src, rec, stop, errors), daemon=True)
    th.start()
    wait_for(lambda: len(rec.commits) == 3 or bool(errors))
    stop_source(src, th, stop)
    assert not errors, errors
    assert rows_of(src, rec.commits[0][2]) == [("I", {"id": 1, "n": -7, "v": "abc"}, None)]
    [ev] = src.decoder().schema_changes(decode_payload(rec.commits[1][2][0])[1], rec.commits[1][0], 0.0)
    assert [c.kind.value for c in ev.changes] == ["rename column", "alter column type", "alter column type"]
    assert rows_of(src, rec.commits[2][2]) == [("I", {"id": 2, "n": 9000000000, "w": "long enough text"}, None)]


def test_a_session_with_a_partial_row_image_is_never_stored_as_full_rows(mysql_server: MariaDBServer,
                                                                        db: str) -> None:
    """``SET SESSION binlog_row_image = MINIMAL`` / ``NOBLOB``: the binlog rows lack columns. The span stores what was
    not carried as UNCHANGED (never NULL), an UPDATE's unwritten after-image column from its before image, a
    partial old row as key only ('K'), and says so in a notice naming the table and keys."""
    from cdc.events import UNCHANGED
    from upstream.mysql.row_image import WARN_PARTIAL_ROW_IMAGE

    mysql_server.execute(f"CREATE TABLE {db}.pi (id INT PRIMARY KEY, a INT, b TEXT, c INT DEFAULT 7)")
    ts0 = start_ts(mysql_server, db)
    conn = mysql_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("INSERT INTO pi VALUES (1, 1, 'one', 1)")  # FULL
        cur.execute("SET SESSION binlog_row_image = MINIMAL")
        cur.execute("INSERT INTO pi (id, a) VALUES (2, 2)")
        cur.execute("UPDATE pi SET a = 5 WHERE id = 1")
        cur.execute("DELETE FROM pi WHERE id = 2")
        cur.execute("SET SESSION binlog_row_image = NOBLOB")
        cur.execute("UPDATE pi SET c = 8 WHERE id = 1")
        cur.execute("SET SESSION binlog_row_image = MINIMAL")
        cur.execute("UPDATE pi SET id = 3 WHERE id = 1")  # a key change: a DELETE and a partial INSERT
    src, rec, _, th, stop, errors = start_source(mysql_server.uri(db), ts0)
    try:
        wait_for(lambda: len(rec.commits) >= 6 or bool(errors))
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    dec = src.decoder()
    got = []
    for _, _, payloads in rec.commits:
        for p in payloads:
            ver, raw = decode_payload(p)
            pc = dec.parse_change(raw)
            got.append((pc.kind, pc.new, pc.old, pc.old_kind))
    U = UNCHANGED
    assert got == [
        ("I", ["1", "1", "one", "1"], None, None),
        ("I", ["2", "2", U, U], None, None),  # MINIMAL insert: b and c were not carried (NULL and the default 7)
        ("U", ["1", "5", U, U], ["1", U, U, U], "K"),  # the key from the before image; b, c unknown
        ("D", None, ["2", U, U, U], "K"),
        ("U", ["1", "5", U, "8"], ["1", "5", U, "1"], "K"),  # NOBLOB: the TEXT column not carried
        ("D", None, ["1", U, U, U], "K"),
        ("I", ["3", U, U, U], None, None),
    ], got
    warnings = src.take_warnings()
    assert {w.code for w in warnings} == {WARN_PARTIAL_ROW_IMAGE}, warnings
    assert all(w.table == f"{db}.pi" and w.severity == "notice" for w in warnings), warnings
    [w] = warnings  # one per table, merged until taken
    assert w.count == 5 and w.keys == ("2", "1"), w
    assert "binlog_row_image" in w.message and "columns not carried: a, b, c" in w.message, w.message


def test_a_span_restarted_before_a_create_table_replays_its_create_event(mysql_server: MariaDBServer,
                                                                         db: str) -> None:
    """The span starts (from the schema history) before a CREATE TABLE that is in the catalog by then: the table is
    not taken from the catalog at open, so the replayed CREATE TABLE is its create event again (an empty table a
    crash kept from the target still reaches it)."""
    mysql_server.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")
    ts0 = start_ts(mysql_server, db)
    mysql_server.execute(f"CREATE TABLE {db}.newer (id INT PRIMARY KEY, v VARCHAR(5))")
    with open_upstream(mysql_server.uri(db)) as up:
        seeded = up.table_schema(TableName(db, "t"))
    up = open_upstream(mysql_server.uri(db))
    src = up.span_source(SpanInfo(0, "slot_src", "pub", ts0), Watermark(ts0, 0.0), TableFilter(("*.*",)),
                         label="test", holder="test")
    src.seed_schemas([seeded])  # the history at ts0: t only
    src.open()
    rec = Recorder()
    stop = threading.Event()
    errors: list[BaseException] = []
    th = threading.Thread(target=lambda: src.run(rec, stop, lambda w: None), daemon=True)
    th.start()
    try:
        wait_for(lambda: len(rec.commits) >= 1 or bool(errors))
    finally:
        stop_source(src, th, stop)
    assert not errors, errors
    [(ts, _, [payload])] = rec.commits
    [create] = src.decoder().schema_changes(decode_payload(payload)[1], ts, 0.0)
    assert create.kinds == ("create table",) and create.table == TableName(db, "newer")
    assert create.after is not None and create.after.column_names == ("id", "v")
