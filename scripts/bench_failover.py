"""Failover drill: seconds from SIGKILL of the owner (under a write load) until the changefeed's
global checkpoint advances again.

    .venv/bin/python scripts/bench_failover.py [--kills 3] [--session-ttl 10] [--rate 2000]

Starts etcd, PostgreSQL and three `cdc server` processes on 127.0.0.1, replicates one table into a
second PostgreSQL database while a writer inserts --rate rows/s, kills the owner --kills times (a new
capture joins after each kill), prints each recovery time, then checks that target equals source.
Everything it starts is stopped at the end. Recovery is bounded below by the capture lease TTL: the
dead owner's election key and its spans are only released when its lease expires.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from playground.chaos import checkpoint_of, live, owner_of, wait_recovery
from playground.cluster import CdcServer, current_lsn
from playground.compare import compare_tables
from playground.servers import EtcdServer, PostgresServer


def writer(pg: PostgresServer, db: str, rate: int, stop: threading.Event) -> None:
    conn = pg.connect(db)
    conn.autocommit = False
    cur = conn.cursor()
    next_id, batch, t0 = 0, 100, time.monotonic()
    while not stop.is_set():
        cur.execute("INSERT INTO load SELECT g, md5(g::text), now() FROM generate_series(%s, %s) g",
                    (next_id, next_id + batch - 1))
        conn.commit()
        next_id += batch
        ahead = next_id / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    conn.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--session-ttl", type=int, default=10)
    ap.add_argument("--rate", type=int, default=2000, help="rows/s written upstream during the drill")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="tidewater-failover-"))
    conf = tmp / "server.toml"
    conf.write_text(f"session-ttl = {args.session_ttl}\n")
    etcd = pg = None
    servers: list[CdcServer] = []
    stop = threading.Event()
    try:
        etcd = EtcdServer(tmp / "etcd").start()
        pg = PostgresServer(tmp / "pg", settings={"synchronous_commit": "on"}).start()
        pg.create_database("src")
        pg.create_database("dst")
        pg.execute("CREATE TABLE load (id bigint PRIMARY KEY, v text, at timestamptz)", db="src")

        def new_server() -> CdcServer:
            s = CdcServer(etcd.url, tmp / "cdc", extra_args=["--config", str(conf)]).start()
            servers.append(s)
            return s

        for _ in range(3):
            new_server()
        servers[0].create_changefeed("drill", pg.uri("src"), pg.uri("dst"), "span-count = 3\n")
        w = threading.Thread(target=writer, args=(pg, "src", args.rate, stop), daemon=True)
        w.start()
        time.sleep(5)
        recoveries = []
        for i in range(args.kills):
            owner = owner_of(servers)
            before = checkpoint_of(servers, "drill")
            killed = time.monotonic()
            owner.kill()
            r = wait_recovery(servers, "drill", before, killed)
            recoveries.append(r)
            print(f"kill {i + 1}: owner on port {owner.port} SIGKILLed; checkpoint advanced again after {r:.2f}s",
                  flush=True)
            new_server()
            time.sleep(max(5.0, args.session_ttl / 2))
        stop.set()
        w.join()
        src = pg.connect("src")
        live(servers)[0].wait_checkpoint("drill", current_lsn(src), timeout=300)
        (diff,) = compare_tables(src, ["public.load"], pg.uri("dst"))
        src.close()
        print(f"\nsession-ttl {args.session_ttl}s, load {args.rate} rows/s, {args.kills} owner kills")
        print(f"recovery seconds: {[round(r, 2) for r in recoveries]}  median {statistics.median(recoveries):.2f}  "
              f"max {max(recoveries):.2f}")
        print(f"target equals source: {diff.equal} ({diff.source_rows} rows)")
        return 0 if diff.equal else 1
    finally:
        stop.set()
        for s in servers:
            s.kill()
        if pg is not None:
            pg.stop()
        if etcd is not None:
            etcd.stop()


if __name__ == "__main__":
    sys.exit(main())
