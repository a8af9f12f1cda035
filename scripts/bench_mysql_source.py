"""The MySQL/MariaDB span source's hot path, alone: where the time of a binlog row goes before the sorter.

Starts a MariaDB (``playground.servers.MariaDBServer``, row binlog) in a temporary directory, or uses ``--uri``'s
server, and writes ``--rows`` row changes into ``hot.sbtest`` (bench.mariadb_run's table), either as single-row
transactions (``--shape single``: autocommit statements, the OLTP mix of workload (o): 1/2 updates by key, 1/4
inserts, 1/4 deletes, on as many preloaded rows), as 100-row INSERT transactions (``--shape batch``) or as workload
(b)'s 100-row UPDATE transactions on as many preloaded rows (``--shape update``). Then it reads
that binlog range three ways, one after the other, and prints wall time, CPU time and rows/s of each:

1. ``mariadb-binlog --read-from-remote-server`` to /dev/null (the read ceiling of ``python -m bench --upstream
   mariadb``: row events printed as base64, not decoded), and once more with ``--verbose`` (every row decoded into
   commented pseudo-SQL: a decoding reference in C);
2. ``pymysqlreplication`` alone: ``BinLogStreamReader`` with the source's settings, every row event's ``rows``
   decoded and nothing else (the reference client's own cost);
3. the span source (``upstream.mysql.source.MySqlSpanSource.run``, through ``open_upstream``) into a buffer that
   only counts: the library, the table-map check, rendering each value to text and encoding the payload.

``--spans N`` (N > 1) runs (3) once per span of a changefeed of N spans (``upstream.mysql.span_set``): the one span
whose share holds ``hot.sbtest`` decodes every row, each other one reads the same binlog and skips the table at its
TABLE_MAP, which is the extra cost every added span puts on the upstream side.

``--profile`` runs (3) under cProfile (in this thread) and prints its top functions by own time and that own time
summed per package (pymysqlreplication, PyMySQL, upstream/mysql, upstream/postgres, the standard library), which is
what docs/benchmarks.md's "Issue 23 item 7" section reports.

    .venv/bin/python scripts/bench_mysql_source.py [--rows 50000] [--shape single|batch|update] [--profile] [--uri URI]
                                                   [--spans N]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.mariadb_refs import binlog_end, file_of  # noqa: E402
from bench.mariadb_run import INSERT, SBTEST  # noqa: E402
from cdc.filter import TableFilter  # noqa: E402
from cdc.model import SpanInfo  # noqa: E402
from cdc.ts import Watermark  # noqa: E402
from playground.servers import HOST, MariaDBServer  # noqa: E402
from upstream import open_upstream  # noqa: E402
from upstream.mysql.positions import split_ts  # noqa: E402
from upstream.mysql.source import HEARTBEAT_SECONDS  # noqa: E402
from upstream.mysql.span_set import publication_label  # noqa: E402

DB = "hot"


class Counting:
    """A ChangeBuffer that counts rows and commits and keeps nothing."""

    def __init__(self) -> None:
        self.rows = self.commits = 0

    def add(self, xid: int, subxid: int, payload: bytes) -> None:
        self.rows += 1

    def add_many(self, xid: int, subxid: int, payloads: list[bytes]) -> None:
        self.rows += len(payloads)

    def abort(self, xid: int, subxid: int) -> None:
        pass

    def commit(self, xid: int, commit_ts: int, commit_time: float) -> None:
        self.commits += 1


def write(server: MariaDBServer, rows: int, shape: str) -> tuple[int, int]:
    """Write the workload (``single``, ``batch``, or ``update``: workload (b)'s, after a preload); return the binlog Ts
    range it occupies."""
    server.execute(f"DROP DATABASE IF EXISTS {DB}")
    server.execute(f"CREATE DATABASE {DB}")
    server.execute(SBTEST, db=DB)
    conn = server.connect(DB)
    try:
        with conn.cursor() as cur:
            if shape in ("single", "update"):
                for lo in range(1, rows + 1, 100):
                    cur.execute(INSERT.format(lo=lo, hi=min(lo + 99, rows)))
            start = binlog_end(server)
            if shape == "update":  # workload (b): one update of each row by key, 100 random keys per transaction
                ids = list(range(1, rows + 1))
                random.Random(7).shuffle(ids)
                for i in range(0, rows, 100):
                    cur.execute("BEGIN")
                    cur.execute("UPDATE sbtest SET k = k + 1, c = LEFT(CONCAT(MD5(c), c), 60) WHERE id IN ("
                                + ",".join(map(str, ids[i:i + 100])) + ")")
                    cur.execute("COMMIT")
            rnd = random.Random(3)
            live, next_id = list(range(1, rows + 1)), rows + 1
            for i in range(rows if shape == "single" else 0):
                op = i % 4
                if op == 1:
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
            if shape == "batch":
                for lo in range(1, rows + 1, 100):
                    cur.execute("BEGIN")
                    cur.execute(INSERT.format(lo=lo, hi=min(lo + 99, rows)))
                    cur.execute("COMMIT")
    finally:
        conn.close()
    return start, binlog_end(server)


@contextlib.contextmanager
def written_server(rows: int, shape: str) -> Iterator[tuple[MariaDBServer, int, int]]:
    """A MariaDB started in a temporary directory with the workload written (:func:`write`): ``(server, start Ts, end
    Ts)``; stopped and removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="tidewater-mysql-hot-"))
    server = MariaDBServer(work)
    try:
        server.start()
        start, end = write(server, rows, shape)
        print(f"{rows} row changes ({shape}) in binlog {start:X}..{end:X}", flush=True)
        yield server, start, end
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def timed(what: str, rows: int, fn: Any) -> None:
    w0, c0 = time.monotonic(), time.thread_time()
    extra = fn()
    wall, cpu = time.monotonic() - w0, time.thread_time() - c0
    print(f"{what:<48} {wall:7.2f} s wall {cpu:7.2f} s CPU {rows / wall:>9.0f} rows/s wall "
          f"{rows / cpu if cpu else 0:>9.0f} rows/s CPU {extra or ''}", flush=True)


