"""The storage sink's write path without servers: mounted inserts -> StorageSink.write/flush -> files, per protocol,
next to the plain file-write ceiling (the same bytes written and fsynced, nothing encoded).

Rows of ``t (id int8 primary key, a text, b int4, c numeric(10,2), d timestamptz, e float8)``, positional (as the
mounter gives inserts), ``--txn`` rows per transaction, ``--txn-rows`` rows per ``write`` (the span's batch), a
``flush`` every ``--flush-every`` writes. Prints rows/s and MB/s of wall time and of process CPU time (compare CPU
time on a loaded host), best of ``--repeat``.

    python -m bench.storage_sink [--rows 200000] [--txn 100] [--txn-rows 20000] [--repeat 3]
    python -m bench --sink file        (the same, from the benchmark's entry point)
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.storage.sink import StorageSink

SCHEMA = TableSchema(TableName("public", "t"), (
    ColumnSchema("id", 20, "int8", False, "bigint", -1, False, True), ColumnSchema("a", 25, "text"),
    ColumnSchema("b", 23, "int4"), ColumnSchema("c", 1700, "numeric", type_modifier=((10 << 16) | 2) + 4),
    ColumnSchema("d", 1184, "timestamptz"), ColumnSchema("e", 701, "float8")), ("id",))


def rows(n: int, txn: int) -> list[RowChange]:
    at = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
    return [RowChange(OpType.INSERT, SCHEMA, 1000 + i // txn, 0.0, None, None, {},
                      (i, f"row number {i} with some text", i % 1000, Decimal(f"{i % 100000}.25"), at, i / 7))
            for i in range(n)]


def run_sink(root: str, protocol: str, changes: list[RowChange], txn_rows: int, flush_every: int
             ) -> tuple[float, float, int]:
    shutil.rmtree(root, ignore_errors=True)
    sink = StorageSink(f"file://{root}?protocol={protocol}&date-separator=none")
    sink.check()
    sink.open_position("bench", 0, 1)
    w0, c0 = time.perf_counter(), time.process_time()
    for n, i in enumerate(range(0, len(changes), txn_rows), 1):
        sink.write(changes[i:i + txn_rows])
        if n % flush_every == 0:
            sink.flush()
    sink.flush()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    sink.close()
    size = sum(p.stat().st_size for p in Path(root).rglob("CDC*") if p.name != "CDC.index")
    return wall, cpu, size


def run_ceiling(root: str, data: bytes, chunks: int) -> tuple[float, float]:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    step = max(1, len(data) // chunks)
    w0, c0 = time.perf_counter(), time.process_time()
    with open(os.path.join(root, "plain"), "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - w0, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.storage_sink", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--txn", type=int, default=100)
    p.add_argument("--txn-rows", type=int, default=20_000)
    p.add_argument("--flush-every", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = p.parse_args(argv)
    changes = rows(args.rows, args.txn)
    base = args.dir or tempfile.mkdtemp(prefix="bench-storage-")
    csv_bytes = b""
    print(f"{args.rows} rows, {args.txn} rows/txn, {args.txn_rows} rows/write, flush every {args.flush_every} writes")
    for protocol in ("csv", "canal-json", "parquet"):
        best = min((run_sink(os.path.join(base, protocol), protocol, changes, args.txn_rows, args.flush_every)
                    for _ in range(args.repeat)), key=lambda r: r[1])
        wall, cpu, size = best
        print(f"{protocol:11s} {args.rows / wall:10,.0f} rows/s wall {args.rows / cpu:10,.0f} rows/s CPU "
              f"{size / wall / 1e6:7.1f} MB/s  ({size / args.rows:.0f} B/row, {cpu / args.rows * 1e6:.2f} us/row CPU)")
        if protocol == "csv":
            csv_bytes = b"".join(p.read_bytes() for p in sorted(Path(base, protocol).rglob("CDC*.csv")))
    wall, cpu = min((run_ceiling(os.path.join(base, "plain"), csv_bytes, args.rows // args.txn_rows)
                     for _ in range(args.repeat)), key=lambda r: r[0])
    print(f"{'ceiling':11s} {args.rows / wall:10,.0f} rows/s wall {args.rows / max(cpu, 1e-9):10,.0f} rows/s CPU "
          f"{len(csv_bytes) / wall / 1e6:7.1f} MB/s  (the CSV bytes written and fsynced, nothing encoded)")
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
