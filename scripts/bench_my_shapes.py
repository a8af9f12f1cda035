"""What statement shapes cost a MariaDB target's server per row: its CPU (``/proc/<mariadbd>/stat``) while one client
sends the same rows in different shapes, for new keys and for updates of existing keys.

One MariaDB 10.11 of ``playground.servers`` (binlog on, as the bench's target for a PostgreSQL upstream; ``--no-binlog``
as its target for a MariaDB upstream), the bench's sbtest table ``(id bigint primary key, k int, c varchar(60), pad
varchar(20), ts timestamp)``, ``--rows`` rows in transactions of ``--txn`` rows (a catch-up's writes), literal rows
rendered once before the clock starts (the client's work is not what is measured). Shapes (``--shapes``):

- ``upsert``: ``INSERT .. VALUES .. ON DUPLICATE KEY UPDATE c = VALUES(c), ..`` of ``--stmt-rows`` rows (today's);
- ``insert``: plain multi-row ``INSERT`` (new keys only);
- ``load``: ``LOAD DATA LOCAL INFILE`` straight into the table, ``--stmt-rows`` rows a load (new keys only);
- ``replace``: ``REPLACE INTO .. VALUES``;
- ``update_tvc``: ``UPDATE t JOIN (WITH v (cols) AS (VALUES ..) SELECT * FROM v) v ON t.id = v.id SET ..``
  (updates only);
- ``update_each``: one ``UPDATE .. WHERE id = ..`` per row, sent as one multi-statement string (updates only).

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_my_shapes.py --rows 200000 --repeat 2
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.procstat import cpu_seconds  # noqa: E402
from playground.servers.mariadb import MariaDBServer  # noqa: E402

COLS = ("id", "k", "c", "pad", "ts")
DDL = ("CREATE TABLE sbtest (id BIGINT PRIMARY KEY, k INT NOT NULL, c VARCHAR(60) NOT NULL, "
       "pad VARCHAR(20) NOT NULL, ts TIMESTAMP NOT NULL) ENGINE=InnoDB")


def row(i: int, gen: int) -> tuple[int, int, str, str, str]:
    return (i, (i * 7919 + gen) % 1000003, f"{i:020d}-{gen:08d}-" + "c" * 30, f"p{gen:08d}{i % 1000:03d}",
            "2026-11-29 10:00:00")


def lit(r: tuple[int, int, str, str, str]) -> str:
    return f"({r[0]},{r[1]},'{r[2]}','{r[3]}','{r[4]}')"


def chunks(rows: list[str], n: int) -> list[list[str]]:
    return [rows[i:i + n] for i in range(0, len(rows), n)]


SETS = ", ".join(f"{c} = VALUES({c})" for c in COLS[1:])
HEAD = f"INSERT INTO sbtest ({', '.join(COLS)}) VALUES "


def statements(shape: str, rows: list[tuple[int, int, str, str, str]], stmt_rows: int) -> list[str | bytes]:
    lits = [lit(r) for r in rows]
    if shape == "upsert":
        return [HEAD + ",".join(c) + " ON DUPLICATE KEY UPDATE " + SETS for c in chunks(lits, stmt_rows)]
    if shape == "insert":
        return [HEAD + ",".join(c) for c in chunks(lits, stmt_rows)]
    if shape == "replace":
        return ["REPLACE" + HEAD[6:] + ",".join(c) for c in chunks(lits, stmt_rows)]
    if shape == "update_tvc":
        return [f"UPDATE sbtest t JOIN (WITH v ({', '.join(COLS)}) AS (VALUES {','.join(c)}) SELECT * FROM v) v "
                "ON t.id = v.id SET " + ", ".join(f"t.{x} = v.{x}" for x in COLS[1:]) for c in chunks(lits, stmt_rows)]
    if shape == "update_each":
        return [";".join(f"UPDATE sbtest SET k={r[1]}, c='{r[2]}', pad='{r[3]}', ts='{r[4]}' WHERE id={r[0]}"
                         for r in c) for c in chunks(rows, stmt_rows)]
    if shape == "load":
        return ["\n".join("\t".join(str(v) for v in r) for r in c).encode() + b"\n" for c in chunks(rows, stmt_rows)]
    raise ValueError(shape)


def run(server: MariaDBServer, shape: str, mode: str, n: int, txn: int, stmt_rows: int, work: Path) -> tuple[float, float]:
    import pymysql
    from pymysql.constants import CLIENT

    server.execute("DROP TABLE IF EXISTS sbtest", db="shapes")
    server.execute(DDL, db="shapes")
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", database="shapes", charset="utf8mb4",
                           local_infile=True, client_flag=CLIENT.MULTI_STATEMENTS, max_allowed_packet=64 << 20)
    cur = conn.cursor()
    ids = list(range(1, n + 1))
    if mode == "update":  # the table holds every key; the updates come in random key order (workload b)
        for c in chunks([lit(row(i, 0)) for i in ids], 5000):
            cur.execute(HEAD + ",".join(c))
        conn.commit()
        random.Random(1).shuffle(ids)
    work_txns: list[list[str | bytes]] = [statements(shape, [row(i, 1) for i in t], stmt_rows)
                                          for t in chunks(ids, txn)]  # type: ignore[arg-type]
    path = work / "rows.tsv"
    pid = server.pid
    assert pid is not None
    before, t0 = cpu_seconds(pid) or 0.0, time.perf_counter()
    for stmts in work_txns:
        cur.execute("BEGIN")
        for s in stmts:
            if isinstance(s, bytes):
                path.write_bytes(s)
                cur.execute(f"LOAD DATA LOCAL INFILE '{path}' INTO TABLE sbtest ({', '.join(COLS)})")
            else:
                cur.execute(s)
                while cur.nextset():
                    pass
        conn.commit()
    wall, cpu = time.perf_counter() - t0, (cpu_seconds(pid) or 0.0) - before
    [(count,)] = server.execute("SELECT COUNT(*) FROM sbtest WHERE pad LIKE 'p00000001%'", db="shapes") or [(0,)]
    assert count == n, (shape, mode, count)  # every row holds generation 1
    conn.close()
    return cpu * 1e6 / n, n / wall


CASES: dict[str, tuple[str, ...]] = {"new": ("upsert", "insert", "load", "replace"),
                                     "update": ("upsert", "replace", "update_tvc", "update_each")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--txn", type=int, default=20_000)
    ap.add_argument("--stmt-rows", default="1000")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--modes", default="new,update")
    ap.add_argument("--shapes", default="")
    ap.add_argument("--no-binlog", action="store_true")
    a = ap.parse_args()
    wanted = set(a.shapes.split(",")) if a.shapes else None
    with tempfile.TemporaryDirectory(prefix="myshapes-") as d:
        work = Path(d)
        server = MariaDBServer(work, settings={"local-infile": "ON"}, log_bin=not a.no_binlog).start()
        try:
            server.execute("CREATE DATABASE shapes")
            print(f"load average {os.getloadavg()}; binlog {'off' if a.no_binlog else 'on'}; {a.rows} rows, "
                  f"transactions of {a.txn}")
            print("| mode | shape | rows/stmt | run | server CPU us/row | rows/s |")
            print("|---|---|---|---|---|---|")
            for rep in range(a.repeat):
                for mode in a.modes.split(","):
                    for shape in CASES[mode]:
                        if wanted is not None and shape not in wanted:
                            continue
                        for sr in (int(x) for x in a.stmt_rows.split(",")):
                            us, rps = run(server, shape, mode, a.rows, a.txn, sr, work)
                            print(f"| {mode} | {shape} | {sr} | {rep + 1} | {us:.2f} | "
                                  f"{rps:,.0f} |", flush=True)
            print(f"load average {os.getloadavg()}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
