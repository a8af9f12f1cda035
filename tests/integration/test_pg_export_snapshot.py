"""``Upstream.export_snapshot`` on PostgreSQL 18: a temporary slot's exported snapshot, importable while the block
runs, holding exactly the commits at or below its Ts; the slot is gone when the block ends, and when the process
holding it dies (SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg2
import pytest

from playground.servers import PostgresServer
from upstream import open_upstream

pytestmark = pytest.mark.integration


def _slots(pg_server: PostgresServer, db: str) -> list[str]:
    rows = pg_server.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'tidewater_snap_%'",
                             db=db)
    return [r[0] for r in rows or []]


def _seen(pg_server: PostgresServer, db: str, snapshot: str) -> list[int]:
    conn = psycopg2.connect(pg_server.dsn(db))
    try:
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
            cur.execute("SELECT id FROM t ORDER BY id")
            return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()


def test_the_snapshot_holds_the_commits_at_or_below_its_ts_and_the_slot_goes_with_the_block(
        pg_server: PostgresServer, pg_database: str) -> None:
    db = pg_database
    pg_server.execute("CREATE TABLE t (id int PRIMARY KEY)", db=db)
    pg_server.execute("INSERT INTO t VALUES (1)", db=db)
    before: Any = pg_server.execute("SELECT pg_current_wal_insert_lsn()::text", db=db)
    with open_upstream(pg_server.uri(db)) as up, up.export_snapshot(label="t") as exp:
        pg_server.execute("INSERT INTO t VALUES (2)", db=db)
        after: Any = pg_server.execute("SELECT pg_current_wal_insert_lsn()::text", db=db)
        assert _seen(pg_server, db, exp.name) == [1]
        assert _slots(pg_server, db) != []
        hi, lo = (int(x, 16) for x in before[0][0].split("/"))
        assert exp.ts >= (hi << 32 | lo)  # the commit of row 1 is at or below it
        hi, lo = (int(x, 16) for x in after[0][0].split("/"))
        assert exp.ts < (hi << 32 | lo)  # row 2 committed above it
        assert exp.time > 0
    assert _slots(pg_server, db) == []
    with pytest.raises(psycopg2.Error, match="does not exist|invalid snapshot"):
        _seen(pg_server, db, exp.name)


def test_the_temporary_slot_dies_with_the_process_holding_it(pg_server: PostgresServer, pg_database: str) -> None:
    code = ("import sys, time\nsys.path.insert(0, '.')\nfrom upstream import open_upstream\n"
            f"with open_upstream({pg_server.uri(pg_database)!r}).export_snapshot() as e:\n"
            "    print(e.name, flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip()
        assert len(_slots(pg_server, pg_database)) == 1
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while _slots(pg_server, pg_database) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _slots(pg_server, pg_database) == []
