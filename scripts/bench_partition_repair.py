"""What partition repair costs the upstream (issue 8 item 5): TRUNCATE / DETACH / DROP of one partition of
N rows, and ATTACH of a table of N rows, with Tidewater's partition triggers installed against the same
statement on an identical table without them (the reference, measured in the same run).

Starts its own PostgreSQL on 127.0.0.1 in a temporary directory. For each operation and each of the two
setups, builds a partitioned root ``m (id bigint, k date, v text, PRIMARY KEY (id, k))`` with one
partition of ``--rows`` rows (plus a second, untouched one), publishes the root, runs the operation and
prints its wall time and the WAL it wrote (``pg_current_wal_lsn`` before/after), with a slot holding the
WAL so the messages are really kept.

    .venv/bin/python scripts/bench_partition_repair.py [--rows 1000000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2  # noqa: E402

from playground.servers import PostgresServer  # noqa: E402

OPS = {
    "truncate": "TRUNCATE m_a",
    "detach": "ALTER TABLE m DETACH PARTITION m_a",
    "drop": "DROP TABLE m_a",
    "attach": "ALTER TABLE m ATTACH PARTITION m_new FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')",
}


def install(cur: Any) -> None:
    sql = (Path(__file__).resolve().parent.parent / "upstream/postgres/sql/20_partitions.sql").read_text()
    cur.execute("CREATE SCHEMA IF NOT EXISTS tidewater")
    cur.execute(sql)


def one(server: PostgresServer, op: str, rows: int, with_triggers: bool) -> dict[str, Any]:
    db = f"b_{op}_{int(with_triggers)}"
    server.create_database(db)
    conn = psycopg2.connect(server.dsn(db))
    conn.autocommit = True
    cur = conn.cursor()
    try:
        cur.execute("CREATE TABLE m (id bigint, k date, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)")
        cur.execute("CREATE TABLE m_a PARTITION OF m FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')")
        cur.execute("CREATE TABLE m_b PARTITION OF m FOR VALUES FROM ('2023-01-01') TO ('2024-01-01')")
        cur.execute("CREATE TABLE m_new (id bigint, k date, v text, PRIMARY KEY (id, k))")
        target = "m_new" if op == "attach" else "m_a"
        day = "2025-03-03" if op == "attach" else "2024-03-03"
        cur.execute(f"INSERT INTO {target} SELECT g, '{day}', md5(g::text) FROM generate_series(1, %s) g", (rows,))
        cur.execute("INSERT INTO m_b SELECT g, '2023-03-03', 'x' FROM generate_series(1, 1000) g")
        cur.execute("CREATE PUBLICATION tidewater_pub_bench_0 FOR TABLE m WITH (publish_via_partition_root = true)")
        cur.execute("VACUUM ANALYZE")
        if with_triggers:
            install(cur)
        other = psycopg2.connect(server.dsn(db))
        other.autocommit = True
        other.cursor().execute(f"SELECT pg_create_logical_replication_slot('{db}', 'pgoutput')")
        other.close()
        cur.execute("CHECKPOINT")
        cur.execute("SELECT pg_current_wal_insert_lsn()")
        (before,) = cur.fetchone()
        t0 = time.perf_counter()
        cur.execute(OPS[op])
        seconds = time.perf_counter() - t0
        cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (before,))
        (wal,) = cur.fetchone()
        cur.execute(f"SELECT pg_drop_replication_slot('{db}')")
        return {"op": op, "triggers": with_triggers, "rows": rows, "seconds": round(seconds, 3),
                "wal_mb": round(float(wal) / 2**20, 1)}
    finally:
        conn.close()
        server.drop_database(db)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="tw-bench-part-") as tmp:
        server = PostgresServer(Path(tmp)).start()
        try:
            print(f"{'operation':<10} {'rows':>9} {'without: s':>11} {'WAL MB':>7} {'with: s':>8} {'WAL MB':>7} "
                  f"{'rows/s with':>12}")
            for op in OPS:
                ref = one(server, op, args.rows, False)
                got = one(server, op, args.rows, True)
                results += [ref, got]
                rate = args.rows / got["seconds"] if got["seconds"] else float("inf")
                print(f"{op:<10} {args.rows:>9} {ref['seconds']:>11.3f} {ref['wal_mb']:>7.1f} {got['seconds']:>8.3f} "
                      f"{got['wal_mb']:>7.1f} {rate:>12,.0f}", flush=True)
        finally:
            server.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
