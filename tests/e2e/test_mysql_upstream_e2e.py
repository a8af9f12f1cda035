"""End to end: MariaDB and MySQL 8 (row binlog) -> `cdc server` (real etcd, LevelDB sorter) -> SQLite, PostgreSQL and MariaDB
targets, with the capture SIGKILLed mid-stream twice; every run ends in a row-by-row compare with the upstream."""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from e2e_workload import FAST_LEASE, make_sink_uri, run_on_target, server_config, wait_for

from playground.cluster import CdcServer
from playground.compare import compare_mysql_tables, sqlalchemy_url
from playground.servers import MariaDBServer, PostgresServer
from upstream.mysql.positions import to_ts

pytestmark = pytest.mark.e2e

SCHEMA = [
    """CREATE TABLE accounts (id INT PRIMARY KEY, owner VARCHAR(40) NOT NULL, balance DECIMAL(14,2),
       opened DATETIME(6), seen TIMESTAMP(3) NULL, note TEXT, data BLOB, big BIGINT UNSIGNED, day DATE,
       rate DOUBLE) DEFAULT CHARSET utf8mb4""",
    """CREATE TABLE items (sku VARCHAR(20) NOT NULL, qty INT, tag VARBINARY(8), UNIQUE KEY sku_u (sku))
       DEFAULT CHARSET utf8mb4""",
]
TABLES = ["accounts", "items"]


def mixed(conn: Any, txns: int, seed: int, start: int = 0, pause: float = 0.0) -> None:
    """Transactions of inserts, updates and deletes over both tables (several statements each)."""
    rnd = random.Random(seed)
    with conn.cursor() as cur:
        for t in range(start, start + txns):
            cur.execute("BEGIN")
            for i in range(t * 4, t * 4 + 4):
                cur.execute(
                    "INSERT INTO accounts VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                    "ON DUPLICATE KEY UPDATE balance = VALUES(balance), note = NULL",
                    (i, f"owner {i} ü😀", round(rnd.uniform(-1e6, 1e6), 2), f"2024-01-02 03:04:{i % 60:02d}.{i:06d}",
                     None if i % 3 else f"2025-06-0{1 + i % 9} 10:00:00.{i % 1000:03d}",
                     "" if i % 5 == 0 else f"note {i}\n" * (i % 4), bytes([i % 256, 0, 255]) if i % 2 else None,
                     2**64 - 1 - i, None if i % 7 == 0 else f"2020-02-{1 + i % 28:02d}", i / 7))
            if t % 2:
                cur.execute("UPDATE accounts SET balance = balance + 1.25, owner = CONCAT(owner, '!') WHERE id %% 9 = %s",
                            (t % 9,))
            if t % 3 == 0:
                cur.execute("DELETE FROM accounts WHERE id %% 11 = %s", (t % 11,))
            cur.execute("INSERT INTO items VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE qty = qty + 1",
                        (f"sku-{t % 13}", t, bytes([t % 256])))
            if t % 4 == 3:
                cur.execute("DELETE FROM items WHERE sku = %s", (f"sku-{(t * 7) % 13}",))
            cur.execute("COMMIT")
            if pause:
                time.sleep(pause)


def binlog_end(server: MariaDBServer, epoch: int = 0) -> int:
    """The Ts of the server's binlog end now, as a changefeed in its ``epoch``-th upstream server numbers it."""
    [(log_file, pos, *_)] = server.execute("SHOW MASTER STATUS") or []
    return to_ts(log_file, int(pos), epoch)


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def target(request: pytest.FixtureRequest, tmp_path: Path, pg_server: PostgresServer) -> str:
    """A fresh target database on the session's PostgreSQL and MariaDB servers, or a SQLite file."""
    return make_sink_uri(request.param, request, tmp_path, pg_server)


