"""The SQL sink alone: CPU of ``SQLSink.write`` per row and per upstream transaction, on changes mounted beforehand.

Builds the changes once, the way a span does (a source into the LevelDB sorter, ``read_txns``, ``Mounter.mount``):

- ``--shape pg``: the PostgreSQL rows of scripts/bench_hotpath.py (inserts into
  ``t (id int primary key, a text, b int, c numeric(10,2), d timestamptz)``, each with its upstream text);
- ``--shape mysql``: the MySQL rows of its ``MySqlShapedSource`` (workload (o)'s mix on an sbtest-like table: 1/2
  updates by key with both images, 1/4 inserts, 1/4 deletes);
- ``--shape mysql-insert``: the same table, inserts only (workload (a)'s shape from a MySQL upstream);
- ``--shape pg-mixed``: pgbench's shape (workload (c)): per transaction an update of a random key (of ``--keys``) in
  each of three tables and an insert into a fourth, four rows (the three tables' rows written first, not timed);
- ``--shape pg-update``: workload (b)'s shape: the rows of ``--shape pg`` written first (not timed), then one update of
  each by key (the new tuple only, as pgoutput sends it for REPLICA IDENTITY DEFAULT), keys in a random order.

Then it writes them into ``--sink`` (its table dropped first) with exactly-once on (``open_position``, as a capture
does), in writes of whole transactions up to ``--txn-rows`` rows, and prints the process CPU of the writes (the
caller's thread and the sink's statement pipeline thread: the driver's work) per row and per transaction, the caller's
thread's alone per row (``time.thread_time``: the writer's Python loop and rendering, apart from the driver), the wall
time and the cyclic collector's full (oldest generation) collections during the writes. Nothing else runs in the process during the writes, so process CPU is the sink's own cost.

    .venv/bin/python scripts/bench_sqlsink.py --sink postgresql://postgres@127.0.0.1:5432/postgres \
        [--shape pg|mysql|mysql-insert] [--rows 100000] [--txn 100] [--txn-rows 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hotpath import (  # noqa: E402
    FakeStream,
    MySqlShapedSource,
    build_load_wal,
    build_mixed_wal,
    build_wal,
    drop_target,
    no_catalog,
)

from cdc.config import SinkConfig  # noqa: E402
from cdc.events import RowChange  # noqa: E402
from cdc.filter import TableFilter  # noqa: E402
from cdc.ts import Watermark  # noqa: E402
from processor.mounter import Mounter  # noqa: E402
from sinks.sql.sink import SQLSink  # noqa: E402
from sorter.leveldb import LevelDBSorter  # noqa: E402
from upstream.postgres.source import PgSpanSource  # noqa: E402


def mounted_txns(shape: str, rows: int, txn: int, work: Path, keys: list[int] | None = None,
                 payloads: list[bytes] | None = None) -> list[list[RowChange]]:
    """The changes of ``rows`` rows in transactions of ``txn``, mounted, one list per transaction (``keys``: PostgreSQL
    updates of these keys instead of inserts; ``payloads``: these pgoutput messages instead)."""
    sorter = LevelDBSorter(work / "sorter", fresh=True)
    sp = sorter.span("bench/0")
    source: Any
    if shape.startswith("pg"):
        if payloads is None:
            payloads, _end = build_wal(rows, txn, keys)
        source = PgSpanSource(FakeStream(payloads), TableFilter(["*.*"]), Watermark(0, 0.0),  # type: ignore[arg-type]
                              no_catalog, "bench")
    else:
        source = MySqlShapedSource(rows, txn, inserts_only=shape == "mysql-insert")
    resolved: list[Watermark] = []
    source.run(sp, threading.Event(), resolved.append)
    mount = Mounter(source.decoder(), defer=True).mount  # as a span mounts for the SQL sink (sinks.base.TextRows)
    out = [[mount(p, t.commit_ts, t.commit_time) for p in t.payloads] for t in sp.read_txns(0, resolved[-1].ts)]
    sorter.close()
    return out


def writes_of(txns: list[list[RowChange]], txn_rows: int) -> list[list[RowChange]]:
    """Whole transactions grouped into writes of at most ``txn_rows`` rows (at least one transaction each)."""
    out: list[list[RowChange]] = []
    cur: list[RowChange] = []
    for t in txns:
        if cur and len(cur) + len(t) > txn_rows:
            out.append(cur)
            cur = []
        cur.extend(t)
    if cur:
        out.append(cur)
    return out


def run_once(uri: str, writes: list[list[RowChange]], batch_rows: int, txn_rows: int,
             load: list[list[RowChange]] | None = None) -> tuple[float, float, float, int]:
    """Times ``writes`` (``load``: written first, untimed, without a position): wall, process CPU, the caller's
    thread CPU, full collections."""
    drop_target(uri)
    if load:
        loader = SQLSink(uri, SinkConfig(batch_rows=batch_rows, txn_rows=txn_rows))
        loader.check()
        for w in load:
            loader.write(w)
        loader.close()
    sink = SQLSink(uri, SinkConfig(batch_rows=batch_rows, txn_rows=txn_rows))
    sink.check()
    sink.open_position(f"bench{time.monotonic_ns()}", 0, 0)
    g0 = gc.get_stats()[2]["collections"]
    t0, p0, c0 = time.perf_counter(), time.process_time(), time.thread_time()
    for w in writes:
        sink.write(w, lambda: None)
    t1, p1, c1 = time.perf_counter(), time.process_time(), time.thread_time()
    g1 = gc.get_stats()[2]["collections"]
    sink.close()
    return t1 - t0, p1 - p0, c1 - c0, g1 - g0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sink", required=True, help="mysql://, mariadb:// or postgresql:// URI")
    ap.add_argument("--shape", choices=["pg", "pg-update", "pg-mixed", "mysql", "mysql-insert"], default="pg")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--txn", type=int, default=100, help="rows per upstream transaction")
    ap.add_argument("--txn-rows", type=int, default=SinkConfig().txn_rows)
    ap.add_argument("--batch-rows", type=int, default=SinkConfig().batch_rows)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keys", type=int, default=10_000, help="--shape pg-mixed: keys of each updated table")
    args = ap.parse_args()
    load: list[list[RowChange]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.shape == "pg-mixed":
            load = writes_of(mounted_txns("pg", 0, 100, Path(tmp) / "load", payloads=build_load_wal(args.keys, 3)),
                             args.txn_rows)
            txns = mounted_txns("pg", 0, 4, Path(tmp) / "mixed",
                                payloads=build_mixed_wal(args.rows // 4, args.keys)[0])
        elif args.shape == "pg-update":
            load = writes_of(mounted_txns("pg", args.rows, args.txn, Path(tmp) / "load"), args.txn_rows)
            keys = list(range(args.rows))
            random.Random(42).shuffle(keys)
            txns = mounted_txns(args.shape, args.rows, args.txn, Path(tmp) / "updates", keys)
        else:
            txns = mounted_txns(args.shape, args.rows, args.txn, Path(tmp))
    rows = sum(len(t) for t in txns)
    writes = writes_of(txns, args.txn_rows)
    gc.collect()
    gc.freeze()  # the changes built above are not the sink's garbage: collections skip them (a capture streams them)
    for i in range(1, args.repeat + 1):
        wall, cpu, caller, full_gcs = run_once(args.sink, writes, args.batch_rows, args.txn_rows, load)
        print(f"run {i}: shape {args.shape} rows {rows} txns {len(txns)} writes {len(writes)} | "
              f"wall {wall:.3f} s ({rows / wall:,.0f} rows/s) | CPU {cpu * 1e6 / rows:.2f} us/row "
              f"(caller's thread {caller * 1e6 / rows:.2f}), "
              f"{cpu * 1e6 / len(txns):.1f} us/txn, {cpu * 1e6 / len(writes):.0f} us/write | full collections {full_gcs}",
              flush=True)


if __name__ == "__main__":
    main()
