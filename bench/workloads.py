"""What the benchmark writes upstream: scenarios made of phases.

A *scenario* owns one upstream database (and the same schema on the native subscriber). Its *phases*
run in order; a timed phase is measured (every consumer catches up on exactly the WAL it wrote), a setup
phase only brings every consumer's target to the state the next phase needs (for example the rows that
workload (b) updates). Workloads:

* (a) ``inserts``: small rows (5 columns, ~100 bytes: bigint, int, 60 + 20 characters, timestamp) inserted
  in 100-row transactions (one ``INSERT ... SELECT generate_series`` each, values computed by the server);
* (b) ``updates``: every row of (a) updated once by primary key, 100 random keys per transaction;
* (c) ``pgbench``: pgbench's TPC-B-like script with 4 clients for a fixed time (``pgbench_history`` gets
  a ``bigserial`` primary key so that it can be replicated by key); one transaction = 4 row changes;
* (e) ``many tables``: the rows of (a) spread uniformly over 1,000 tables (each 100-row transaction
  touches ~100 tables, one single-row INSERT each, sent in one round trip).

Every write function returns a :class:`WriteResult` whose ``target_lsn`` is the upstream's WAL insert
position read on the writing connection right after its last commit. Not thread-safe; run one phase at
a time.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from playground.cluster import current_lsn
from playground.servers import HOST, PostgresServer

ROWS_PER_TXN = 100
SBTEST_COLUMNS = ["id", "k", "c", "pad", "ts"]
_TS_BASE = datetime(2026, 1, 1)


def sbtest_ddl(name: str) -> str:
    return (f"CREATE TABLE {name} (id bigint PRIMARY KEY, k integer NOT NULL, c varchar(60) NOT NULL, "
            "pad varchar(20) NOT NULL, ts timestamp NOT NULL)")


def insert_sql(table: str) -> str:
    """``INSERT`` of rows ``%s..%s`` (inclusive) with values computed by the server (~100 bytes a row)."""
    return (f"INSERT INTO {table} (id, k, c, pad, ts) SELECT g, mod(g::bigint * 7919, 1000003), "
            "left(md5(g::text) || md5((g + 1)::text), 60), left(md5((-g)::text), 20), "
            "timestamp '2026-01-01' + g * interval '1 second' FROM generate_series(%s, %s) g")


def row_literal(i: int) -> str:
    """The same row as :func:`insert_sql` makes for id ``i``, as an SQL ``VALUES`` tuple."""
    c = (hashlib.md5(str(i).encode()).hexdigest() + hashlib.md5(str(i + 1).encode()).hexdigest())[:60]
    pad = hashlib.md5(str(-i).encode()).hexdigest()[:20]
    ts = _TS_BASE + timedelta(seconds=i)
    return f"({i},{(i * 7919) % 1000003},'{c}','{pad}','{ts:%Y-%m-%d %H:%M:%S}')"


@dataclass
class WriteResult:
    rows: int  # row changes written
    seconds: float  # wall time of the writes
    target_lsn: int  # upstream WAL insert position right after the last commit
    detail: str = ""  # e.g. pgbench's tps


@dataclass
class CeilingSource:
    """Row images of a phase, bulk loaded into a copy of ``table`` on the target for the write ceiling."""

    table: str
    columns: list[str]
    where: str = ""  # SQL condition (upstream) selecting the phase's rows; empty = all rows
    ddl: dict[str, str] = field(default_factory=dict)  # target kind -> CREATE TABLE {name} ...; else cloned


@dataclass
class Phase:
    name: str  # workload letter ('a', 'b', ...) or 'setup'
    timed: bool
    label: str
    write: Callable[[PostgresServer, str], WriteResult]
    ceiling: list[CeilingSource] = field(default_factory=list)


class Scenario:
    """One upstream database and its phases."""

    key = ""
    title = ""

    def create_schema(self, server: PostgresServer, db: str) -> None:
        raise NotImplementedError

    def phases(self) -> list[Phase]:
        raise NotImplementedError


def timed_writes(server: PostgresServer, db: str, body: Callable[[Any, Any], int]) -> WriteResult:
    """Run ``body(conn, cursor)`` (it commits its own transactions and returns the rows written) on a new
    connection with autocommit off; time it and read the insert LSN after its last commit."""
    conn = server.connect(db)
    try:
        conn.autocommit = False
        with conn.cursor() as cur:
            t0 = time.monotonic()
            rows = body(conn, cur)
            seconds = time.monotonic() - t0
        conn.commit()
        conn.autocommit = True
        return WriteResult(rows, seconds, current_lsn(conn))
    finally:
        conn.close()


# ---- (a) and (b) ----------------------------------------------------------------------------------------
class InsertsUpdates(Scenario):
    """(a) inserts of ``rows`` small rows, then (b) one update of each by key. When only (b) is asked
    for, (a) runs as an untimed setup phase."""

    key = "ab"
    title = "small rows: inserts (a), updates by key (b)"
    table = "sbtest"

    def __init__(self, rows: int, timed: set[str], seed: int = 42) -> None:
        self.rows = rows
        self.timed = timed
        self.seed = seed

    def create_schema(self, server: PostgresServer, db: str) -> None:
        server.execute(sbtest_ddl(self.table), db=db)

    def phases(self) -> list[Phase]:
        n = self.rows
        out = [Phase("a" if "a" in self.timed else "setup", "a" in self.timed,
                     f"(a) {n} inserts of ~100-byte rows, {ROWS_PER_TXN} per transaction", self._insert,
                     [CeilingSource(self.table, SBTEST_COLUMNS, f"id BETWEEN 1 AND {n}")])]
        if "b" in self.timed:
            out.append(Phase("b", True, f"(b) {n} updates by primary key, {ROWS_PER_TXN} random keys per "
                             "transaction", self._update, [CeilingSource(self.table, SBTEST_COLUMNS)]))
        return out

    def _insert(self, server: PostgresServer, db: str) -> WriteResult:
        sql = insert_sql(self.table)

        def body(conn: Any, cur: Any) -> int:
            for lo in range(1, self.rows + 1, ROWS_PER_TXN):
                cur.execute(sql, (lo, min(lo + ROWS_PER_TXN - 1, self.rows)))
                conn.commit()
            return self.rows

        return timed_writes(server, db, body)

    def _update(self, server: PostgresServer, db: str) -> WriteResult:
        ids = list(range(1, self.rows + 1))
        random.Random(self.seed).shuffle(ids)
        sql = f"UPDATE {self.table} SET k = k + 1, c = left(md5(c) || c, 60) WHERE id = ANY(%s)"

        def body(conn: Any, cur: Any) -> int:
            for i in range(0, len(ids), ROWS_PER_TXN):
                cur.execute(sql, (ids[i : i + ROWS_PER_TXN],))
                conn.commit()
            return len(ids)

        return timed_writes(server, db, body)


# ---- (c) pgbench ----------------------------------------------------------------------------------------
_PGBENCH_TXNS = re.compile(r"number of transactions actually processed:\s*(\d+)")
_PGBENCH_TPS = re.compile(r"tps = ([\d.]+) \(without initial connection time\)")


class Pgbench(Scenario):
    """(c) ``pgbench -i`` tables (scale ``scale``; data loaded by a setup phase so that every target
    has it), then ``pgbench -n -c clients -T seconds``."""

    key = "c"
    title = "pgbench TPC-B-like"

    def __init__(self, scale: int, seconds: float, clients: int = 4, jobs: int = 2) -> None:
        self.scale = scale
        self.seconds = seconds
        self.clients = clients
        self.jobs = jobs

    def _pgbench(self, server: PostgresServer, db: str, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        res = subprocess.run([str(server.bin_dir / "pgbench"), "-h", HOST, "-p", str(server.port), "-U", "postgres",
                              *args, db], capture_output=True, text=True, env=env, timeout=self.seconds + 600)
        if res.returncode != 0:
            raise RuntimeError(f"pgbench {' '.join(args)} failed ({res.returncode}): {res.stderr[-2000:]}")
        return res.stdout + res.stderr

    def create_schema(self, server: PostgresServer, db: str) -> None:
        self._pgbench(server, db, "-i", "-I", "dtp", "-s", str(self.scale))
        server.execute("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY", db=db)

    def phases(self) -> list[Phase]:
        ceiling = [
            CeilingSource("pgbench_history", ["tid", "bid", "aid", "delta", "mtime", "filler", "hid"]),
            CeilingSource("pgbench_accounts", ["aid", "bid", "abalance", "filler"], "abalance <> 0"),
            CeilingSource("pgbench_tellers", ["tid", "bid", "tbalance", "filler"]),
            CeilingSource("pgbench_branches", ["bid", "bbalance", "filler"]),
        ]
        return [
            Phase("setup", False, f"pgbench data, scale {self.scale}", self._load),
            Phase("c", True, f"(c) pgbench TPC-B-like, {self.clients} clients, {self.seconds:g} s, scale {self.scale}",
                  self._run, ceiling),
        ]

    def _load(self, server: PostgresServer, db: str) -> WriteResult:
        s = self.scale

        def body(conn: Any, cur: Any) -> int:
            cur.execute("INSERT INTO pgbench_branches (bid, bbalance) SELECT g, 0 FROM generate_series(1, %s) g", (s,))
            cur.execute("INSERT INTO pgbench_tellers (tid, bid, tbalance) SELECT g, (g - 1) / 10 + 1, 0 "
                        "FROM generate_series(1, %s) g", (10 * s,))
            conn.commit()
            n = 100_000 * s
            for lo in range(1, n + 1, 10_000):
                cur.execute("INSERT INTO pgbench_accounts (aid, bid, abalance, filler) SELECT g, (g - 1) / 100000 + 1, "
                            "0, '' FROM generate_series(%s, %s) g", (lo, min(lo + 9_999, n)))
                conn.commit()
            return s + 10 * s + n

        result = timed_writes(server, db, body)
        server.execute("VACUUM ANALYZE", db=db)  # autovacuum is off upstream and pgbench -n does not vacuum
        conn = server.connect(db)
        try:
            result.target_lsn = current_lsn(conn)  # the vacuum's WAL belongs to the setup too
        finally:
            conn.close()
        return result

    def _run(self, server: PostgresServer, db: str) -> WriteResult:
        before = server.execute("SELECT count(*) FROM pgbench_history", db=db)
        assert before is not None
        t0 = time.monotonic()
        out = self._pgbench(server, db, "-n", "-c", str(self.clients), "-j", str(self.jobs), "-T", f"{self.seconds:g}")
        seconds = time.monotonic() - t0
        conn = server.connect(db)
        try:
            lsn = current_lsn(conn)
            with conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM pgbench_history")
                txns = int(cur.fetchone()[0]) - int(before[0][0])
        finally:
            conn.close()
        m_txns, m_tps = _PGBENCH_TXNS.search(out), _PGBENCH_TPS.search(out)
        if m_txns is not None and int(m_txns.group(1)) != txns:
            raise RuntimeError(f"pgbench reports {m_txns.group(1)} transactions, pgbench_history grew by {txns}")
        tps = float(m_tps.group(1)) if m_tps else txns / seconds
        return WriteResult(4 * txns, seconds, lsn, f"{txns} pgbench transactions, {tps:.0f} tps")


# ---- (e) many tables ------------------------------------------------------------------------------------
class ManyTables(Scenario):
    """(e) ``tables`` tables like (a)'s; a setup phase writes one row to each (so that every target has
    created its tables before the timed phase); then ``rows`` rows, each to a uniformly random table."""

    key = "e"
    title = "many tables"

    def __init__(self, tables: int, rows: int, seed: int = 7) -> None:
        self.tables = tables
        self.rows = rows
        self.seed = seed

    def name(self, i: int) -> str:
        return f"t{i:04d}"

    def create_schema(self, server: PostgresServer, db: str) -> None:
        server.execute(";\n".join(sbtest_ddl(self.name(i)) for i in range(self.tables)), db=db)

    def phases(self) -> list[Phase]:
        t = self.tables
        ceiling = [CeilingSource(self.name(i), SBTEST_COLUMNS, f"id > {t}") for i in range(t)]
        return [
            Phase("setup", False, f"one row in each of {t} tables", self._touch),
            Phase("e", True, f"(e) {self.rows} inserts spread over {t} tables, {ROWS_PER_TXN} rows per transaction",
                  self._spread, ceiling),
        ]

    def _touch(self, server: PostgresServer, db: str) -> WriteResult:
        def body(conn: Any, cur: Any) -> int:
            for lo in range(0, self.tables, ROWS_PER_TXN):
                cur.execute(";".join(f"INSERT INTO {self.name(i)} VALUES {row_literal(i + 1)}"
                                     for i in range(lo, min(lo + ROWS_PER_TXN, self.tables))))
                conn.commit()
            return self.tables

        return timed_writes(server, db, body)

    def _spread(self, server: PostgresServer, db: str) -> WriteResult:
        rnd = random.Random(self.seed)
        first = self.tables + 1

        def body(conn: Any, cur: Any) -> int:
            for lo in range(first, first + self.rows, ROWS_PER_TXN):
                hi = min(lo + ROWS_PER_TXN, first + self.rows)
                cur.execute(";".join(f"INSERT INTO {self.name(rnd.randrange(self.tables))} VALUES {row_literal(i)}"
                                     for i in range(lo, hi)))
                conn.commit()
            return self.rows

        return timed_writes(server, db, body)
