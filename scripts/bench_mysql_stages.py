"""A MySQL/MariaDB span's stages on a real binlog of multi-row transactions, each alone, code trees alternating.

Starts a MariaDB and writes one of the MariaDB bench's multi-row workloads into ``hot.sbtest``
(``scripts/bench_mysql_source.py``'s ``written_server``: ``bench.mariadb_run``'s table and row shape, 100 rows per
transaction): ``--shape insert`` (workload (a)) or ``--shape update`` (workload (b): the rows preloaded, then one
update of each by key, 100 random keys per transaction). Then, per ``--code`` tree per round (trees alternating, each in a fresh process whose
``PYTHONPATH`` is the tree), the span's path as the capture runs it, stage by stage, thread CPU per row:

- ``source``: the span source (``open_upstream(...).span_source(...).run``) into a counting buffer;
- ``puller``: the same into a LevelDB span sorter (the puller thread: source, ``add_many``, ``commit``);
- ``read``: reading every payload back from the sorter (``read_txns``);
- ``mount``: ``Mounter.mount`` of every payload, nothing kept;
- ``sink``: the sink thread's pass as ``SpanRunner`` runs it (``TxnBatcher`` of ``--txn-rows``, the mounter and
  ``write`` of ``--sink``: ``blackhole://`` by default; ``mariadb``: database ``tgt`` of the same server, or any SQL
  target URI: then the process CPU of the phase, the sink's statement thread included, and the table is dropped
  before each run). ``BENCH_PROFILE=FILE`` in the environment: cProfile of the sink stage into FILE (the last run's).

    .venv/bin/python scripts/bench_mysql_stages.py --code /tmp/before --code . [--shape insert|update]
                                                   [--rows 200000] [--rounds 3] [--sink URI]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
STAGES = ("source", "puller", "read", "mount", "sink")

# the child: one run of every stage in the tree given as argv[1] (imports from that tree)
_CHILD = r"""
import json, sys, tempfile, threading, time
from pathlib import Path
uri, start, end, rows, sink_uri, txn_rows = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], int(sys.argv[7])
from cdc.filter import TableFilter
from cdc.model import SpanInfo
from cdc.ts import Watermark
from processor.batcher import TxnBatcher
from processor.mounter import Mounter
from sorter.leveldb import LevelDBSorter
from upstream import open_upstream
try:
    from cdc.gcpolicy import tune_for_streaming
    tune_for_streaming()
except ImportError:
    pass

class Counting:
    def __init__(self): self.rows = 0
    def add(self, xid, subxid, payload): self.rows += 1
    def add_many(self, xid, subxid, payloads): self.rows += len(payloads)
    def abort(self, xid, subxid): pass
    def commit(self, xid, commit_ts, commit_time): pass

def read_binlog(buffer):
    up = open_upstream(uri)
    info = SpanInfo(0, "hot_path_0", "pub", start)
    src = up.span_source(info, Watermark(start, 0.0), TableFilter(("hot.*",)), label="hot/0", holder="bench")
    src.open()
    stop, last = threading.Event(), []
    def on_resolved(w):
        if w.ts >= end:
            last.append(w)
            stop.set()
    c0 = time.thread_time()
    try:
        src.run(buffer, stop, on_resolved)
    finally:
        cpu = time.thread_time() - c0
        src.close()
    return src, cpu, last[-1]

out = {}
counting = Counting()
_, out["source"], _ = read_binlog(counting)
assert counting.rows == rows, (counting.rows, rows)
work = Path(tempfile.mkdtemp(prefix="bench-mysql-stages-"))
sorter = LevelDBSorter(work / "sorter", fresh=True)
sp = sorter.span("bench/0")
src, out["puller"], resolved = read_binlog(sp)
c0 = time.thread_time()
n = 0
for t in sp.read_txns(0, resolved.ts):
    for _p in t.payloads:
        n += 1
out["read"] = time.thread_time() - c0
assert n == rows, (n, rows)
mount = Mounter(src.decoder()).mount
c0 = time.thread_time()
for t in sp.read_txns(0, resolved.ts):
    ts, tm = t.commit_ts, t.commit_time
    for p in t.payloads:
        mount(p, ts, tm)
out["mount"] = time.thread_time() - c0
if sink_uri.startswith("blackhole"):
    from sinks.blackhole import BlackholeSink
    sink = BlackholeSink()
    clock = time.thread_time
else:
    import sqlalchemy as sa
    from cdc.config import SinkConfig
    from sinks.sql.sink import SQLSink
    eng = sa.create_engine(sink_uri.replace("mysql://", "mysql+pymysql://", 1))
    with eng.begin() as c:
        c.exec_driver_sql("DROP TABLE IF EXISTS sbtest")
    eng.dispose()
    sink = SQLSink(sink_uri, SinkConfig(txn_rows=txn_rows))
    sink.check()
    clock = time.process_time
mount = Mounter(src.decoder()).mount
written = 0
import os
prof = None
if os.environ.get("BENCH_PROFILE"):
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
c0 = clock()
batcher = TxnBatcher(sp.read_txns(0, resolved.ts), mount, txn_rows)
while batcher.has_more():
    written += sink.write(batcher.next_batch(), lambda: None)
out["sink"] = clock() - c0
if prof is not None:
    prof.disable()
    prof.dump_stats(os.environ["BENCH_PROFILE"])
sink.close()
sorter.close()
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", action="append", type=Path, help="a code tree (repeat: compared in this order)")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--shape", choices=("insert", "update"), default="insert")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sink", default="blackhole://",
                    help="blackhole://, mariadb (the same server's database tgt) or a SQL target URI (its sbtest is dropped)")
    ap.add_argument("--txn-rows", type=int, default=20_000)
    args = ap.parse_args(argv)
    codes = [c.resolve() for c in (args.code or [HERE])]
    sys.path.insert(0, str(HERE / "scripts"))
    from bench_mysql_source import written_server  # type: ignore[import-not-found]

    got: dict[Path, dict[str, list[float]]] = {c: {s: [] for s in STAGES} for c in codes}
    with written_server(args.rows, "batch" if args.shape == "insert" else "update") as (server, start, end):
        if args.sink == "mariadb":
            server.execute("CREATE DATABASE tgt")  # type: ignore[attr-defined]
            args.sink = server.uri("tgt")  # type: ignore[attr-defined]
        print("| round | code | load average | " + " | ".join(f"{s} us/row" for s in STAGES) + " |")
        print("|---|---|---|" + "---|" * len(STAGES))
        for r in range(args.rounds):
            for code in codes:
                load = os.getloadavg()[0]
                proc = subprocess.run(
                    [sys.executable, "-c", _CHILD, str(code), server.uri("hot"), str(start), str(end),  # type: ignore[attr-defined]
                     str(args.rows), args.sink, str(args.txn_rows)],
                    env=dict(os.environ, PYTHONPATH=str(code)), cwd=code, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(proc.stderr, file=sys.stderr)
                    return 1
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                for s in STAGES:
                    got[code][s].append(1e6 * res[s] / args.rows)
                print(f"| {r + 1} | {code} | {load:.1f} | "
                      + " | ".join(f"{1e6 * res[s] / args.rows:.2f}" for s in STAGES) + " |", flush=True)
    for code in codes:
        print(f"median {code}: " + ", ".join(f"{s} {statistics.median(got[code][s]):.2f}" for s in STAGES)
              + " us/row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
