"""``python -m bench --upstream mariadb``: the throughput workloads written into a MariaDB upstream, each replicated
by every consumer of the same binlog in turn (:mod:`bench.mariadb_refs`).

Servers (:class:`MariaDBBenchEnv`, all on 127.0.0.1 under the work directory): etcd; the upstream MariaDB (row
binlog, ``binlog_row_metadata=FULL``, Debian's ``mariadbd``); a second MariaDB that is both MariaDB's own replica of
the upstream (the native reference) and the target of Tidewater's ``mysql://`` sink (one ``tw_<scenario>`` database
each, as the PostgreSQL bench's subscriber is); a PostgreSQL target when the ``postgresql`` sink is asked for; one
``cdc server``.

Workloads (each scenario its own upstream database, every phase's rows written with nothing reading):

* (a) inserts of ~100-byte rows (the PostgreSQL bench's ``sbtest`` shape: BIGINT key, INT, VARCHAR(60), VARCHAR(20),
  DATETIME), 100 per transaction, one ``INSERT ... SELECT`` from MariaDB's sequence engine each;
* (b) one update of each row of (a) by primary key, 100 random keys per transaction;
* (o) an OLTP mix of single-row transactions (autocommit) on a preloaded ``sbtest``: half updates of a random
  live key, a quarter inserts of a new key, a quarter deletes of a random live key (the preload is a setup phase).

After each scenario the SQL targets are compared with the upstream row by row (``playground.compare``; a table of
more than ``compare_rows`` rows is not compared, which the notes say); a difference is an error of the run.

Not thread-safe; one :class:`MariaDBRunner` per run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.consumers import Around, Measurement, Profiler, measure_tidewater
from bench.env import BenchEnv
from bench.mariadb_refs import (
    IDLE_DB,
    MariaDBFeed,
    NativeReplica,
    binlog_end,
    measure_binlog_read,
    measure_replica,
)
from bench.report import PhaseReport, Report
from bench.workloads import ROWS_PER_TXN, WriteResult
from playground.compare import compare_mysql_tables
from playground.servers import EtcdServer, MariaDBServer, PostgresServer

Say = Callable[[str], None]
WORKLOADS = ("a", "b", "o")
SBTEST = ("CREATE TABLE sbtest (id BIGINT PRIMARY KEY, k INT NOT NULL, c VARCHAR(60) NOT NULL, "
          "pad VARCHAR(20) NOT NULL, ts DATETIME NOT NULL) DEFAULT CHARSET utf8mb4")
# rows lo..hi computed by the server (MariaDB's sequence engine), the same shape as bench.workloads.insert_sql
INSERT = ("INSERT INTO sbtest (id, k, c, pad, ts) SELECT seq, (seq * 7919) MOD 1000003, "
          "LEFT(CONCAT(MD5(seq), MD5(seq + 1)), 60), LEFT(MD5(-seq), 20), "
          "TIMESTAMP '2026-01-01 00:00:00' + INTERVAL seq SECOND FROM seq_{lo}_to_{hi}")
UPSTREAM_SETTINGS = {"max-binlog-size": "1073741824", "max-connections": "200"}
REPLICA_SETTINGS = {"server-id": "2", "local-infile": "ON", "max-connections": "200"}


class MariaDBBenchEnv(BenchEnv):
    """:class:`bench.env.BenchEnv` with a MariaDB upstream (``my_upstream``) and its replica (``mariadb``: also the
    ``mariadb`` sink's target); no PostgreSQL upstream. Everything it started is stopped on exit."""

    def __init__(self, work_dir: Path, sinks: list[str], server_config: str = "") -> None:
        super().__init__(work_dir, sinks, server_config, native=False)
        self.my_upstream: MariaDBServer | None = None

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.etcd = EtcdServer(self.work / "etcd")
        self._stack.callback(self.etcd.stop)
        self.etcd.start()
        self.my_upstream = MariaDBServer(self.work / "mariadb-upstream", settings=UPSTREAM_SETTINGS)
        self._stack.callback(self.my_upstream.stop)
        self.my_upstream.start()
        self.mariadb = MariaDBServer(self.work / "mariadb-replica", settings=REPLICA_SETTINGS, log_bin=False)
        self._stack.callback(self.mariadb.stop)
        self.mariadb.start()
        for server in (self.my_upstream, self.mariadb):  # bench_mariadb_refs.tick's table, on both (replicated)
            server.execute(f"CREATE DATABASE IF NOT EXISTS {IDLE_DB}")
            server.execute("CREATE TABLE IF NOT EXISTS tick (id INT PRIMARY KEY, at DATETIME(6))", db=IDLE_DB)
        if "postgresql" in self.sinks:
            self.subscriber = PostgresServer(self.work / "pg-target", settings={"autovacuum": "off"})
            self._stack.callback(self.subscriber.stop)
            self.subscriber.start()
        self.start_cdc()

    @property
    def up(self) -> MariaDBServer:
        assert self.my_upstream is not None
        return self.my_upstream

    def around(self, kind: str) -> Around:
        """:meth:`BenchEnv.around` and the upstream server: its binlog dump threads live inside ``mariadbd``."""
        return dataclasses.replace(super().around(kind), upstream=self.up.pid)

    def pids(self) -> dict[str, int]:
        out = super().pids()
        out.pop("mariadb", None)
        if self.my_upstream is not None and self.my_upstream.pid is not None:
            out["upstream"] = self.my_upstream.pid
        if self.mariadb is not None and self.mariadb.pid is not None:
            out["replica"] = self.mariadb.pid
        return out


@dataclass
class MyPhase:
    name: str  # a | b | o | setup
    timed: bool
    label: str
    write: Callable[[Any], int]  # (autocommit connection) -> row changes written


def _insert_range(cur: Any, lo: int, hi: int) -> None:
    for start in range(lo, hi + 1, ROWS_PER_TXN):
        cur.execute("BEGIN")
        cur.execute(INSERT.format(lo=start, hi=min(start + ROWS_PER_TXN - 1, hi)))
        cur.execute("COMMIT")


class Scenario:
    """One upstream database ``bench_<key>`` with ``sbtest`` and the phases written into it."""

    def __init__(self, key: str, title: str, phases: list[MyPhase]) -> None:
        self.key, self.title, self.phases = key, title, phases


def inserts_updates(rows: int, timed: set[str], seed: int = 1) -> Scenario:
    """(a) ``rows`` inserts, then (b) one update of each by key (a is a setup phase when only b is asked for)."""

    def insert(conn: Any) -> int:
        with conn.cursor() as cur:
            _insert_range(cur, 1, rows)
        return rows

    def update(conn: Any) -> int:
        ids = list(range(1, rows + 1))
        random.Random(seed).shuffle(ids)
        with conn.cursor() as cur:
            for i in range(0, len(ids), ROWS_PER_TXN):
                chunk = ids[i: i + ROWS_PER_TXN]
                cur.execute("BEGIN")
                cur.execute("UPDATE sbtest SET k = k + 1, c = LEFT(CONCAT(MD5(c), c), 60) WHERE id IN ("
                            + ",".join(map(str, chunk)) + ")")
                cur.execute("COMMIT")
        return rows

    phases = [MyPhase("a" if "a" in timed else "setup", "a" in timed,
                      f"(a) {rows} inserts of ~100-byte rows, {ROWS_PER_TXN} per transaction", insert)]
    if "b" in timed:
        phases.append(MyPhase("b", True, f"(b) {rows} updates by primary key, {ROWS_PER_TXN} random keys per "
                              "transaction", update))
    return Scenario("ab", "small rows: inserts (a), updates by key (b)", phases)


def oltp_mix(preload: int, txns: int, seed: int = 3) -> Scenario:
    """(o) ``txns`` single-row transactions on ``preload`` existing rows: 1/2 updates, 1/4 inserts, 1/4 deletes."""

    def load(conn: Any) -> int:
        with conn.cursor() as cur:
            _insert_range(cur, 1, preload)
        return preload

    def mix(conn: Any) -> int:
        rnd = random.Random(seed)
        live = list(range(1, preload + 1))
        next_id = preload + 1
        with conn.cursor() as cur:  # autocommit: every statement is its own transaction
            for i in range(txns):
                op = i % 4
                if op == 1 or not live:
                    cur.execute(INSERT.format(lo=next_id, hi=next_id))
                    live.append(next_id)
                    next_id += 1
                elif op == 3:
                    j = rnd.randrange(len(live))
                    live[j], live[-1] = live[-1], live[j]
                    cur.execute("DELETE FROM sbtest WHERE id = %s", (live.pop(),))
                else:
                    cur.execute("UPDATE sbtest SET k = k + 1, pad = LEFT(MD5(pad), 20) WHERE id = %s",
                                (live[rnd.randrange(len(live))],))
        return txns

    return Scenario("o", "OLTP mix of single-row transactions", [
        MyPhase("setup", False, f"{preload} rows preloaded, {ROWS_PER_TXN} per transaction", load),
        MyPhase("o", True, f"(o) {txns} single-row transactions (autocommit): 1/2 updates by key, 1/4 inserts, "
                "1/4 deletes", mix)])


class MariaDBRunner:
    """Runs each scenario against every consumer (module doc) and fills a :class:`bench.report.Report`."""

    def __init__(self, env: MariaDBBenchEnv, sinks: list[str], workloads: list[str], rows: int, timeout: float,
                 say: Say, changefeed_config: str = "", native: bool = True, compare_rows: int = 200_000,
                 profiler: Profiler | None = None, o_txns: int | None = None) -> None:
        self.env, self.sinks, self.workloads, self.rows = env, sinks, workloads, rows
        # (o)'s transactions: one connection writes ~900-3,500 a second here, so --rows' 1,000,000 would take minutes
        self.o_txns = o_txns if o_txns is not None else min(rows, 100_000)
        self.timeout, self.say, self.config, self.native = timeout, say, changefeed_config, native
        self.compare_rows, self.profiler = compare_rows, profiler
        assert env.mariadb is not None
        self.replica = NativeReplica(env.up, env.mariadb)

    def run(self, report: Report) -> Report:
        wl = set(self.workloads)
        scenarios = []
        if wl & {"a", "b"}:
            scenarios.append(inserts_updates(self.rows, wl & {"a", "b"}))
        if "o" in wl:
            scenarios.append(oltp_mix(min(self.rows, 100_000), self.o_txns))
        for scn in scenarios:
            try:
                report.phases += self.run_scenario(scn, report)
            except Exception as exc:  # noqa: BLE001 - the other scenarios still run
                report.errors.append(f"scenario {scn.key}: {type(exc).__name__}: {exc}")
                self.say(f"[{scn.key}] FAILED: {traceback.format_exc()}")
        return report

    def run_scenario(self, scn: Scenario, report: Report) -> list[PhaseReport]:
        up, env, say, key = self.env.up, self.env, self.say, scn.key
        db = f"bench_{key}"
        out: list[PhaseReport] = []
        with contextlib.ExitStack() as stack:
            t_setup = time.monotonic()
            up.drop_database(db)
            self.replica.point_at(binlog_end(up))
            assert env.mariadb is not None
            stack.callback(env.mariadb.drop_database, db)  # the replica's copy (never sees the upstream's drop)
            up.create_database(db)
            stack.callback(up.drop_database, db)
            up.execute(SBTEST, db=db)
            if self.native:
                self.replica.catch_up(binlog_end(up), self.timeout)
            feeds: dict[str, MariaDBFeed] = {}
            for sink in self.sinks:
                stack.callback(env.drop_target, sink, key)
                env.prepare_target(sink, key)
                assert env.cdc is not None
                feed = MariaDBFeed(env.cdc, up, db, f"bench-my-{key}-{sink}", sink, env.sink_uri(sink, key),
                                   self.config)
                stack.callback(feed.remove)
                feed.create(self.timeout)
                feed.pause()
                feeds[sink] = feed
            say(f"[{key}] {scn.title}: schema, replica and {len(feeds)} changefeeds ready in "
                f"{time.monotonic() - t_setup:.1f}s")
            idle = {sink: feed.idle_resume_seconds(self.timeout) for sink, feed in feeds.items()}
            report.notes.append(f"[{key}] Tidewater resume -> checkpoint with nothing to replicate (included in each "
                                "catch-up): " + ", ".join(f"{k} {v:.2f}s" for k, v in idle.items()))
            for phase in scn.phases:
                if self.native:
                    self.replica.catch_up(binlog_end(up), self.timeout)  # the ticks before: not the phase's
                start = binlog_end(up)
                say(f"[{key}] {phase.label}: writing upstream{'' if phase.timed else ' (setup)'}")
                conn = up.connect(db)
                try:
                    t0 = time.monotonic()
                    rows = phase.write(conn)
                    seconds = time.monotonic() - t0
                finally:
                    conn.close()
                end = binlog_end(up)
                say(f"[{key}]   {rows} rows written in {seconds:.1f}s")
                if not phase.timed:
                    self._untimed(feeds, end)
                    continue
                rep = PhaseReport(phase.name, phase.label, rows, WriteResult(rows, seconds, end))
                rep.recv = measure_binlog_read(up, start, end, rows, self.timeout)
                self._said(key, "mariadb-binlog", rep.recv)
                if self.native:
                    rep.native = measure_replica(self.replica, end, rows, self.timeout)
                    self._said(key, "native replica", rep.native)
                for sink, feed in feeds.items():
                    rep.tidewater[sink] = measure_tidewater(
                        feed, env.capture_pid, end, rows, self.timeout, self.profiler, f"my-{phase.name}-{sink}",
                        say, env.around(sink))
                    self._said(key, f"Tidewater -> {sink}", rep.tidewater[sink])
                out.append(rep)
            self._compare(key, db, report)
        return out

    def _untimed(self, feeds: dict[str, MariaDBFeed], end: int) -> None:
        t0 = time.monotonic()
        for feed in feeds.values():
            feed.resume()
        for feed in feeds.values():
            feed.wait(end, self.timeout)
            feed.pause()
        if self.native:
            self.replica.catch_up(end, self.timeout)
        self.say(f"  setup consumed by every consumer in {time.monotonic() - t0:.1f}s")

    def _compare(self, key: str, db: str, report: Report) -> None:
        """Row by row, upstream vs each SQL target (and the native replica) after the scenario."""
        up = self.env.up
        [(n,)] = up.execute("SELECT COUNT(*) FROM sbtest", db=db) or [(0,)]
        if int(n) > self.compare_rows:
            report.notes.append(f"[{key}] targets not compared row by row: {n} rows > --compare-rows")
            return
        uris = {sink: self.env.sink_uri(sink, key) for sink in self.sinks if sink != "blackhole"}
        if self.native and self.env.mariadb is not None:
            uris["native replica"] = self.env.mariadb.uri(db)
        conn = up.connect(db)
        try:
            for who, uri in uris.items():
                [d] = compare_mysql_tables(conn, [f"{db}.sbtest"], uri)
                if d.equal:
                    report.notes.append(f"[{key}] {who}: {d.target_rows} rows, equal to the upstream row by row")
                else:
                    report.errors.append(f"[{key}] {who} differs from the upstream: missing {d.missing[:3]} extra "
                                         f"{d.extra[:3]} changed {d.different[:3]}")
        finally:
            conn.close()

    def _said(self, key: str, what: str, m: Measurement) -> None:
        if m.error:
            self.say(f"[{key}]   {what}: ERROR {m.error}")
        else:
            self.say(f"[{key}]   {what}: {m.seconds:.2f}s, {m.rows_per_s:.0f} rows/s")
