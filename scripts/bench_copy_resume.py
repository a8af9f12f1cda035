"""How long an initial copy stands still when its capture is SIGKILLed mid-copy and started again on its data directory.

Starts etcd, one PostgreSQL server (upstream and target databases) and one ``cdc server`` (playground), loads
``--rows`` rows into one table, creates a changefeed with the initial copy through the Spark job (``spark-min-rows =
0``, ``chunk-rows = 50000``) into PostgreSQL, SIGKILLs the capture once ``--kill-after`` chunks are recorded, starts
it again (same port, so the same ``--data-dir``) and prints the seconds from the restart until the capture is
healthy, until the first chunk is recorded after it (the copy moves again) and until the changefeed streams, with the
capture's registration and election lines from its log.

    .venv/bin/python scripts/bench_copy_resume.py [--rows 3000000] [--kill-after 8] [--verbose]

Nothing is asserted (docs/benchmarks.md, "Issue 22 item 8", records its output).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from playground.cluster import ApiError, CdcServer
from playground.servers import EtcdServer, PostgresServer

COPY_CONFIG = '[snapshot]\nmode = "initial"\nspark-min-rows = 0\nchunk-rows = 50000\n'


def _snapshot(cdc: CdcServer) -> dict[str, Any]:
    return dict(cdc.changefeed("r").get("snapshot") or {})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=3_000_000)
    ap.add_argument("--kill-after", type=int, default=8, help="chunks recorded before the SIGKILL")
    ap.add_argument("--verbose", action="store_true", help="print every line of the capture's log")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tidewater-resume-"))
    etcd = EtcdServer(base / "etcd").start()
    pg = PostgresServer(base / "pg").start()
    cdc = CdcServer(etcd.url, base / "cdc", cluster_id="resume").start()
    try:
        pg.create_database("src")
        pg.create_database("dst")
        conn = pg.connect("src")
        conn.autocommit = True
        with conn.cursor() as cur:
            # fixed-width columns: the copy goes on under the next run's snapshot (a table with variable-width columns
            # and no REPLICA IDENTITY FULL starts over: docs/snapshot.md), so "moving again" is the resumed copy
            cur.execute("CREATE TABLE big (id bigint PRIMARY KEY, k int, ts timestamp, f float8)")
            cur.execute(f"INSERT INTO big SELECT g, g % 97, timestamp '2026-01-01' + g * interval '1 second', g / 7.0 "
                        f"FROM generate_series(1, {args.rows}) g")
            cur.execute("VACUUM ANALYZE big")
        conn.close()
        cdc.create_changefeed("r", pg.uri("src"), pg.uri("dst"), COPY_CONFIG)
        while (s := _snapshot(cdc)).get("chunks_done", 0) < args.kill_after:
            time.sleep(0.1)
        done, total = s["chunks_done"], s["chunks_total"]
        cdc.kill()
        t0 = time.monotonic()
        cdc.start()
        healthy = time.monotonic() - t0
        moved: float | None = None
        streaming: float | None = None
        while time.monotonic() - t0 < 600:
            try:
                q = cdc.changefeed("r")
            except (ApiError, OSError):
                time.sleep(0.1)
                continue
            # the new run recorded a chunk (one committed before the kill, or a new one): the copy goes on
            if moved is None and (q.get("snapshot") or {}).get("chunks_done", 0) > done:
                moved = time.monotonic() - t0
            if q.get("phase") == "streaming":
                streaming = time.monotonic() - t0
                break
            time.sleep(0.1)
        print(f"killed at {done}/{total} chunks; after the restart: healthy {healthy:.1f} s, copy moving again "
              f"{moved if moved is None else round(moved, 1)} s, streaming {streaming if streaming is None else round(streaming, 1)} s")
        for line in cdc.log_file.read_text(errors="replace").splitlines():
            if "revoked lease" in line or " registered (lease" in line or ": elected" in line or args.verbose:
                print(line[:200])
    finally:
        cdc.terminate()
        pg.stop()
        etcd.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