# MySQL 8 into PostgreSQL only in make test: the target side (positions, apply) is the same code whichever MySQL-family
# upstream feeds it, and MariaDB's run goes into every target; the other two MySQL 8 runs are under -m slow
@pytest.mark.parametrize(("mysql_server", "target"), [
    (up, t) if up == "mariadb" or t == "postgresql" else pytest.param(up, t, marks=pytest.mark.slow)
    for up in ("mariadb", "mysql8") for t in ("sqlite", "postgresql", "mariadb")], indirect=True)
def test_mysql_upstream_survives_sigkills_and_converges(
        etcd_server: Any, cluster_id: str, tmp_path: Path, mysql_server: MariaDBServer, mysql_database: str,
        target: str) -> None:
    db = mysql_database
    for stmt in SCHEMA:
        mysql_server.execute(stmt, db=db)
    mixed(mysql_server.connect(db), 5, seed=1)  # before the changefeed: not replicated (--snapshot none)
    mysql_server.execute("DELETE FROM accounts", db=db)
    mysql_server.execute("DELETE FROM items", db=db)
    config = server_config(tmp_path, FAST_LEASE)
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=config).start()
    try:
        cdc.create_changefeed("my", mysql_server.uri(db), target, snapshot="none")
        mixed(mysql_server.connect(db), 30, seed=2)
        writer = threading.Thread(target=mixed, args=(mysql_server.connect(db), 60, 3, 30, 0.02))
        writer.start()
        time.sleep(1.0)
        cdc.kill()  # mid-stream: transactions keep committing upstream while no capture runs
        writer.join()
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                        extra_args=config).start()
        me = cdc.get("/api/v2/status")["id"]
        wait_for(cdc, "my", lambda q: all(s["capture"] == me and s["running"] for s in q["spans"]),
                 "the restarted capture running the span")
        writer = threading.Thread(target=mixed, args=(mysql_server.connect(db), 40, 4, 90, 0.01))
        writer.start()
        time.sleep(0.5)
        cdc.kill()  # second kill, while the restarted capture applies
        writer.join()
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                        extra_args=config).start()
        info = cdc.wait_checkpoint("my", binlog_end(mysql_server), timeout=180)
        conn = mysql_server.connect(db)
        try:
            diffs = compare_mysql_tables(conn, [f"{db}.{t}" for t in TABLES], target)
        finally:
            conn.close()
        bad = [d for d in diffs if not d.equal]
        assert not bad, f"downstream differs from upstream: {bad}\n{cdc.log_tail()}"
        assert all(d.source_rows >= 5 for d in diffs), diffs
        assert info["state"] in ("normal", "warning"), info
        assert not info.get("error") or "DDL" in str(info.get("error")), info
        # the compare sees a one-cent difference (it is not a test that cannot fail)
        table = f'"{db}".accounts' if target.startswith("postgresql") else "accounts"
        run_on_target(target, f"UPDATE {table} SET balance = balance + 0.01 WHERE id = (SELECT m FROM (SELECT "
                              f"MIN(id) AS m FROM {table}) AS x)")
        conn = mysql_server.connect(db)
        try:
            [acc, _] = compare_mysql_tables(conn, [f"{db}.{t}" for t in TABLES], target)
        finally:
            conn.close()
        assert not acc.equal and len(acc.different) == 1, acc
    finally:
        cdc.terminate()


def test_a_broken_binlog_connection_restarts_the_span_from_its_checkpoint(
        cdc_server: CdcServer, mysql_server: MariaDBServer, mysql_database: str, tmp_path: Path) -> None:
    db = mysql_database
    for stmt in SCHEMA:
        mysql_server.execute(stmt, db=db)
    target = f"sqlite:///{tmp_path / 'target.db'}"
    cdc_server.create_changefeed("brk", mysql_server.uri(db), target, snapshot="none")
    wait_for(cdc_server, "brk", lambda q: all(s["running"] for s in q["spans"]), "the span running")
    writer = threading.Thread(target=mixed, args=(mysql_server.connect(db), 80, 5, 0, 0.01))
    writer.start()
    killed = 0
    for _ in range(2):  # the upstream ends the span's binlog dump twice, mid-stream
        time.sleep(0.4)
        for row in mysql_server.execute("SHOW PROCESSLIST") or []:
            if "Binlog Dump" in str(row[4]):
                mysql_server.execute(f"KILL {int(row[0])}")
                killed += 1
    writer.join()
    assert killed >= 1
    info = cdc_server.wait_checkpoint("brk", binlog_end(mysql_server), timeout=120)
    assert info["state"] in ("normal", "warning"), info
    conn = mysql_server.connect(db)
    try:
        diffs = compare_mysql_tables(conn, [f"{db}.{t}" for t in TABLES], target)
    finally:
        conn.close()
    assert all(d.equal for d in diffs), diffs
    log = cdc_server.log_file.read_text(errors="replace")
    # the library's silent reconnect (or the broken stream) was a span error, and the span restarted
    assert "the binlog client reconnected by itself" in log or "binlog stream from MySQL" in log, log[-3000:]


