"""Sorter throughput: add + commit, then read, then clean, of N payloads (default 1M x 100 bytes).

Each scenario is a transaction size: 100 (the common case, committed from memory), 1 (one commit per
row), and N (one huge transaction that spills and is committed by reference). Prints rows/s per phase.

    .venv/bin/python scripts/bench_sorter.py [--rows 1000000] [--size 100] [--txn-rows 100,1,1000000]
        [--impl leveldb|memory] [--dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sorter.base import Sorter  # noqa: E402
from sorter.encoding import U64_MAX  # noqa: E402
from sorter.leveldb import LevelDBSorter  # noqa: E402
from sorter.memory import MemorySorter  # noqa: E402


def run(sorter: Sorter, rows: int, size: int, txn_rows: int) -> dict[str, float]:
    sp = sorter.span(f"bench/{txn_rows}")
    sp.clear()
    payloads = [bytes([i % 251]) * size for i in range(256)]
    t0 = time.perf_counter()
    xid = 1
    in_txn = 0
    ts = 0
    add, commit = sp.add, sp.commit
    for i in range(rows):
        add(xid, xid, payloads[i & 255])
        in_txn += 1
        if in_txn == txn_rows:
            ts += 1
            commit(xid, ts, 1.0)
            xid += 1
            in_txn = 0
    if in_txn:
        ts += 1
        commit(xid, ts, 1.0)
    t1 = time.perf_counter()
    n = 0
    for _ in sp.read(-1, U64_MAX):
        n += 1
    t2 = time.perf_counter()
    sp.clean(ts)
    t3 = time.perf_counter()
    if n != rows:
        raise SystemExit(f"read {n} rows, expected {rows}")
    return {
        "add+commit": rows / (t1 - t0),
        "read": rows / (t2 - t1),
        "clean": rows / (t3 - t2),
        "total": rows / (t3 - t0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--txn-rows", default="100,1,1000000", help="comma-separated transaction sizes")
    ap.add_argument("--impl", choices=["leveldb", "memory"], default="leveldb")
    ap.add_argument("--dir", help="sorter directory (default: a temporary one, removed afterwards)")
    args = ap.parse_args()
    tmp = None if args.dir else tempfile.mkdtemp(prefix="bench-sorter-")
    path = Path(args.dir or tmp or ".") / "sorter"
    try:
        sorter: Sorter = LevelDBSorter(path, fresh=True) if args.impl == "leveldb" else MemorySorter()
        print(f"{args.impl}: {args.rows} rows of {args.size} bytes")
        for txn_rows in (int(x) for x in args.txn_rows.split(",")):
            r = run(sorter, args.rows, args.size, min(txn_rows, args.rows))
            print(
                f"  txn={txn_rows:>8} rows  add+commit {r['add+commit']:>10,.0f}/s  read {r['read']:>10,.0f}/s"
                f"  clean {r['clean']:>10,.0f}/s  total {r['total']:>9,.0f} rows/s"
                f"  disk {sorter.disk_bytes() / 1e6:.0f} MB"
            )
        sorter.close()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
