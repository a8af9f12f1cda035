"""`make demo UPSTREAM=mariadb` (``python -m playground.demo --upstream mariadb``): the demo's run with a MariaDB
upstream (issue 23 item 8).

The upstream is a MariaDB with a row binlog (``playground.servers.MariaDBServer``: ``binlog_format=ROW``,
``binlog_row_image=FULL``, ``binlog_row_metadata=FULL``), database ``shop``. The changefeed is created with
``--snapshot none`` (the initial copy from MySQL/MariaDB is not built yet: docs/upstream-mysql.md), so the demo starts
from an empty database and everything it shows is streamed from the binlog: a workload of inserts, updates and
deletes, a rolled-back savepoint, a table the filter excludes, one big transaction of ``--big-rows`` rows and a big
rolled-back one; then it waits for the checkpoint to reach the binlog end and compares every table with the target
row by row. The SQL targets only (sqlite, mariadb, postgresql): Kafka and storage sinks with a MySQL upstream are not
tested yet (docs/upstreams.md).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from playground.cluster import CdcServer
from playground.demo_targets import DemoTarget, SqlTarget
from playground.servers import MariaDBServer
from upstream.mysql.positions import to_ts

SQL_SINKS = ("sqlite", "mariadb", "postgresql")
TABLES = ["shop.customers", "shop.orders", "shop.audit_log"]

SCHEMA = [
    """CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(80) NOT NULL, email VARCHAR(120),
       balance DECIMAL(12,2), active TINYINT, created DATETIME(6), profile JSON, tags TEXT) DEFAULT CHARSET utf8mb4""",
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id INT, amount DECIMAL(10,2), note TEXT, placed DATE)",
    "CREATE TABLE audit_log (id INT AUTO_INCREMENT PRIMARY KEY, event TEXT, payload BLOB)",
    "CREATE TABLE tmp_scratch (id INT PRIMARY KEY, v TEXT)",
]

CONFIG = """
[filter]
rules = ['shop.*', '!shop.tmp_*']
"""


def binlog_end(server: MariaDBServer) -> int:
    """The Ts of the server's binlog end: the checkpoint reaches it once every commit so far is downstream."""
    [(log_file, pos, *_)] = server.execute("SHOW MASTER STATUS") or []
    return to_ts(str(log_file), int(pos))


def _workload(up: MariaDBServer, big_rows: int, txns: int, counts: dict[str, Any]) -> None:
    conn = up.connect("shop")
    cur = conn.cursor()
    rnd = random.Random(42)
    order_id = 0
    try:
        for t in range(txns):
            cur.execute("BEGIN")
            base = t * 10
            for i in range(base, base + 10):
                cur.execute("INSERT INTO customers VALUES (%s, %s, %s, %s, %s, NOW(6), %s, %s)",
                            (i, f"customer {i} ü", f"c{i}@example.com", rnd.randint(0, 10**6) / 100, i % 2,
                             f'{{"tier": {i % 3}, "name": "c{i}"}}', f"t{i % 5},x"))
                order_id += 1
                cur.execute("INSERT INTO orders VALUES (%s, %s, %s, %s, CURDATE())",
                            (order_id, i, rnd.randint(100, 99999) / 100, f"order {order_id}"))
            if t % 3 == 0:
                cur.execute("UPDATE customers SET balance = balance + 1, active = 1 - active "
                            "WHERE id BETWEEN %s AND %s", (base - 30, base - 25))
            if t % 7 == 0:
                cur.execute("DELETE FROM orders ORDER BY id LIMIT 3")
            if t % 11 == 0:
                cur.execute("SAVEPOINT s1")
                cur.execute("INSERT INTO customers (id, name) VALUES (%s, 'rolled back')", (10**7 + t,))
                cur.execute("ROLLBACK TO SAVEPOINT s1")
            cur.execute("INSERT INTO audit_log (event, payload) VALUES (%s, %s)", (f"txn {t}", bytes([t % 256]) * 8))
            cur.execute("INSERT INTO tmp_scratch VALUES (%s, 'not replicated')", (t,))
            cur.execute("COMMIT")
            counts["txns"] += 1
        cur.execute("BEGIN")  # one big transaction
        cur.execute(f"INSERT INTO orders SELECT seq, seq MOD 1000, (seq MOD 10000) / 100, REPEAT('x', 50), CURDATE() "
                    f"FROM seq_{order_id + 1}_to_{order_id + big_rows}")
        cur.execute("UPDATE customers SET name = CONCAT(name, ' (big txn)') WHERE id MOD 10 = 0")
        cur.execute("COMMIT")
        counts["txns"] += 1
        cur.execute("BEGIN")  # a big one rolled back: must leave no trace
        cur.execute("INSERT INTO orders SELECT seq, 0, 0, 'aborted', CURDATE() FROM seq_1000000000_to_1000020000")
        cur.execute("ROLLBACK")
    finally:
        conn.close()


