"""End to end with several spans: MariaDB -> `cdc server` (real etcd, LevelDB sorter) with span-count = 3 -> a
PostgreSQL and a MariaDB target. Transactions touch tables of two or three spans at once; the capture is SIGKILLed
mid-stream; an ALTER TABLE and a CREATE TABLE (of a table another span carries than the altered one's) land while
the writer runs, and so does one DROP TABLE of two spans' tables; a table is renamed from one span's name onto another's (refused by both spans at its position,
renamed downstream by the operator, skipped); every phase ends in a row-by-row compare of every table, so a row that
no span carried (or two did) shows as a difference. Also: the initial copy with two spans, and two spans moved to a
promoted replica, each from its own GTID token."""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import FAST_LEASE, make_sink_uri, run_on_target, server_config, wait_for
from test_mysql_failover import DB, assert_same, cli, pair  # noqa: F401 - pair: a fixture
from test_mysql_upstream_e2e import binlog_end, mixed, target_rows

from cdc.events import TableName
from cdc.spans import span_of
from playground.cluster import CdcServer
from playground.compare import compare_mysql_tables
from playground.servers import MariaDBServer, PostgresServer
from upstream.mysql.positions import epoch_of
from upstream.mysql.resume import ResumePoint

pytestmark = pytest.mark.e2e

SPANS = 3
COLUMNS = "(id INT PRIMARY KEY, v VARCHAR(40), n BIGINT, d DECIMAL(12,2), at DATETIME(6)) DEFAULT CHARSET utf8mb4"


def names_for(db: str, span: int, how_many: int, prefix: str, spans: int = SPANS) -> list[str]:
    """``how_many`` table names of ``db`` the span-set rule gives to ``span`` of ``spans``."""
    return [n for n in (f"{prefix}{i}" for i in range(500)) if span_of(TableName(db, n), spans) == span][:how_many]


def cross_span(conn: Any, tables: list[str], txns: int, seed: int, start: int, pause: float = 0.0) -> None:
    """Transactions each inserting into, updating and deleting from two or three of ``tables`` (several spans)."""
    rnd = random.Random(seed)
    with conn.cursor() as cur:
        for t in range(start, start + txns):
            cur.execute("BEGIN")
            for table in rnd.sample(tables, rnd.choice((2, 3))):
                for i in (t * 3, t * 3 + 1):
                    cur.execute(f"INSERT INTO {table} (id, v, n, d, at) VALUES (%s, %s, %s, %s, %s) "
                                f"ON DUPLICATE KEY UPDATE n = n + 1, v = VALUES(v)",
                                (i, f"{table} {i} ü", rnd.randrange(-2**40, 2**40), round(rnd.uniform(-1e6, 1e6), 2),
                                 f"2025-01-02 03:04:05.{i % 1000000:06d}"))
                if t % 2:
                    cur.execute(f"UPDATE {table} SET d = d + 1.5, v = CONCAT(v, '!') WHERE id %% 7 = %s", (t % 7,))
                if t % 3 == 0:
                    cur.execute(f"DELETE FROM {table} WHERE id %% 11 = %s", (t % 11,))
            cur.execute("COMMIT")
            if pause:
                time.sleep(pause)


def target_table(target: str, db: str, table: str) -> str:
    return f'"{db}".{table}' if target.startswith("postgresql") else table


@pytest.fixture(params=["postgresql", "mariadb"])
def target(request: pytest.FixtureRequest, tmp_path: Path, pg_server: PostgresServer) -> str:
    return make_sink_uri(request.param, request, tmp_path, pg_server)


def assert_equal(server: MariaDBServer, db: str, tables: list[str], target: str, cdc: CdcServer) -> None:
    conn = server.connect(db)
    try:
        diffs = compare_mysql_tables(conn, [f"{db}.{t}" for t in tables], target)
    finally:
        conn.close()
    bad = [d for d in diffs if not d.equal]
    assert not bad, f"downstream differs from upstream: {bad}\n{cdc.log_tail(80)}"
    assert all(d.source_rows > 0 for d in diffs), diffs