@pytest.fixture(params=["sqlite", "postgresql"])
def ddl_target(request: pytest.FixtureRequest, tmp_path: Path, pg_server: PostgresServer) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'target.db'}"
    db = f"target_{uuid.uuid4().hex[:10]}"
    pg_server.start()
    pg_server.create_database(db)
    return pg_server.uri(db)


def test_add_and_drop_column_and_drop_table_reach_the_target(
        cdc_server: CdcServer, mariadb_server: MariaDBServer, mariadb_database: str, ddl_target: str) -> None:
    db = mariadb_database
    for stmt in SCHEMA:
        mariadb_server.execute(stmt, db=db)
    mariadb_server.execute("CREATE TABLE gone (id INT PRIMARY KEY)", db=db)
    cdc_server.create_changefeed("ddl", mariadb_server.uri(db), ddl_target, snapshot="none")
    conn = mariadb_server.connect(db)
    mixed(conn, 10, seed=6)
    mariadb_server.execute("INSERT INTO gone VALUES (1)", db=db)
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE accounts ADD COLUMN tier VARCHAR(10) NOT NULL DEFAULT 'basic', "
                    "ADD COLUMN score DECIMAL(8,3) DEFAULT 2.5 AFTER owner")
        cur.execute("UPDATE accounts SET tier = 'gold', score = 9.125 WHERE id % 3 = 0")
        cur.execute("ALTER TABLE items DROP COLUMN tag")
        cur.execute("DROP TABLE gone")
    mixed_after = [("INSERT INTO accounts (id, owner, tier, score) VALUES (%s, %s, %s, %s)", (10_000 + i, f"late {i}",
                                                                                           "silver", None))
                   for i in range(5)]
    with conn.cursor() as cur:
        for sql, args in mixed_after:
            cur.execute(sql, args)
        cur.execute("INSERT INTO items (sku, qty) VALUES ('after-drop', 1)")
    conn.close()
    info = cdc_server.wait_checkpoint("ddl", binlog_end(mariadb_server), timeout=120)
    assert info["state"] in ("normal", "warning") and not info.get("error"), info
    conn = mariadb_server.connect(db)
    try:
        diffs = compare_mysql_tables(conn, [f"{db}.{t}" for t in TABLES], ddl_target)
    finally:
        conn.close()
    assert all(d.equal for d in diffs), diffs
    engine = sa.create_engine(sqlalchemy_url(ddl_target))
    try:
        schema = db if ddl_target.startswith("postgresql") else None
        names = sa.inspect(engine).get_table_names(schema=schema)
        item_cols = [c["name"] for c in sa.inspect(engine).get_columns("items", schema=schema)]
        account_cols = [c["name"] for c in sa.inspect(engine).get_columns("accounts", schema=schema)]
    finally:
        engine.dispose()
    assert "gone" not in names and {"accounts", "items"} <= set(names), names
    assert item_cols == ["sku", "qty"], item_cols
    assert {"tier", "score"} <= set(account_cols), account_cols


