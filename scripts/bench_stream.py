"""The puller's stages on a real replication stream: what reading costs before anything of ours runs.

Starts a PostgreSQL server (playground.servers, the bench's upstream settings), writes ``--rows`` sbtest rows (the
rows of ``python -m bench`` workload a, 100 per transaction) with one logical slot per measured pass created
before, then reads each slot to the end of the writes and prints thread CPU (user + system of the reading thread)
(and its user / system split) and wall time per row of:

- ``read_message``: psycopg2's ``read_message`` loop alone (the floor: libpq, psycopg2's message objects, the
  waits for the walsender);
- ``messages``: :meth:`ReplicationStream.messages` (adds our classification of each message);
- ``puller``: :meth:`PgSpanSource.run` into a LevelDB sorter (adds the relation lookup and the sorter);
- ``child``: the same in a process of its own (``puller-process = true``, ``processor.source_process``): this
  thread applies the child's batches to the sorter; the child's CPU is printed beside it.

    .venv/bin/python scripts/bench_stream.py [--rows 300000] [--repeat 3] [--codec c|python]

Wall time is the walsender's pace (it decodes slower than we read); compare CPU.
"""

from __future__ import annotations

import argparse
import functools
import logging
import resource
import select
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg2  # noqa: E402
import psycopg2.extras  # noqa: E402

from bench.env import UPSTREAM_SETTINGS  # noqa: E402
from bench.workloads import insert_sql, sbtest_ddl  # noqa: E402
from cdc.filter import TableFilter  # noqa: E402
from cdc.ts import Watermark  # noqa: E402
from playground.servers import PostgresServer  # noqa: E402
from processor.source_process import ChildSpanSource  # noqa: E402
from sorter.leveldb import LevelDBSorter  # noqa: E402
from upstream.postgres.source import PgSpanSource  # noqa: E402
from upstream.postgres.stream import Keepalive, ReplicationStream  # noqa: E402

OPTIONS = {"proto_version": "4", "publication_names": "p", "streaming": "on", "messages": "true"}


def read_message(srv: PostgresServer, slot: str, target: int, work: Path, codec: Any) -> None:
    conn = psycopg2.connect(srv.dsn(), connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        cur = conn.cursor()
        cur.start_replication(slot_name=slot, decode=False, start_lsn=0, options=OPTIONS)
        while True:
            if cur.read_message() is None:
                if cur.wal_end >= target:
                    return
                select.select([cur], [], [], 0.2)
    finally:
        conn.close()


def messages(srv: PostgresServer, slot: str, target: int, work: Path, codec: Any) -> None:
    stream = ReplicationStream(srv.uri(), slot, "p", 0, label=slot)
    stream.open()
    try:
        for m in stream.messages(threading.Event()):
            if type(m) is Keepalive and m.ts >= target:
                return
    finally:
        stream.close()


def puller(srv: PostgresServer, slot: str, target: int, work: Path, codec: Any) -> None:
    stream = ReplicationStream(srv.uri(), slot, "p", 0, label=slot)
    stream.open()
    sorter = LevelDBSorter(work / f"sorter-{slot}", fresh=True)
    try:
        span = sorter.span("bench/0")
        span.clear()
        extra = {} if codec is None else {"codec": codec}
        source = PgSpanSource(stream, TableFilter(["*.*"]), Watermark(0, 0.0), lambda: psycopg2.connect(srv.dsn()),
                              slot, **extra)
        stop = threading.Event()
        source.run(span, stop, lambda w: stop.set() if w.ts >= target else None)
    finally:
        stream.close()
        sorter.close()


def child(srv: PostgresServer, slot: str, target: int, work: Path, codec: Any) -> None:
    """The puller as ``puller-process = true`` runs it: :meth:`PgSpanSource.run` in a child process, its batches
    applied here to the LevelDB sorter (the child's CPU is printed on its own)."""
    stream = ReplicationStream(srv.uri(), slot, "p", 0, label=slot)
    sorter = LevelDBSorter(work / f"sorter-{slot}", fresh=True)
    try:
        span = sorter.span("bench/0")
        span.clear()
        extra = {} if codec is None else {"codec": codec}
        source = ChildSpanSource(PgSpanSource(stream, TableFilter(["*.*"]), Watermark(0, 0.0),
                                              functools.partial(psycopg2.connect, srv.dsn()), slot, **extra), slot)
        stop = threading.Event()
        source.open()
        try:
            source.run(span, stop, lambda w: stop.set() if w.ts >= target else None)
        finally:
            source.close()
    finally:
        sorter.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--codec", choices=["c", "python"], help="per-row functions (default: the best available)")
    args = ap.parse_args()
    codec = None
    if args.codec is not None:
        from upstream.postgres import rowcodec

        codec = rowcodec.PYTHON if args.codec == "python" else rowcodec.native()
        if codec is None:
            raise SystemExit("the C row codec is not available here")
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    srv = PostgresServer(work / "pg", settings=UPSTREAM_SETTINGS).start()
    try:
        passes = [("read_message", read_message), ("messages", messages), ("puller", puller), ("child", child)]
        slots = [f"s{r}_{i}" for r in range(args.repeat) for i in range(len(passes))]
        conn = psycopg2.connect(srv.dsn())
        with conn.cursor() as cur:
            conn.autocommit = True
            cur.execute(sbtest_ddl("sbtest"))
            cur.execute("CREATE PUBLICATION p FOR TABLE sbtest")
            for s in slots:
                cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))
            conn.autocommit = False
            sql = insert_sql("sbtest")
            for lo in range(1, args.rows + 1, 100):
                cur.execute(sql, (lo, min(lo + 99, args.rows)))
                conn.commit()
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            hi, lo_ = cur.fetchone()[0].split("/")
        conn.close()
        target = (int(hi, 16) << 32) | int(lo_, 16)
        it = iter(slots)
        for r in range(args.repeat):
            out = []
            for name, fn in passes:
                k0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                r0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
                fn(srv, next(it), target, work, codec)
                r1, t1 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
                k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                kid = (k1.ru_utime + k1.ru_stime) - (k0.ru_utime + k0.ru_stime)
                user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
                also = f" + child {1e6 * kid / args.rows:.2f} cpu" if kid > 0 else ""
                out.append(f"{name} {1e6 * (user + system) / args.rows:.2f} cpu (user {1e6 * user / args.rows:.2f} "
                           f"sys {1e6 * system / args.rows:.2f}){also} {1e6 * (t1 - t0) / args.rows:.2f} wall")
            print(f"run {r + 1} us/row: " + " | ".join(out), flush=True)
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