def workload(up: MariaDBServer, big_rows: int, txns: int, done: threading.Event, counts: dict[str, Any]) -> None:
    try:
        _workload(up, big_rows, txns, counts)
    except Exception as exc:  # noqa: BLE001 - reported by the main thread
        counts["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        done.set()


def prepare(up: MariaDBServer) -> None:
    up.create_database("shop")
    for stmt in SCHEMA:
        up.execute(stmt, db="shop")


def run(args: Any, target: DemoTarget, sink: str, up: MariaDBServer, cdc: CdcServer,
        say: Callable[[str], None]) -> bool:
    """Create the changefeed (``--snapshot none``), run the workload, wait for the checkpoint to reach the binlog
    end, compare row by row: True when identical."""
    assert isinstance(target, SqlTarget)
    t0 = time.time()
    info = cdc.create_changefeed("demo", up.uri("shop"), sink, CONFIG, snapshot="none")
    say(f"changefeed 'demo' created: {info['state']}, sink {sink} (MariaDB upstream: --snapshot none, the "
        "initial copy from MySQL/MariaDB is not built yet)")
    done = threading.Event()
    counts: dict[str, Any] = {"txns": 0}
    wl = threading.Thread(target=workload, args=(up, args.big_rows, args.txns, done, counts), daemon=True)
    wl_start = time.time()
    wl.start()
    while not done.wait(1):
        q = cdc.changefeed("demo")
        rows = sum(s["rows"] for s in q["spans"])
        say(f"upstream txns {counts['txns']:>4}  rows replicated {rows:>8}  checkpoint {q['checkpoint']:>12}  "
            f"lag {q['checkpoint_lag']}s  state {q['state']}")
    wl.join()
    if "error" in counts:
        say(f"workload failed: {counts['error']}")
        return False
    target_ts = binlog_end(up)
    say(f"workload done in {time.time() - wl_start:.1f}s; waiting for checkpoint >= "
        f"{target_ts >> 32:X}/{target_ts & 0xFFFFFFFF:X} (binlog file sequence / position)")
    while True:
        q = cdc.changefeed("demo")
        rows = sum(s["rows"] for s in q["spans"])
        if q["checkpoint_ts"] >= target_ts:
            break
        if q["state"] == "failed":
            say(f"changefeed failed: {q['error']}")
            return False
        say(f"rows replicated {rows:>8}  checkpoint {q['checkpoint']:>12}  lag {q['checkpoint_lag']}s  "
            f"state {q['state']}")
        time.sleep(1)
    say(f"caught up: {rows} row changes replicated; {rows / max(0.001, time.time() - wl_start):.0f} rows/s from "
        f"workload start to checkpoint; final lag {q['checkpoint_lag']}s")
    conn = up.connect("shop")
    try:
        verdict = target.compare_mysql(conn, TABLES)
    finally:
        conn.close()
    for d in verdict.diffs:
        text = "EQUAL" if d.equal else f"DIFFERENT missing={d.missing} extra={d.extra} changed={d.different}"
        say(f"compare {d.table:<20} source {d.source_rows:>7} rows, target {d.target_rows:>7} rows: {text}")
    say("RESULT: source and target are identical" if verdict.identical else "RESULT: MISMATCH")
    say(f"total {time.time() - t0:.1f}s")
    return verdict.identical