def test_a_changefeed_resumed_after_an_alter_decodes_the_older_rows_as_written(
        cdc_server: CdcServer, mysql_server: MariaDBServer, mysql_database: str, tmp_path: Path) -> None:
    """Restart across ALTER TABLE: the changefeed is stopped, rows are written, columns added and dropped, rows
    written again; on resume the span starts before the ALTER with the schema history's schema."""
    db = mysql_database
    for stmt in SCHEMA:
        mysql_server.execute(stmt, db=db)
    target = f"sqlite:///{tmp_path / 'target.db'}"
    cdc_server.create_changefeed("alt", mysql_server.uri(db), target, snapshot="none")
    conn = mysql_server.connect(db)
    mixed(conn, 8, seed=9)
    cdc_server.wait_checkpoint("alt", binlog_end(mysql_server), timeout=60)
    assert cdc_server.request("POST", "/api/v2/changefeeds/alt/pause")["state"] == "stopped"
    mixed(conn, 8, seed=10, start=8)  # rows of the old shape, after the checkpoint
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE accounts DROP COLUMN note, ADD COLUMN flag TINYINT DEFAULT 1")
        cur.execute("INSERT INTO accounts (id, owner, flag) VALUES (5000, 'new shape', 0)")
        cur.execute("UPDATE accounts SET flag = 2 WHERE id % 2 = 0")
    conn.close()
    assert cdc_server.request("POST", "/api/v2/changefeeds/alt/resume")["state"] == "normal"
    info = cdc_server.wait_checkpoint("alt", binlog_end(mysql_server), timeout=120)
    assert not info.get("error"), info
    conn = mysql_server.connect(db)
    try:
        diffs = compare_mysql_tables(conn, [f"{db}.{t}" for t in TABLES], target)
    finally:
        conn.close()
    assert all(d.equal for d in diffs), f"{diffs}\n{cdc_server.log_tail(60)}"


TYPES = """CREATE TABLE types (
  id BIGINT UNSIGNED PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT,
  iu INT UNSIGNED, bi BIGINT, d DECIMAL(65,30), d2 DECIMAL(10,2), fl FLOAT, db DOUBLE, c CHAR(5), v VARCHAR(20),
  t TEXT, tl TEXT CHARACTER SET latin1, b BLOB, vb VARBINARY(10), bn BINARY(4), dd DATE, dt DATETIME(6),
  ts TIMESTAMP(3) NULL, tm TIME(2), y YEAR, j JSON) DEFAULT CHARSET utf8mb4"""


def test_every_supported_type_reaches_each_sql_target_exactly(
        cdc_server: CdcServer, mysql_server: MariaDBServer, mysql_database: str, target: str) -> None:
    db = mysql_database
    mysql_server.execute(TYPES, db=db)
    cdc_server.create_changefeed("types", mysql_server.uri(db), target, snapshot="none")
    rows = [
        (18446744073709551615, -128, 255, -32768, 65535, -8388608, 4294967295, -9223372036854775808,
         "-12345678901234567890123456789012345.123456789012345678901234567890", "1.50", 1.1, 0.1, "ab", "héllo 😀",
         "long\ntext", "café", b"\x00\xff\x00", b"\x00\x01", b"a", "2024-02-29", "2024-01-02 03:04:05.123456",
         "2038-01-19 03:14:07.999", "23:59:59.99", 2155, '{"a": [1, 2]}'),
        (0, 0, 0, 0, 0, 0, 0, 0, "0", "0", 0.0, -2.5e-300, "", "", "", "", b"", b"", b"\x00\x00\x00\x00", "1000-01-01",
         "1000-01-01 00:00:00", "1970-01-01 00:00:01", "00:00:00", 1901, "[]"),
        (7,) + (None,) * 24,
    ]
    conn = mysql_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.executemany(f"INSERT INTO types VALUES ({', '.join(['%s'] * 25)})", rows)
        cur.execute("UPDATE types SET v = 'changed', d2 = 99999999.99 WHERE id = 0")
        # whole-image updates of the extreme and the all-NULL row: the new row reaches the targets positionally with
        # its upstream text (the SQL converters' text paths), as an insert's does
        cur.execute("UPDATE types SET c = 'upd' WHERE id IN (18446744073709551615, 7)")
    info = cdc_server.wait_checkpoint("types", binlog_end(mysql_server), timeout=120)
    assert not info.get("error"), info
    try:
        [diff] = compare_mysql_tables(conn, [f"{db}.types"], target)
    finally:
        conn.close()
    assert diff.equal and diff.source_rows == 3, diff