def test_three_spans_split_cross_span_transactions_survive_a_sigkill_ddl_and_a_rename(
        etcd_server: Any, cluster_id: str, tmp_path: Path, mariadb_server: MariaDBServer, mariadb_database: str,
        target: str) -> None:
    db = mariadb_database
    tables = [n for s in range(SPANS) for n in names_for(db, s, 2, "acct")]  # two tables in each span
    old, new = names_for(db, 0, 1, "old")[0], names_for(db, 2, 1, "new")[0]  # renamed from span 0 onto span 2
    created = names_for(db, 1, 1, "late")[0]  # created while streaming, in span 1
    altered = tables[4]  # a table of span 2
    dropped = [names_for(db, 1, 1, "gone")[0], names_for(db, 0, 1, "gone")[0]]  # one DROP TABLE, two spans
    for t in [*tables, old, *dropped]:
        mariadb_server.execute(f"CREATE TABLE {t} {COLUMNS}", db=db)
    config = server_config(tmp_path, FAST_LEASE)
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=config).start()
    try:
        created_info = cdc.create_changefeed("ms", mariadb_server.uri(db), target, f"span-count = {SPANS}\n",
                                             snapshot="none")
        assert len(created_info["spans"]) == SPANS, created_info
        mariadb_server.execute(f"INSERT INTO {old} (id, v) VALUES (-1, 'before the rename')", db=db)
        cross_span(mariadb_server.connect(db), [*tables, old, *dropped], 20, seed=1, start=0)
        mariadb_server.execute(f"INSERT INTO {dropped[0]} (id) VALUES (-1)", db=db)
        mariadb_server.execute(f"INSERT INTO {dropped[1]} (id) VALUES (-1)", db=db)
        cdc.wait_checkpoint("ms", binlog_end(mariadb_server), timeout=120)
        for t in dropped:  # (so that their drop below is seen downstream)
            assert target_rows(target, f"SELECT COUNT(*) FROM {target_table(target, db, t)}") != [], t
        writer = threading.Thread(target=cross_span, args=(mariadb_server.connect(db), tables, 80, 2, 20, 0.02))
        writer.start()
        time.sleep(0.5)
        mariadb_server.execute(f"ALTER TABLE {altered} ADD COLUMN tier VARCHAR(10) DEFAULT 'basic'", db=db)
        mariadb_server.execute(f"CREATE TABLE {created} {COLUMNS}", db=db)
        mariadb_server.execute(f"INSERT INTO {created} (id, v) VALUES (1, 'first')", db=db)
        mariadb_server.execute(f"DROP TABLE {dropped[0]}, {dropped[1]}", db=db)
        time.sleep(0.5)
        cdc.kill()  # mid-stream: the writer goes on while no capture runs
        writer.join()
        cross_span(mariadb_server.connect(db), [*tables, created], 30, seed=3, start=100)
        mariadb_server.execute(f"UPDATE {altered} SET tier = 'gold' WHERE id % 2 = 0", db=db)
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                        extra_args=config).start()
        info = cdc.wait_checkpoint("ms", binlog_end(mariadb_server), timeout=240)
        assert info["state"] in ("normal", "warning") and not info.get("error"), info
        assert_equal(mariadb_server, db, [*tables, old, created], target, cdc)
        for t in dropped:  # dropped downstream too, by each span at its place in the statement
            assert target_rows(target, f"SELECT COUNT(*) FROM {target_table(target, db, t)}") == [], t

        # a rename across spans: refused at its position (both spans), renamed downstream, skipped
        [(before,)] = mariadb_server.execute(f"SELECT COUNT(*) FROM {old}", db=db) or []
        mariadb_server.execute(f"RENAME TABLE {old} TO {new}", db=db)
        mariadb_server.execute(f"INSERT INTO {new} (id, v) VALUES (-2, 'after the rename')", db=db)
        cross_span(mariadb_server.connect(db), [*tables, new], 10, seed=4, start=200)
        q = wait_for(cdc, "ms", lambda q: q["state"] == "failed", "the rename refused", timeout=120)
        assert q["error"]["code"] == "CDC:ErrDdlRejected" and "RENAME TABLE" in q["error"]["message"], q["error"]
        ts = int(re.search(r"--skip-ddl-ts (\d+)", q["error"]["message"]).group(1))  # type: ignore[union-attr]
        # the renamed table's rows after the rename were not written anywhere while it was refused
        assert target_rows(target, f"SELECT COUNT(*) FROM {target_table(target, db, old)}") == [(before,)]
        assert target_rows(target, f"SELECT COUNT(*) FROM {target_table(target, db, new)}") == []
        if target.startswith("postgresql"):
            run_on_target(target, f'ALTER TABLE "{db}".{old} RENAME TO {new}')
        else:
            run_on_target(target, f"RENAME TABLE {old} TO {new}")
        cdc.request("PUT", "/api/v2/changefeeds/ms", {"skip_ddl_ts": ts})
        cdc.request("POST", "/api/v2/changefeeds/ms/resume")
        cross_span(mariadb_server.connect(db), [*tables, new, created], 20, seed=5, start=300)
        info = cdc.wait_checkpoint("ms", binlog_end(mariadb_server), timeout=240)
        shown = [*info.get("warnings", []), *([info["error"]] if info.get("error") else [])]
        assert all(w["code"] in ("CDC:NoticeDdlSkipped", "CDC:WarnDdlSkipped") for w in shown), shown
        assert_equal(mariadb_server, db, [*tables, new, created], target, cdc)
        # the compare sees a difference (it is not a test that cannot fail)
        run_on_target(target, f"DELETE FROM {target_table(target, db, new)} WHERE id = (SELECT m FROM (SELECT "
                              f"MIN(id) AS m FROM {target_table(target, db, new)}) AS x)")
        with pytest.raises(AssertionError, match="differs"):
            assert_equal(mariadb_server, db, [new], target, cdc)
    finally:
        cdc.terminate()


