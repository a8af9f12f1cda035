"""The MySQL decoder side per row, without servers: ``Mounter.mount`` of stored MySQL changes (upstream.mysql.payload).

Builds the payloads the MySQL span stores for the bench's tables (``id bigint primary key, a varchar, b int,
c decimal(10,2), d datetime``: workload (a)'s inserts, (b)'s updates with their whole before image, and deletes) and
mounts each with a :class:`processor.mounter.Mounter` over :class:`upstream.mysql.source.MySqlChangeDecoder` with
the C decoding (``upstream.mysql.rowcodec.native_decoding``) and with the pure-Python one. Prints thread CPU
microseconds per row, the best of ``--repeat`` runs: mounting alone, and mounting then reading each row's ``values``
(what a sink that does not take the positional ``row`` does; for an insert that builds the dict in
``cdc.events``).

    .venv/bin/python scripts/bench_mysql_mount.py [--rows 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdc.events import ColumnSchema, TableName, TableSchema  # noqa: E402
from processor.mounter import Mounter  # noqa: E402
from upstream.base import encode_payload  # noqa: E402
from upstream.mysql import payload, rowcodec  # noqa: E402
from upstream.mysql.source import MySqlChangeDecoder  # noqa: E402

RELID = 17
COLUMNS = (ColumnSchema("id", 0, "int8", False, "bigint", nullable=False, is_key=True),
           ColumnSchema("a", 0, "text", False, "varchar(100)"), ColumnSchema("b", 0, "int4", False, "int"),
           ColumnSchema("c", 0, "numeric", False, "decimal(10,2)"), ColumnSchema("d", 0, "timestamp", False, "datetime"))
SCHEMA = TableSchema(TableName("bench", "t"), COLUMNS, ("id",), "f", RELID, version=1)


def row(i: int) -> list[str | None]:
    return [str(i), f"row {i} " + "x" * 60, str(i * 7 % 1000), f"{i % 10000}.{i % 100:02d}",
            f"2026-11-{1 + i % 28:02d} 12:{i % 60:02d}:{(i * 7) % 60:02d}"]


def payloads(kind: bytes, rows: int) -> list[bytes]:
    if kind == b"I":
        return [encode_payload(1, payload.encode(b"I", RELID, row(i), None)) for i in range(rows)]
    if kind == b"U":
        return [encode_payload(1, payload.encode(b"U", RELID, [*row(i)[:2], str(i), *row(i)[3:]], row(i)))
                for i in range(rows)]
    return [encode_payload(1, payload.encode(b"D", RELID, None, row(i))) for i in range(rows)]


def measure(decoding: rowcodec.Decoding, stored: list[bytes], repeat: int, values: bool) -> float:
    best = float("inf")
    for _ in range(repeat):
        mount = Mounter(MySqlChangeDecoder({1: SCHEMA}.__getitem__, decoding)).mount
        t0 = time.thread_time()
        if values:
            for p in stored:
                mount(p, 1, 0.0).values  # noqa: B018 - what a sink reads
        else:
            for p in stored:
                mount(p, 1, 0.0)
        best = min(best, time.thread_time() - t0)
    return best / len(stored) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    native = rowcodec.native_decoding()
    print("| change | python: mount | c: mount | python: mount + values | c: mount + values |")
    print("|---|---|---|---|---|")
    for name, kind in (("insert", b"I"), ("update (whole before image)", b"U"), ("delete", b"D")):
        stored = payloads(kind, args.rows)
        figures = [measure(d, stored, args.repeat, values) if d is not None else float("nan")
                   for values in (False, True) for d in (rowcodec.PYTHON, native)]
        print(f"| {name} | " + " | ".join(f"{f:.2f}" for f in figures) + " |")


if __name__ == "__main__":
    main()