def test_a_large_transaction_killed_mid_stream_converges(
        etcd_server: Any, cluster_id: str, tmp_path: Path, mariadb_server: MariaDBServer,
        mariadb_database: str) -> None:
    db = mariadb_database
    for stmt in SCHEMA:
        mariadb_server.execute(stmt, db=db)
    target = f"sqlite:///{tmp_path / 'target.db'}"
    config = server_config(tmp_path, FAST_LEASE)
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=config).start()
    try:
        cdc.create_changefeed("big", mariadb_server.uri(db), target, snapshot="none")
        mixed(mariadb_server.connect(db), 5, seed=11)
        big = ("INSERT INTO accounts (id, owner, balance, note, data) SELECT 100000 + seq, CONCAT('bulk ', seq), "
               "seq / 100, REPEAT('x', seq % 50), UNHEX(HEX(seq)) FROM seq_1_to_120000")
        writer = threading.Thread(target=mariadb_server.execute, args=(big, db))
        writer.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if cdc.changefeed("big")["spans"][0]["rows"] > 1000:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the large transaction was not being streamed: {cdc.log_tail()}")
        cdc.kill()
        writer.join()
        mixed(mariadb_server.connect(db), 5, seed=12, start=5)
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                        extra_args=config).start()
        info = cdc.wait_checkpoint("big", binlog_end(mariadb_server), timeout=300)
        assert not info.get("error"), info
        conn = mariadb_server.connect(db)
        try:
            diffs = compare_mysql_tables(conn, [f"{db}.{t}" for t in TABLES], target)
        finally:
            conn.close()
        assert all(d.equal for d in diffs), diffs
        assert diffs[0].source_rows > 90_000  # (the later deletes of mixed() remove 2/11 of them)
    finally:
        cdc.terminate()