def test_the_initial_copy_with_two_spans_under_cross_span_writes_ends_equal(
        etcd_server: Any, cluster_id: str, tmp_path: Path, mariadb_server: MariaDBServer, mariadb_database: str,
        pg_server: PostgresServer, request: pytest.FixtureRequest) -> None:
    """Each span copies its own tables through the Spark job (its own export and floors) while transactions touching
    both spans' tables go on; then each streams its own share from its floors. (One target: two Spark jobs per run on
    two shared cores; the copy into each SQL target is test_mysql_initial_copy's.)"""
    db = mariadb_database
    target = make_sink_uri("postgresql", request, tmp_path, pg_server)
    tables = [n for s in range(2) for n in names_for(db, s, 2, "pre", spans=2)]
    for t in tables:
        mariadb_server.execute(f"CREATE TABLE {t} {COLUMNS}", db=db)
        mariadb_server.execute(f"INSERT INTO {t} SELECT seq, CONCAT('pre ', seq), seq * 3, seq / 4, "
                               f"'2024-01-02 03:04:05.123456' FROM seq_0_to_2999", db=db)
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, FAST_LEASE)).start()
    try:
        writer = threading.Thread(target=cross_span, args=(mariadb_server.connect(db), tables, 300, 7, 0, 0.01))
        writer.start()
        time.sleep(0.3)
        created = cdc.create_changefeed("msc", mariadb_server.uri(db), target,
                                        "span-count = 2\n[snapshot]\nchunk-rows = 1000\nspark-min-rows = 0\n"
                                        "spark-master = \"local[2]\"\n")
        assert len(created["spans"]) == 2, created
        q = wait_for(cdc, "msc", lambda q: q.get("phase") == "streaming" or q["state"] != "normal", "the copy",
                     timeout=400)
        assert q["state"] == "normal", q
        writer.join()
        info = cdc.wait_checkpoint("msc", binlog_end(mariadb_server), timeout=240)
        assert info["state"] == "normal" and not info.get("error"), info
        assert_equal(mariadb_server, db, tables, target, cdc)
    finally:
        cdc.terminate()


def test_two_spans_move_to_a_promoted_replica_each_from_its_own_gtid_token(
        etcd_server: Any, cluster_id: str, tmp_path: Path, pair: tuple[MariaDBServer, MariaDBServer],  # noqa: F811
        pg_server: PostgresServer, request: pytest.FixtureRequest) -> None:
    """accounts and items are in different spans of two (cdc.spans.span_of), and every transaction of mixed() writes
    both: each span stores its own token, and each continues on the promoted replica from it."""
    primary, replica = pair
    assert [span_of(TableName(DB, t), 2) for t in ("accounts", "items")] == [0, 1]
    target = make_sink_uri("postgresql", request, tmp_path, pg_server)
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, FAST_LEASE)).start()
    try:
        cdc.create_changefeed("fo2", primary.uri(DB), target, "span-count = 2\n", snapshot="none")
        mixed(primary.connect(DB), 30, seed=1)
        cdc.wait_checkpoint("fo2", binlog_end(primary, 0), timeout=180)
        assert_same(primary, target, cdc)
        rc, out, err = cli(cdc, "changefeed", "pause", "-c", "fo2")
        assert rc == 0 and out["state"] == "stopped", (out, err)
        wait_for(cdc, "fo2", lambda q: not any(s["running"] for s in q["spans"]), "the spans stopped")
        mixed(primary.connect(DB), 15, seed=3, start=30)  # after the checkpoint: only in the binlogs
        replica.catch_up(primary)
        primary.kill()
        replica.promote()
        rc, out, err = cli(cdc, "changefeed", "update", "-c", "fo2", "--upstream", replica.uri(DB))
        assert rc == 0, (out, err)
        rc, out, err = cli(cdc, "changefeed", "resume", "-c", "fo2")
        assert rc == 0, (out, err)
        mixed(replica.connect(DB), 20, seed=4, start=45)
        info = cdc.wait_checkpoint("fo2", binlog_end(replica, 1), timeout=180)
        assert info["state"] == "normal" and not info.get("error"), info
        assert epoch_of(info["checkpoint_ts"]) == 1, info
        tokens = [ResumePoint.decode(s["resume_token"]) for s in info["spans"]]
        assert len(tokens) == 2 and all((t.server_id, t.epoch) == (2, 1) for t in tokens), info["spans"]
        assert_same(replica, target, cdc)
    finally:
        cdc.terminate()
