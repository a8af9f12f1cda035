"""End to end: the initial copy from MariaDB (issue 23 item 5). Existing rows are copied by the Spark job the capture
launches while the application keeps writing, each reader under its own consistent snapshot at a known binlog
position; then the span streams from its start with each table's floor and ceiling. Into SQLite, PostgreSQL and
MariaDB, and with the capture SIGKILLed mid-copy (the copy goes on chunk by chunk); every run ends in a row-by-row
compare with the upstream."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import FAST_LEASE, run_on_target, server_config, wait_for
from test_mysql_upstream_e2e import SCHEMA, TABLES, binlog_end, target  # noqa: F401 - target: a fixture

from cdc.events import TableName
from cdc.meta.etcd import EtcdClient
from cdc.meta.snapshot_progress import SnapshotProgressStore
from cdc.meta.store import MetaStore
from playground.cluster import CdcServer
from playground.compare import compare_mysql_tables
from playground.servers import MariaDBServer

pytestmark = pytest.mark.e2e

ROWS = 12000


def preload(server: MariaDBServer, db: str) -> None:
    """ROWS accounts (ids 0.., which the writers update and delete too) and a few items, before the changefeed."""
    server.execute(
        f"INSERT INTO accounts SELECT seq, CONCAT('owner ', seq), seq / 100, '2024-01-02 03:04:05.123456', "
        f"IF(seq % 3 = 0, '2025-06-01 10:00:00.250', NULL), IF(seq % 5 = 0, '', CONCAT('note ', seq)), "
        f"IF(seq % 2 = 1, x'00ff', NULL), 18446744073709551615 - seq, IF(seq % 7 = 0, NULL, '2020-02-02'), seq / 7 "
        f"FROM seq_0_to_{ROWS - 1}", db=db)
    server.execute("INSERT INTO items SELECT CONCAT('pre-', seq), seq, NULL FROM seq_0_to_299", db=db)


def read_positions(etcd: Any, cluster_id: str, cf: str) -> tuple[list[int], list[int], dict[str, int]]:
    """The span's exports' Ts, the Ts the chunks of accounts were read at, and the floors."""
    client = EtcdClient([etcd.url])
    try:
        status = MetaStore(client, cluster_id).get_span_status(cf, 0)
        assert status is not None and status.value.snapshot is not None, status
        state = status.value.snapshot
        done = SnapshotProgressStore(client, cluster_id).done_chunks(cf, 0, TableName.parse(state_table(state)))
        return [ts for _, ts in state.exports], [d.commit_ts for d in done.values()], dict(state.floors)
    finally:
        client.close()


def state_table(state: Any) -> str:
    [name] = [t for t in state.floors if t.endswith(".accounts")]
    return str(name)


def churn(conn: Any, txns: int, seed: int, pause: float, *, base: int = ROWS, move_on: bool = False) -> None:
    """Transactions over the preloaded rows while they are copied: updates (also of the key), deletes and inserts
    spread over every chunk, and upserts of items. New keys are ``base + t``, a moved row goes to ``base + ROWS + t``
    (far away: another chunk), so that several runs with their own ``base`` do not collide; with ``move_on`` the row
    the previous transaction moved moves on again (a key a row moved into and out of: a replay over a later chunk
    must go one transaction at a time there, docs/snapshot.md condition 1)."""
    rnd = random.Random(seed)
    try:
        with conn.cursor() as cur:
            for t in range(txns):
                cur.execute("BEGIN")
                for _ in range(3):
                    cur.execute("UPDATE accounts SET balance = balance + 1.25, note = CONCAT(IFNULL(note, ''), 'u'), "
                                "seen = NOW(3) WHERE id = %s", (rnd.randrange(ROWS),))
                cur.execute("DELETE FROM accounts WHERE id = %s", (rnd.randrange(ROWS),))
                cur.execute("UPDATE IGNORE accounts SET id = %s WHERE id = %s", (base + ROWS + t, rnd.randrange(ROWS)))
                if move_on:
                    cur.execute("UPDATE IGNORE accounts SET id = id + 1000000 WHERE id = %s", (base + ROWS + t - 1,))
                cur.execute("INSERT INTO accounts (id, owner, balance) VALUES (%s, %s, %s)", (base + t, f"new {t}", t / 4))
                cur.execute("INSERT INTO items VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE qty = qty + 1",
                            (f"sku-{t % 13}", t, bytes([t % 256])))
                cur.execute("COMMIT")
                time.sleep(pause)
    finally:
        conn.close()


def converged(cdc: CdcServer, cf: str, server: MariaDBServer, db: str, sink: str) -> None:
    info = cdc.wait_checkpoint(cf, binlog_end(server), timeout=240)
    conn = server.connect(db)
    try:
        diffs = compare_mysql_tables(conn, [f"{db}.{t}" for t in TABLES], sink)
    finally:
        conn.close()
    bad = [d for d in diffs if not d.equal]
    assert not bad, f"downstream differs from upstream: {bad}\n{cdc.log_tail()}"
    assert diffs[0].source_rows > ROWS // 2, diffs
    assert info["state"] == "normal" and not info.get("error"), info


def test_the_initial_copy_under_writes_ends_equal_in_each_target(
        etcd_server: Any, cluster_id: str, tmp_path: Path, mariadb_server: MariaDBServer, mariadb_database: str,
        target: str) -> None:  # noqa: F811 - the fixture
    db = mariadb_database
    for stmt in SCHEMA:
        mariadb_server.execute(stmt, db=db)
    preload(mariadb_server, db)
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, FAST_LEASE)).start()
    try:
        writer = threading.Thread(target=churn, args=(mariadb_server.connect(db), 600, 5, 0.01))
        writer.start()
        time.sleep(0.3)
        cdc.create_changefeed("cp", mariadb_server.uri(db), target,  # (through Spark: spark-min-rows = 0)
                              "[snapshot]\nchunk-rows = 1000\nspark-min-rows = 0\nspark-master = \"local[2]\"\n")
        q = wait_for(cdc, "cp", lambda q: q.get("phase") == "streaming" or q["state"] not in ("normal",),
                     "the copy", timeout=300)
        assert q["state"] == "normal", q
        snap = q["snapshot"]
        assert snap["chunks_done"] == snap["chunks_total"] >= ROWS // 1000, snap
        writer.join()
        converged(cdc, "cp", mariadb_server, db, target)
        # each reader's snapshot stood at its own binlog position, at or after the export, under the writes: the
        # chunks read later than the floor (the hand-off replays from the floor) are what this test is about
        exports, read_at, floors = read_positions(etcd_server, cluster_id, "cp")
        assert len(exports) == 1 and all(ts >= exports[0] for ts in read_at), (exports, read_at)
        assert max(read_at) > exports[0] == floors[f"{db}.accounts"], (exports, read_at, floors)
        # the compare sees a one-cent difference (it is not a test that cannot fail)
        table = f'"{db}".accounts' if target.startswith("postgresql") else "accounts"
        run_on_target(target, f"UPDATE {table} SET balance = balance + 0.01 WHERE id = 77")
        conn = mariadb_server.connect(db)
        try:
            [acc, _] = compare_mysql_tables(conn, [f"{db}.{t}" for t in TABLES], target)
        finally:
            conn.close()
        assert not acc.equal and len(acc.different) == 1, acc
    finally:
        cdc.terminate()


@pytest.mark.kills
def test_a_capture_killed_mid_copy_goes_on_chunk_by_chunk_and_ends_equal(
        etcd_server: Any, cluster_id: str, tmp_path: Path, mariadb_server: MariaDBServer,
        mariadb_database: str) -> None:
    """SQLite takes one chunk at a time, slowed down by a trigger, so the kill lands with accounts half copied; the
    capture started again copies only the chunks not recorded (none redone: every MySQL change carries whole rows),
    under new snapshots at later binlog positions, while the writers go on."""
    db = mariadb_database
    for stmt in SCHEMA:
        mariadb_server.execute(stmt, db=db)
    preload(mariadb_server, db)
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    import sqlite3

    conn = sqlite3.connect(tmp_path / "target.db")
    conn.executescript(  # SQLite has no sleep: each row counts to 2,000 (~0.3 ms)
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, balance TEXT, opened DATETIME, "
        "seen DATETIME, note TEXT, data BLOB, big TEXT, day DATE, rate REAL);"  # (what the copy creates, and a trigger)
        "CREATE TRIGGER slow_down BEFORE INSERT ON accounts BEGIN SELECT count(*) FROM (WITH RECURSIVE c(x) AS "
        "(SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000) SELECT x FROM c); END;")
    conn.close()
    config = server_config(tmp_path, FAST_LEASE)
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, extra_args=config).start()
    writer = threading.Thread(target=churn, args=(mariadb_server.connect(db), 800, 6, 0.01))
    writer.start()
    try:
        cdc.create_changefeed("ck", mariadb_server.uri(db), sink,
                              "[snapshot]\nchunk-rows = 1000\nspark-min-rows = 100000000\n")

        def half(q: dict[str, Any]) -> bool:
            acc = [t for t in q["snapshot"]["tables"] if t["table"].endswith(".accounts")]
            return bool(acc) and 0 < acc[0]["chunks_done"] < acc[0]["chunks_total"] // 2
        before = wait_for(cdc, "ck", half, "accounts half copied", timeout=180)
        cdc.kill()
        done_before = [t for t in before["snapshot"]["tables"] if t["table"].endswith(".accounts")][0]["chunks_done"]
        time.sleep(1.0)  # writes between the two runs
        cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id, port=cdc.port,
                        extra_args=config).start()
        q = wait_for(cdc, "ck", lambda q: q.get("phase") == "streaming" or q["state"] != "normal", "the copy",
                     timeout=300)
        assert q["state"] == "normal", q
        writer.join()
        converged(cdc, "ck", mariadb_server, db, sink)
        q = wait_for(cdc, "ck", lambda q: True, "query")
        [acc] = [t for t in q["snapshot"]["tables"] if t["table"].endswith(".accounts")]
        assert acc["chunks_done"] == acc["chunks_total"] and done_before > 0, (done_before, acc)
        assert acc["rows_redone"] == 0, acc  # resumed per chunk, not copied again whole
        exports, read_at, floors = read_positions(etcd_server, cluster_id, "ck")
        assert len(exports) >= 2 and floors[f"{db}.accounts"] == exports[0], (exports, floors)
        assert len(read_at) == acc["chunks_total"] and max(read_at) > exports[1], (exports, read_at)
    finally:
        writer.join()
        cdc.terminate()


def test_a_resync_replaces_a_diverged_table_while_writes_go_on(
        etcd_server: Any, cluster_id: str, tmp_path: Path, mariadb_server: MariaDBServer,
        mariadb_database: str) -> None:
    """``changefeed snapshot --table`` (the API's resync) of a MySQL changefeed: the target's accounts, changed behind
    Tidewater's back, is emptied and copied again under writes, and ends equal."""
    db = mariadb_database
    for stmt in SCHEMA:
        mariadb_server.execute(stmt, db=db)
    preload(mariadb_server, db)
    sink = f"sqlite:///{tmp_path / 'target.db'}"
    cdc = CdcServer(etcd_server.url, tmp_path / "cdc", cluster_id=cluster_id,
                    extra_args=server_config(tmp_path, FAST_LEASE)).start()
    try:
        cdc.create_changefeed("rs", mariadb_server.uri(db), sink, "[snapshot]\nchunk-rows = 2000\n")
        converged(cdc, "rs", mariadb_server, db, sink)
        run_on_target(sink, "DELETE FROM accounts WHERE id % 7 = 0")
        run_on_target(sink, "UPDATE accounts SET owner = 'wrong' WHERE id % 11 = 0")
        run_on_target(sink, "INSERT INTO accounts (id, owner) VALUES (-1, 'extra')")
        writer = threading.Thread(target=churn, args=(mariadb_server.connect(db), 400, 7, 0.01))
        writer.start()
        try:
            cdc.request("POST", "/api/v2/changefeeds/rs/snapshot", {"tables": [f"{db}.accounts"]})
            wait_for(cdc, "rs", lambda q: any(s["table_copy"] for s in q["spans"]), "the table copy taken up")
            q = wait_for(cdc, "rs", lambda q: all((s["table_copy"] or {}).get("phase") == "done" for s in q["spans"]
                                                   if s["table_copy"]) or q["state"] != "normal",
                         "the table copy", timeout=180)
            assert q["state"] == "normal", q
        finally:
            writer.join()
        converged(cdc, "rs", mariadb_server, db, sink)
        q = wait_for(cdc, "rs", lambda q: True, "query")
        assert q["state"] == "normal" and not q["warnings"] and q["table_copies"] == [], q
    finally:
        cdc.terminate()