def read_ceiling(server: MariaDBServer, start: int, end: int, rows: int, *extra: str) -> str:
    (first, spos), (last, epos) = file_of(server, start), file_of(server, end)
    assert first == last, "one binlog file expected"
    exe = shutil.which("mariadb-binlog") or "mysqlbinlog"
    argv = [exe, "--no-defaults", "--read-from-remote-server", f"--host={HOST}", f"--port={server.port}",
            "--user=root", f"--start-position={spos}", f"--stop-position={epos}", *extra, first]
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
    wall, r1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    text = subprocess.run(argv, stdout=subprocess.PIPE, check=True).stdout  # untimed: what it read and wrote
    return (f"{wall:7.2f} s wall {cpu:7.2f} s CPU {rows / wall:>9.0f} rows/s wall "
            f"{rows / cpu if cpu else 0:>9.0f} rows/s CPU (the child process; {(epos - spos) / 1e6:.1f} MB of "
            f"binlog, {len(text) / 1e6:.1f} MB of text)")


def library_only(server: MariaDBServer, start: int, end: int) -> str:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    name, pos = file_of(server, start)
    reader = BinLogStreamReader(
        {"host": HOST, "port": server.port, "user": "root", "passwd": ""}, server_id=0x7000_0001, log_file=name,
        log_pos=pos, resume_stream=True, blocking=True, is_mariadb=False, slave_heartbeat=HEARTBEAT_SECONDS,
        only_events=[MariadbGtidEvent, GtidEvent, QueryEvent, XidEvent, RotateEvent, WriteRowsEvent,
                     UpdateRowsEvent, DeleteRowsEvent])
    seq_end, pos_end = split_ts(end)
    n = 0
    try:
        for ev in reader:
            if isinstance(ev, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                n += len(ev.rows)
            if ev.packet.log_pos >= pos_end and int(reader.log_file.rsplit(".", 1)[1]) >= seq_end:
                break
    finally:
        reader.close()
    return f"({n} rows decoded)"


def source(uri: str, start: int, end: int, profile: cProfile.Profile | None, span: int = 0, spans: int = 1) -> str:
    up = open_upstream(uri)
    info = SpanInfo(span, f"hot_path_{span}", publication_label("pub", spans), start)
    src = up.span_source(info, Watermark(start, 0.0), TableFilter((f"{DB}.*",)), label=f"hot/{span}", holder="bench")
    src.open()
    buf, stop = Counting(), threading.Event()

    def on_resolved(w: Watermark) -> None:
        if w.ts >= end:
            stop.set()

    try:
        if profile is not None:
            profile.enable()
        src.run(buf, stop, on_resolved)
    finally:
        if profile is not None:
            profile.disable()
        src.close()
    return f"({buf.rows} rows in {buf.commits} transactions)"


def by_package(profile: cProfile.Profile) -> list[tuple[str, float]]:
    stats = pstats.Stats(profile)
    groups: dict[str, float] = defaultdict(float)
    for (path, _line, _fn), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        for key in ("pymysqlreplication", "pymysql", "upstream/mysql", "upstream/postgres", "upstream/base"):
            if f"/{key}/" in path or path.endswith(f"/{key}.py"):
                groups[key] += tt
                break
        else:
            groups["builtins / C calls" if path == "~" else "standard library / other"] += tt
    return sorted(groups.items(), key=lambda kv: -kv[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--shape", choices=("single", "batch", "update"), default="single")
    ap.add_argument("--profile", action="store_true", help="cProfile the span source (slows it ~2x)")
    ap.add_argument("--uri", help="an existing server's root URI (default: start one)")
    ap.add_argument("--spans", type=int, default=1, help="also read the binlog as each span of N (default 1)")
    args = ap.parse_args(argv)
    with written_server(args.rows, args.shape) as (server, start, end):
        for extra in ((), ("--verbose",)):
            what = "mariadb-binlog" + (" --verbose (rows decoded)" if extra else "") + " to /dev/null"
            print(f"{what:<48} {read_ceiling(server, start, end, args.rows, *extra)}", flush=True)
        timed("pymysqlreplication alone (rows decoded)", args.rows, lambda: library_only(server, start, end))
        prof = cProfile.Profile() if args.profile else None
        timed("span source -> counting buffer" + (" (cProfile)" if prof else ""), args.rows,
              lambda: source(server.uri(DB), start, end, prof))
        for i in range(args.spans if args.spans > 1 else 0):
            timed(f"span {i} of {args.spans} -> counting buffer", args.rows,
                  lambda i=i: source(server.uri(DB), start, end, None, i, args.spans))
        if prof is not None:
            total = sum(t for _, t in by_package(prof))
            print("\nown time per package (cProfile):")
            for key, t in by_package(prof):
                print(f"  {key:<28} {t:7.2f} s  {100 * t / total:5.1f} %")
            print()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
