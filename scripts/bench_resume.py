"""Resume to first row: seconds from ``POST /api/v2/changefeeds/{id}/resume`` until the first change made
while the changefeed was stopped is in the target, and until the changefeed checkpoint passes the upstream
position when nothing was written (issue 22: the fixed cost in every catch-up ``python -m bench`` measures).

    .venv/bin/python scripts/bench_resume.py [--resumes 10] [--sink postgresql|blackhole] [--settle 0]
                                             [--log-phases]

Starts etcd, an upstream PostgreSQL, a target PostgreSQL and one ``cdc server`` on 127.0.0.1, creates one
changefeed of one table, and then ``--resumes`` times: pause (until its slot has no reader, then ``--settle``
seconds more: 0, the default, resumes at once as ``python -m bench`` does, so the pause's second phase may still
be under way; negative: resume as soon as the pause request returns, while the span is still stopping), insert one
row upstream, resume, and poll the target every 5 ms for the row. Then the same number of resumes with nothing to
replicate (a flushed logical message moves the WAL), polling the changefeed's checkpoint every 5 ms. Prints each time
and the medians. ``--log-phases`` prints, per resume, the capture's log lines after the resume with their offset
in ms (the phases: owner assignment, span start, first write, status stored). Everything it starts is stopped.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.consumers import wait_slots_inactive
from playground.cluster import CdcServer, current_lsn
from playground.servers import EtcdServer, PostgresServer

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (.*)$")


def log_lines_since(log: Path, since: float, until: float) -> list[tuple[float, str]]:
    """The capture's log lines stamped in [since, until] (wall clock), as (seconds after ``since``, text)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _STAMP.match(line)
        if not m:
            continue
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if since - 0.002 <= at <= until + 0.002:
            out.append((at - since, m.group(2)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--resumes", type=int, default=10)
    ap.add_argument("--sink", choices=("postgresql", "blackhole"), default="postgresql")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds between the slot going inactive and the resume (0: at once, as the bench; "
                         "negative: resume as soon as the pause request returns, before the span stopped)")
    ap.add_argument("--unflushed", action="store_true",
                    help="leave the logical message unflushed, as python -m bench did before (WAL writer delay)")
    ap.add_argument("--log-phases", action="store_true", help="print the capture's log lines of each resume")
    ap.add_argument("--log-level", default="info", help="the capture's --log-level")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="tidewater-resume-"))
    etcd = up = target = None
    cdc: CdcServer | None = None
    try:
        etcd = EtcdServer(tmp / "etcd").start()
        up = PostgresServer(tmp / "pg-up", settings={"synchronous_commit": "on", "autovacuum": "off"}).start()
        up.create_database("src")
        up.execute("CREATE TABLE t (id int PRIMARY KEY, v text)", db="src")
        if args.sink == "postgresql":
            target = PostgresServer(tmp / "pg-target").start()
            target.create_database("dst")
            sink_uri = target.uri("dst")
        else:
            sink_uri = "blackhole://"
        cdc = CdcServer(etcd.url, tmp / "cdc", extra_args=["--log-level", args.log_level]).start()
        cf = "resume-lag"
        cdc.create_changefeed(cf, up.uri("src"), sink_uri, snapshot="none")
        conn = up.connect("src")
        conn.autocommit = True
        cdc.wait_checkpoint(cf, current_lsn(conn), timeout=120)
        slots = [s["slot"] for s in cdc.changefeed(cf)["spans"]]
        tconn = None
        if target is not None:
            tconn = target.connect("dst")
            tconn.autocommit = True

        def pause() -> None:
            cdc.request("POST", f"/api/v2/changefeeds/{cf}/pause")
            if args.settle < 0:  # resume while the pause is under way: the span's stop is not confirmed yet
                return
            wait_slots_inactive(up, "src", slots)
            time.sleep(args.settle)

        def phases(t0: float, t1: float) -> None:
            if args.log_phases:
                for dt, text in log_lines_since(cdc.log_file, t0, t1 + 0.05):
                    print(f"      +{dt * 1000:6.0f} ms {text[:160]}")

        first_row: list[float] = []
        if tconn is not None:
            for i in range(args.resumes):
                pause()
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
                t0, m0 = time.time(), time.monotonic()
                cdc.request("POST", f"/api/v2/changefeeds/{cf}/resume")
                while True:
                    with tconn.cursor() as cur:
                        try:
                            cur.execute("SELECT 1 FROM t WHERE id = %s", (i,))
                            found = cur.fetchone() is not None
                        except Exception:  # noqa: BLE001 - the table appears with the first write
                            found = False
                    if found:
                        break
                    if time.monotonic() - m0 > 60:
                        raise TimeoutError(f"row {i} not replicated in 60 s")
                    time.sleep(0.005)
                first_row.append(time.monotonic() - m0)
                print(f"  resume -> first row #{i + 1}: {first_row[-1] * 1000:.0f} ms")
                phases(t0, time.time())
        idle: list[float] = []
        for i in range(args.resumes):
            pause()
            with conn.cursor() as cur:
                # flushed (PostgreSQL 17+): unflushed, the walsender would see it only after the WAL writer's next
                # round (up to wal_writer_delay, 200 ms)
                cur.execute("SELECT pg_logical_emit_message(false, 'resume-lag', '', %s)", (not args.unflushed,))
            lsn = current_lsn(conn)
            t0, m0 = time.time(), time.monotonic()
            cdc.request("POST", f"/api/v2/changefeeds/{cf}/resume")
            while cdc.changefeed(cf)["checkpoint_ts"] < lsn:
                if time.monotonic() - m0 > 60:
                    raise TimeoutError("checkpoint did not pass the upstream position in 60 s")
                time.sleep(0.005)
            idle.append(time.monotonic() - m0)
            print(f"  resume -> checkpoint, nothing to replicate #{i + 1}: {idle[-1] * 1000:.0f} ms")
            phases(t0, time.time())
        if first_row:
            print(f"resume -> first row ({args.sink}, settle {args.settle:g} s): median {statistics.median(first_row) * 1000:.0f} ms, "
                  f"min {min(first_row) * 1000:.0f}, max {max(first_row) * 1000:.0f} (n={len(first_row)})")
        print(f"resume -> checkpoint with nothing to replicate ({args.sink}, settle {args.settle:g} s): median "
              f"{statistics.median(idle) * 1000:.0f} ms, min {min(idle) * 1000:.0f}, max {max(idle) * 1000:.0f} "
              f"(n={len(idle)})")
        return 0
    finally:
        if cdc is not None:
            cdc.terminate()
        for server in (target, up, etcd):
            if server is not None:
                server.stop()


if __name__ == "__main__":
    sys.exit(main())