def target_rows(target: str, sql: str) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` on an SQL target ([] when its table does not exist)."""
    engine = sa.create_engine(sqlalchemy_url(target))
    try:
        with engine.connect() as conn:
            try:
                return [tuple(r) for r in conn.exec_driver_sql(sql)]
            except sa.exc.DBAPIError:
                return []
    finally:
        engine.dispose()


MORE_TYPES = """CREATE TABLE more (
  id INT PRIMARY KEY, b1 BIT(1), b13 BIT(13), b64 BIT(64), e ENUM('small', 'it''s', 'large') NULL,
  s SET('r', 'g', 'b') NULL, j JSON, gs INT AS (id * 2) STORED, gv VARCHAR(30) AS (CONCAT(e, '/', s)) VIRTUAL,
  lt VARCHAR(10) CHARACTER SET latin1, ub BIGINT UNSIGNED, d DECIMAL(65,30)) DEFAULT CHARSET utf8mb4"""


def test_bit_enum_set_json_and_generated_columns_reach_each_sql_target_exactly(
        cdc_server: CdcServer, mariadb_server: MariaDBServer, mariadb_database: str, target: str) -> None:
    """BIT(n) lands as bit(n) text ('0101'; PostgreSQL: bit(n)), ENUM/SET as their member text (the empty SET and
    ENUM's invalid '' distinct from NULL), MariaDB's JSON as its text, generated columns as plain columns holding the
    upstream's computed values (the VIRTUAL one too: it is in MariaDB's FULL row image)."""
    db = mariadb_database
    mariadb_server.execute(MORE_TYPES, db=db)
    cdc_server.create_changefeed("more", mariadb_server.uri(db), target, snapshot="none")
    conn = mariadb_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("SET sql_mode = ''")  # lets ENUM take its invalid value '' (index 0)
        cur.executemany("INSERT INTO more (id, b1, b13, b64, e, s, j, lt, ub, d) VALUES "
                        "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", [
                            (1, b"\x01", b"\x10\x01", b"\xff" * 8, "it's", "b,r", '{"k": [1, "x"], "z": null}',
                             "café", 2**63, "12345678901234567890123456789012345.123456789012345678901234567890"),
                            (2, b"\x00", b"\x00\x00", b"\x00" * 8, "", "", "[]", "", 0, "0"),
                            (3, None, None, None, None, None, None, None, None, None),
                            (4, b"\x01", b"\x00\x05", b"\x80" + b"\x00" * 7, "nope", "g", "null", "x", 2**64 - 1,
                             "-0.000000000000000000000000000001")])
        cur.execute("UPDATE more SET e = 'large', s = 'g,b,r', b13 = b'1111111111111', j = '{\"a\": 1}' WHERE id = 2")
        cur.execute("UPDATE more SET s = '', e = NULL WHERE id = 1")
        cur.execute("DELETE FROM more WHERE id = 3")
        cur.execute("INSERT INTO more (id, s) VALUES (5, 'r')")
    info = cdc_server.wait_checkpoint("more", binlog_end(mariadb_server), timeout=120)
    assert not info.get("error") and info["state"] == "normal", info
    try:
        [diff] = compare_mysql_tables(conn, [f"{db}.more"], target)
    finally:
        conn.close()
    assert diff.equal and diff.source_rows == 4, diff
    table = f'"{db}".more' if target.startswith("postgresql") else "more"
    got = target_rows(target, f"SELECT id, s, e, gv FROM {table} ORDER BY id")
    assert got == [(1, "", None, None), (2, "r,g,b", "large", "large/r,g,b"),
                                        (4, "g", "", "/g"), (5, "r", None, None)], got


def test_a_zero_date_fails_the_changefeed_naming_table_column_and_reason(
        cdc_server: CdcServer, mariadb_server: MariaDBServer, mariadb_database: str, tmp_path: Path) -> None:
    """Zero dates have no exact value in any target: the changefeed fails, its state names the table, the column
    and why; the row is never written changed (or skipped silently)."""
    db = mariadb_database
    mariadb_server.execute("CREATE TABLE dates (id INT PRIMARY KEY, d DATE, dt DATETIME)", db=db)
    target = f"sqlite:///{tmp_path / 'target.db'}"
    cdc_server.create_changefeed("zero", mariadb_server.uri(db), target, snapshot="none")
    conn = mariadb_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("INSERT INTO dates VALUES (1, '2024-01-01', '2024-01-01 10:00:00')")
        cur.execute("SET sql_mode = ''")
        cur.execute("INSERT INTO dates VALUES (2, '0000-00-00', '2024-01-01 10:00:00')")
    conn.close()
    info = wait_for(cdc_server, "zero", lambda q: bool(q.get("error")), "the changefeed failing on the zero date")
    error = str(info.get("error"))
    assert f"{db}.dates" in error and "column d" in error and "date" in error, info
    assert info["state"] in ("failed", "error", "warning"), info
    assert target_rows(target, "SELECT COUNT(*) FROM dates WHERE id = 2") in ([(0,)], [])


def test_modify_change_rename_index_and_truncate_reach_each_sql_target_and_a_refused_ddl_is_skippable(
        cdc_server: CdcServer, mariadb_server: MariaDBServer, mariadb_database: str, target: str) -> None:
    """MODIFY (widening), CHANGE, RENAME COLUMN, ADD/DROP INDEX, CREATE/DROP INDEX and TRUNCATE go through the
    barrier to the target; a statement Tidewater cannot translate (a generated column added) fails the changefeed
    with CDC:ErrDdlRejected naming it, and is skipped knowingly with --skip-ddl-ts after the operator applied it to
    the target by hand; every phase ends in a row-by-row compare."""
    import re

    db = mariadb_database
    mariadb_server.execute("CREATE TABLE d (id INT PRIMARY KEY, v VARCHAR(10), n INT, k INT) DEFAULT CHARSET utf8mb4",
                           db=db)
    mariadb_server.execute("CREATE TABLE tr (id INT PRIMARY KEY, note TEXT)", db=db)
    cdc_server.create_changefeed("mddl", mariadb_server.uri(db), target, snapshot="none")
    conn = mariadb_server.connect(db)
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO d VALUES (%s, %s, %s, %s)", [(i, f"v{i}", i * 10, i % 3) for i in range(20)])
        cur.executemany("INSERT INTO tr VALUES (%s, %s)", [(i, f"old {i}") for i in range(10)])
        cur.execute("ALTER TABLE d MODIFY COLUMN n BIGINT, CHANGE v w VARCHAR(40), RENAME COLUMN k TO kk")
        cur.execute("INSERT INTO d VALUES (100, 'a longer value than ten', 9223372036854775807, 5)")
        cur.execute("UPDATE d SET n = n * 1000000000 WHERE id < 5")
        cur.execute("ALTER TABLE d ADD INDEX by_w (w), ADD UNIQUE KEY u_n (n)")
        cur.execute("CREATE INDEX by_kk ON d (kk)")
        cur.execute("DROP INDEX by_kk ON d")
        cur.execute("ALTER TABLE d DROP INDEX by_w")
        cur.execute("TRUNCATE TABLE tr")
        cur.executemany("INSERT INTO tr VALUES (%s, %s)", [(i, f"new {i}") for i in range(5, 8)])
    info = cdc_server.wait_checkpoint("mddl", binlog_end(mariadb_server), timeout=120)
    assert not info.get("error") and info["state"] == "normal", (info.get("error") or {}).get("message")
    diffs = compare_mysql_tables(conn, [f"{db}.d", f"{db}.tr"], target)
    assert all(x.equal for x in diffs) and [x.source_rows for x in diffs] == [21, 3], diffs
    # a statement that cannot be translated: failed loudly, at its commit Ts
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE d ADD COLUMN g BIGINT AS (id * 2) STORED")
        cur.execute("INSERT INTO d (id, w, n, kk) VALUES (200, 'after', 2, 2)")
    q = wait_for(cdc_server, "mddl", lambda q: q["state"] == "failed", "state failed", timeout=90)
    assert q["error"]["code"] == "CDC:ErrDdlRejected", q["error"]
    assert "ADD COLUMN g" in q["error"]["message"] and f"{db}.d" in q["error"]["message"], q["error"]
    ts = int(re.search(r"--skip-ddl-ts (\d+)", q["error"]["message"]).group(1))  # type: ignore[union-attr]
    assert target_rows(target, f"SELECT COUNT(*) FROM {_target_table(target, db, 'd')} WHERE id = 200") == [(0,)]
    # the operator applies it downstream by hand (a plain column: the target never computes it), then skips it
    run_on_target(target, f"ALTER TABLE {_target_table(target, db, 'd')} ADD COLUMN g BIGINT")
    run_on_target(target, f"UPDATE {_target_table(target, db, 'd')} SET g = id * 2")
    cdc_server.request("PUT", "/api/v2/changefeeds/mddl", {"skip_ddl_ts": ts})
    cdc_server.request("POST", "/api/v2/changefeeds/mddl/resume")
    with conn.cursor() as cur:
        cur.execute("UPDATE d SET n = n + 1 WHERE id % 4 = 0 AND id < 100")
    info = cdc_server.wait_checkpoint("mddl", binlog_end(mariadb_server), timeout=120)
    shown = [*info.get("warnings", []), *([info["error"]] if info.get("error") else [])]
    assert all(w["code"] in ("CDC:NoticeDdlSkipped", "CDC:WarnDdlSkipped") for w in shown), shown
    assert any(str(ts) in w["message"] for w in shown), shown  # the skip stays visible in the state
    try:
        diffs = compare_mysql_tables(conn, [f"{db}.d", f"{db}.tr"], target)
    finally:
        conn.close()
    assert all(x.equal for x in diffs) and diffs[0].source_rows == 22, diffs


def _target_table(target: str, db: str, table: str) -> str:
    return f'"{db}".{table}' if target.startswith("postgresql") else table
