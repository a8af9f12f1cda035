"""The MySQL/MariaDB span source alone, two code trees alternating on one binlog (before/after comparisons).

Starts a MariaDB (``playground.servers.MariaDBServer``), writes ``--rows`` row changes into ``hot.sbtest`` once
(``scripts/bench_mysql_source.py``'s ``write``: ``--shape single`` is workload (o)'s mix of single-row transactions),
then reads that binlog range with the span source into a counting buffer (that script's ``source``), once per
``--code`` tree per round, the trees alternating (A, B, A, B, ...: a shared host's load drifts), each in a fresh
process whose ``PYTHONPATH`` is the tree. Prints per run the reading thread's CPU seconds, the CPU microseconds per
transaction and the load average at its start, then the median per tree.

    .venv/bin/python scripts/bench_mysql_source_ab.py --code /tmp/main-export --code . [--rows 100000] [--rounds 3]
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

_CHILD = """
import importlib.util, json, sys, time
code, uri, start, end = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
spec = importlib.util.spec_from_file_location("bms", code + "/scripts/bench_mysql_source.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
t0 = time.thread_time()
note = mod.source(uri, start, end, None)
print(json.dumps({"cpu": time.thread_time() - t0, "note": note}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", action="append", type=Path, help="a code tree (repeat: compared in this order)")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--shape", choices=("single", "batch", "update"), default="single")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    codes = [c.resolve() for c in (args.code or [HERE])]
    sys.path.insert(0, str(HERE / "scripts"))
    from bench_mysql_source import DB, written_server  # type: ignore[import-not-found]

    cpu: dict[Path, list[float]] = {c: [] for c in codes}
    txns = args.rows if args.shape == "single" else args.rows // 100
    with written_server(args.rows, args.shape) as (server, start, end):
        print("| round | code | load average | thread CPU s | us CPU per transaction | rows/s CPU | note |")
        print("|---|---|---|---|---|---|---|")
        for r in range(args.rounds):
            for code in codes:
                load = os.getloadavg()[0]
                out = subprocess.run([sys.executable, "-c", _CHILD, str(code), server.uri(DB), str(start), str(end)],
                                     env=dict(os.environ, PYTHONPATH=str(code)), cwd=code, check=True,
                                     capture_output=True, text=True).stdout
                res = json.loads(out.strip().splitlines()[-1])
                cpu[code].append(res["cpu"])
                print(f"| {r + 1} | {code} | {load:.1f} | {res['cpu']:.2f} | {1e6 * res['cpu'] / txns:.1f} | "
                      f"{args.rows / res['cpu']:,.0f} | {res['note']} |", flush=True)
    for code in codes:
        med = statistics.median(cpu[code])
        print(f"median {code}: {med:.2f} s, {1e6 * med / txns:.1f} us CPU per transaction")
    return 0

if __name__ == "__main__":
    sys.exit(main())
