"""CPU per single-row transaction of the PostgreSQL span source in this thread and in a process of its own
(``processor.source_process``: what crossing the process boundary costs per transaction), no server.

Feeds N single-row transactions (Relation, then Begin / Insert / Commit each, hand-made pgoutput bytes of
``tests.pgoutput_wire``) through ``PgSpanSource.run`` into a ``MemorySorter``, first in this thread, then through
``ChildSpanSource`` (the child reads and sends batches, this process applies them). Prints this process's CPU and
the child's (reaped: ``RUSAGE_CHILDREN``) per transaction, and how many resolved reports arrived.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_child_txn.py [--txns 50000] [--idle-after-commit]

``--idle-after-commit``: the stream's idle mark (``None``) after each commit, as a reader that keeps up with the
walsender sees it; without it the wire is read in one go (a catch-up).
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdc.filter import TableFilter  # noqa: E402
from cdc.ts import Watermark  # noqa: E402
from processor.source_process import ChildSpanSource  # noqa: E402
from sorter.memory import MemorySorter  # noqa: E402
from tests.pgoutput_wire import WireStream, enc_begin, enc_commit, enc_insert, enc_relation, no_catalog  # noqa: E402
from upstream.postgres.source import PgSpanSource  # noqa: E402


def wire_of(txns: int) -> list[Any]:
    wire: list[Any] = [enc_relation(None, 7, "public", "t", "d", [(1, "id", 23, -1), (0, "v", 25, -1)])]
    for i in range(txns):
        end = 100 * (i + 1)
        wire += [enc_begin(end - 1, 0, 1000 + i), enc_insert(None, 7, [str(i), "x" * 100]),
                 enc_commit(0, end - 1, end, 0)]
    return wire


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--txns", type=int, default=50_000)
    ap.add_argument("--idle-after-commit", action="store_true")
    args = ap.parse_args()
    n = args.txns
    stream = WireStream(wire_of(n), idle_after_commit=args.idle_after_commit)
    for mode in ("thread", "process"):
        sorter = MemorySorter().span("cf/0")
        marks: list[Watermark] = []
        source = PgSpanSource(stream, TableFilter(("*.*",)), Watermark(0, 0.0), no_catalog, "cf/0")  # type: ignore[arg-type]
        k0, p0 = children_cpu(), time.process_time()
        if mode == "thread":
            source.run(sorter, threading.Event(), marks.append)
        else:
            child = ChildSpanSource(source, "cf/0")
            child.open()
            try:
                child.run(sorter, threading.Event(), marks.append)
            finally:
                child.close()
        p1, k1 = time.process_time(), children_cpu()
        assert marks[-1].ts == 100 * n and len(list(sorter.read_txns(-1, 1 << 62))) == n
        print(f"{mode}: this process {1e6 * (p1 - p0) / n:.2f} us/txn, child {1e6 * (k1 - k0) / n:.2f} us/txn, "
              f"{len(marks)} resolved reports", flush=True)


if __name__ == "__main__":
    main()
