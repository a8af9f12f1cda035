"""End to end: sessions that write with ``binlog_row_image`` MINIMAL or NOBLOB (the server's global setting is FULL,
checked at create) into SQLite and MariaDB targets. Their partial row images are never applied as full rows: the
target ends row-by-row equal to the upstream, and the changefeed shows a notice naming the table and keys."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from e2e_workload import wait_for
from test_mysql_upstream_e2e import binlog_end

from playground.cluster import CdcServer
from playground.compare import compare_mysql_tables
from playground.servers import MariaDBServer

pytestmark = pytest.mark.e2e


@pytest.fixture(params=["sqlite", "mariadb", "mariadb-2-workers"])
def partial_target(request: pytest.FixtureRequest, tmp_path: Path, mariadb_server: MariaDBServer
                   ) -> tuple[str, str]:
    """A target and the changefeed's config (``[sink] worker-count = 2``: the parallel apply)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'target.db'}", ""
    db = f"target_{uuid.uuid4().hex[:10]}"
    mariadb_server.create_database(db)
    return mariadb_server.uri(db), "[sink]\nworker-count = 2\n" if request.param.endswith("workers") else ""


def partial_writes(conn: Any, image: str, seed: int, base: int) -> None:
    """Inserts listing some columns (the rest take defaults), updates of single columns, key changes and deletes,
    in a session whose row image is ``image``."""
    rnd = random.Random(seed)
    with conn.cursor() as cur:
        cur.execute(f"SET SESSION binlog_row_image = {image}")
        for t in range(20):
            cur.execute("BEGIN")
            i = base + t
            cur.execute("INSERT INTO p (id, a) VALUES (%s, %s)", (i, rnd.randint(0, 99)))
            cur.execute("INSERT INTO p (id, b, blob_col) VALUES (%s, %s, %s)", (i + 1000, f"b{i}", bytes([t, 0, 1])))
            cur.execute("UPDATE p SET a = a + 1 WHERE id %% 3 = %s", (t % 3,))
            cur.execute("UPDATE p SET b = CONCAT(IFNULL(b, ''), '+') WHERE id = %s", (base + rnd.randint(0, t),))
            if t % 4 == 1:
                cur.execute("UPDATE p SET id = id + 5000 WHERE id = %s", (i + 1000,))  # a key change
            if t % 5 == 2:
                cur.execute("DELETE FROM p WHERE id = %s", (base + t - 1,))
            cur.execute("INSERT INTO q (code, n) VALUES (%s, %s) ON DUPLICATE KEY UPDATE n = n + 1",
                        (f"c{t % 7}", t))
            cur.execute("COMMIT")


def test_partial_row_images_are_never_applied_as_full_rows(
        cdc_server: CdcServer, mariadb_server: MariaDBServer, mariadb_database: str,
        partial_target: tuple[str, str]) -> None:
    db = mariadb_database
    target, config = partial_target
    mariadb_server.execute("CREATE TABLE p (id INT PRIMARY KEY, a INT DEFAULT 42, b VARCHAR(40), c INT DEFAULT 7, "
                           "blob_col BLOB, d DATETIME(3) DEFAULT '2020-01-01 00:00:00.5') DEFAULT CHARSET utf8mb4",
                           db=db)
    mariadb_server.execute("CREATE TABLE q (code VARCHAR(10) NOT NULL, n INT, note TEXT, UNIQUE KEY (code))", db=db)
    cdc_server.create_changefeed("pi", mariadb_server.uri(db), target, config, snapshot="none")
    conn = mariadb_server.connect(db)
    try:
        partial_writes(conn, "FULL", 1, 0)
        partial_writes(conn, "MINIMAL", 2, 100)
        partial_writes(conn, "NOBLOB", 3, 200)
        with conn.cursor() as cur:  # partial updates of rows the target got as full rows before
            cur.execute("SET SESSION binlog_row_image = MINIMAL")
            cur.execute("UPDATE p SET c = c * 2 WHERE id < 20")
            cur.execute("UPDATE q SET note = 'minimal'")
    finally:
        conn.close()
    info = cdc_server.wait_checkpoint("pi", binlog_end(mariadb_server), timeout=180)
    assert not info.get("error"), info
    conn = mariadb_server.connect(db)
    try:
        diffs = compare_mysql_tables(conn, [f"{db}.p", f"{db}.q"], target)
    finally:
        conn.close()
    assert all(d.equal for d in diffs), f"{diffs}\n{cdc_server.log_tail(60)}"
    assert diffs[0].source_rows > 40 and diffs[1].source_rows == 7, diffs
    q = wait_for(cdc_server, "pi", lambda q: {w["table"] for w in q["warnings"]} >= {f"{db}.p", f"{db}.q"},
                 "the partial-image notices")
    notices = [w for w in q["warnings"] if w["code"] == "CDC:WarnPartialRowImage"]
    assert {w["table"] for w in notices} == {f"{db}.p", f"{db}.q"}, q["warnings"]
    assert all(w["severity"] == "notice" and w["keys"] and "binlog_row_image" in w["message"] for w in notices)
    assert q["state"] == "normal", q
    assert q["consistency"]["apply_workers"] == (2 if config else 1), q["consistency"]  # (the parallel apply)
