"""``python -m bench``: Tidewater's benchmark, with its references measured in the same run.

    python -m bench [--upstream postgresql|mariadb] [--workload a,b,c,e,o,snapshot,verify] [--sink blackhole,sqlite,mariadb,postgresql,kafka,file] [--rows N]
                    [--sink-rows N] [--quick]
                    [--tables N] [--pgbench-seconds S] [--pgbench-scale N] [--lag-rates 5000,10000]
                    [--lag-seconds S] [--consistency default,snapshot] [--barrier-interval S] [--big-mb MB] [--snapshot-tables N] [--chunk-rows N] [--spark-master URL]
                    [--profile DIR [--profile-idle]] [--states DIR] [--json FILE] [--work-dir DIR] [--keep]

Starts its own etcd, upstream PostgreSQL 18, a second PostgreSQL (native subscriber and ``postgresql://``
target), MariaDB when asked for, and one ``cdc server``; writes each workload upstream; measures every
consumer catching up on the same WAL (Tidewater per sink, ``pg_recvlogical``, native logical
replication) and the bulk-load ceiling of each target; then the lag under fixed offered rates; and
prints the result tables (Markdown) on stdout. Progress goes to stderr. Workload (d), the 1 GB
transaction, and ``snapshot``, the initial copy of existing rows (bench.snapshot), run only when asked for
(``--workload d``, ``--workload snapshot``), and so does ``verify``, ``changefeed verify`` of existing rows under a
writer next to a ``count(*)`` + md5 scan of both sides (bench.verify; PostgreSQL and MariaDB targets). Exit code 0 when every measurement produced a
figure, 1 otherwise. Everything started is stopped at the end, also on Ctrl-C and SIGTERM.

``--sink kafka`` and ``--sink file`` measure the Kafka and storage sinks' write paths per protocol next to their
ceilings on the same machine (the kafka-python and confluent-kafka producers on the same broker; the plain file
write): :mod:`bench.kafka_sink` and :mod:`bench.storage_sink`, run with ``--sink-rows`` (``--quick``: a tiny run). They
run after the SQL sinks' workloads, or alone when no SQL sink is named.

``--upstream mariadb`` writes workloads (a), (b) and (o), single-row OLTP transactions, into a MariaDB upstream and
measures Tidewater per sink next to ``mariadb-binlog`` reading the same binlog to /dev/null and a native MariaDB
replica catching up on it (:mod:`bench.mariadb_run`); no lag runs, no write ceilings.

``--consistency default,snapshot`` measures, for each SQL sink, a changefeed in ``[consistency] mode = "snapshot"``
(``--barrier-interval``) beside the default one in the same run: workload (a)'s catch-up and the lag runs, with
the lag a reader of the target sees (:mod:`bench.consistency`, docs/consistency.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.consistency import MODES as CONSISTENCY_MODES
from bench.consistency import SNAPSHOT_SINKS
from bench.consumers import Profiler, Profilers
from bench.env import SINK_KINDS, BenchEnv
from bench.mariadb_run import WORKLOADS as MARIADB_WORKLOADS
from bench.report import Report, format_report
from bench.runner import Options, Runner, machine_info
from bench.verify import complete as verify_complete

WORKLOADS = ("a", "b", "c", "d", "e", "o", "snapshot", "verify")
UPSTREAMS = ("postgresql", "mariadb")
SINK_BENCHES = ("kafka", "file")  # measured by their own write-path benchmarks (module doc)
QUICK = {"rows": 2000, "tables": 20, "pgbench_seconds": 2.0, "pgbench_scale": 1, "lag_rates": "1000",
         "lag_seconds": 2.0, "big_mb": 4.0}


def _csv(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"{what} must be a comma-separated subset of {','.join(allowed)}")
    return items


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", choices=UPSTREAMS, default="postgresql",
                    help="the upstream the workloads are written into (default postgresql; mariadb: workloads a, b "
                    "and o next to mariadb-binlog and a native MariaDB replica, bench.mariadb_run)")
    ap.add_argument("--workload", type=lambda v: _csv(v, WORKLOADS, "--workload"),
                    help="workloads to run (default a,b,c,e; d = one 1 GB transaction, long; snapshot = the initial "
                    "copy of existing rows; verify = changefeed verify of existing rows under a writer; --upstream mariadb: a,b,o (default), o = single-row OLTP transactions)")
    ap.add_argument("--sink", default=",".join(SINK_KINDS),
                    type=lambda v: _csv(v, SINK_KINDS + SINK_BENCHES, "--sink"),
                    help=f"sinks (default {','.join(SINK_KINDS)}; also {','.join(SINK_BENCHES)})")
    ap.add_argument("--rows", type=int, help="rows of workloads a, b and e (default 1000000) and of the snapshot "
                    "and verify workloads (default 10000000)")
    ap.add_argument("--verify-write-rate", type=int, default=1000, help="rows/s of inserts the verify workload "
                    "writes upstream while it verifies (default 1000)")
    ap.add_argument("--sink-rows", type=int, default=100_000, help="rows of the kafka and file sink benchmarks")
    ap.add_argument("--quick", action="store_true", help="a tiny version of everything (seconds, for the smoke test)")
    ap.add_argument("--tables", type=int, help="tables of workload e (default 1000)")
    ap.add_argument("--e-rows", type=int, help="rows of workload e (default: --rows)")
    ap.add_argument("--o-txns", type=int, help="single-row transactions of workload o (--upstream mariadb; default: "
                    "--rows up to 100000: writing 1,000,000 of them from one connection takes ~20 minutes here)")
    ap.add_argument("--pgbench-seconds", type=float, help="duration of the pgbench run (default 30)")
    ap.add_argument("--pgbench-scale", type=int, help="pgbench scale factor (default 4: 400k accounts)")
    ap.add_argument("--pgbench-clients", type=int, default=4)
    ap.add_argument("--lag-rates", help="offered rates in rows/s for the lag runs, comma-separated "
                    "(default 5000,10000; 'none' to skip)")
    ap.add_argument("--lag-seconds", type=float, help="seconds of writing per lag run (default 20)")
    ap.add_argument("--consistency", default="default", type=lambda v: _csv(v, CONSISTENCY_MODES, "--consistency"),
                    help="changefeed consistency modes measured side by side, each SQL sink getting a changefeed per "
                    "mode (default: default; snapshot: [consistency] mode = \"snapshot\", SQL sinks only)")
    ap.add_argument("--barrier-interval", type=float, default=1.0, help="[consistency] interval of the snapshot-mode "
                    "changefeeds, seconds (default 1)")
    ap.add_argument("--big-mb", type=float, help="size of workload d's transaction in MiB (default 1024)")
    ap.add_argument("--snapshot-tables", type=int, default=4, help="tables the snapshot workload's rows are "
                    "spread over (default 4)")
    ap.add_argument("--chunk-rows", type=int, help="[snapshot] chunk-rows of the copy (default: the changefeed's)")
    ap.add_argument("--spark-master", help="[snapshot] spark-master of the copy (default: the changefeed's, local[*])")
    ap.add_argument("--compare-rows", type=int, default=200_000, help="the snapshot workload compares the target "
                    "row by row when it has at most this many rows (else count and column sums; default 200000)")
    ap.add_argument("--no-native", action="store_true", help="skip the native logical replication reference")
    ap.add_argument("--server-config", type=Path, help="TOML for the cdc server (default: its defaults)")
    ap.add_argument("--changefeed-config", type=Path, help="changefeed TOML (default: its defaults)")
    ap.add_argument("--worker-count", type=int, help="[sink] worker-count of the changefeeds (SQL sinks: apply "
                    "connections per span; default: the changefeed config's, else 1)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds any one catch-up may take")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="py-spy profile of the capture for each Tidewater "
                    "catch-up into DIR (slows the capture: not for baseline figures)")
    ap.add_argument("--profile-idle", action="store_true", help="with --profile: sample waiting threads too (py-spy "
                    "--idle), to see what each thread waits for")
    ap.add_argument("--states", type=Path, metavar="DIR", help="sample who runs while whom waits during each "
                    "Tidewater catch-up (the capture's threads, the servers' backends and their titles, bench.states) "
                    "into DIR/<name>.states.txt")
    ap.add_argument("--json", type=Path, help="also write every result to this JSON file")
    ap.add_argument("--work-dir", type=Path, help="directory for the servers' data (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)
    if args.workload is None:
        args.workload = list(MARIADB_WORKLOADS) if args.upstream == "mariadb" else ["a", "b", "c", "e"]
    if args.upstream == "mariadb":
        bad = [w for w in args.workload if w not in MARIADB_WORKLOADS]
        if bad:
            ap.error(f"--upstream mariadb runs the workloads {','.join(MARIADB_WORKLOADS)}, not {','.join(bad)}")
        args.lag_rates = "none"  # the lag runs are written into PostgreSQL
        if args.consistency != ["default"]:
            ap.error("--consistency is measured with the PostgreSQL upstream's workload (a) and lag runs")
    elif "o" in args.workload:
        ap.error("workload o (single-row OLTP transactions) is written into MariaDB: add --upstream mariadb")
    if "snapshot" in args.consistency and not set(args.sink) & set(SNAPSHOT_SINKS):
        ap.error(f"--consistency snapshot needs a SQL sink ({','.join(SNAPSHOT_SINKS)})")
    args.snapshot_rows = args.rows if args.rows is not None else (QUICK["rows"] if args.quick else 10_000_000)
    if args.lag_rates is None and set(args.workload) <= {"d", "snapshot", "verify"}:
        args.lag_rates = "none"  # the lag runs measure workload (a)'s rows: not asked for
    defaults: dict[str, Any] = {"rows": 1_000_000, "tables": 1000, "pgbench_seconds": 30.0, "pgbench_scale": 4,
                                "lag_rates": "5000,10000", "lag_seconds": 20.0, "big_mb": 1024.0}
    for key, value in (QUICK if args.quick else defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.lag_rates = [] if args.lag_rates == "none" else [int(r) for r in str(args.lag_rates).split(",") if r]
    return args


def _on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    benches = [k for k in args.sink if k in SINK_BENCHES]
    args.sink = [k for k in args.sink if k not in SINK_BENCHES]
    pipeline = _mariadb_pipeline if args.upstream == "mariadb" else _pipeline
    code = pipeline(args) if args.sink else 0
    return max(code, *(_sink_bench(kind, args) for kind in benches)) if benches else code


def _sink_bench(kind: str, args: argparse.Namespace) -> int:
    """``--sink kafka`` / ``--sink file``: that sink's write-path benchmark (module doc), its table on stdout."""
    rows = 5000 if args.quick else args.sink_rows
    runs = ["--runs", "1"] if args.quick else []
    print(f"\n## {kind} sink: rows/s per protocol next to its ceilings\n", flush=True)
    if kind == "kafka":
        from bench import kafka_sink

        return kafka_sink.main(["--rows", str(rows), "--write-rows", str(min(rows, 20_000)), *runs])
    from bench import storage_sink

    return storage_sink.main(["--rows", str(rows), "--txn-rows", str(min(rows, 20_000)),
                              *(["--repeat", "1"] if args.quick else [])])


def _say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _work_dir(args: argparse.Namespace) -> Path:
    """The run's work directory (made now); SIGTERM ends the run through the same cleanup as Ctrl-C."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    work: Path = args.work_dir or Path(tempfile.mkdtemp(prefix="tidewater-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    return work


def _profiler(args: argparse.Namespace, servers: Callable[[], dict[str, int]]) -> Profiler | None:
    """``--profile`` (py-spy of the capture) and/or ``--states`` (who runs while whom waits: ``servers`` names the
    bench's server pids) around each Tidewater catch-up."""
    parts: list[Profiler] = []
    if args.profile is not None:
        from bench.profile import PySpyProfiler

        parts.append(PySpyProfiler(args.profile, say=_say, idle=args.profile_idle))
    if args.states is not None:
        from bench.states import StateSampler

        parts.append(StateSampler(args.states, servers, say=_say))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else Profilers(parts)


def _timed(report: Report, run: Callable[[], None]) -> None:
    """``run`` with the load average before and after it and its duration in the report's machine info and notes."""
    report.machine["load average at start"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    t0 = time.monotonic()
    run()
    report.notes.append(f"run took {time.monotonic() - t0:.0f}s; load average (1, 5, 15 min) at the end "
                        + " ".join(f"{x:.1f}" for x in os.getloadavg()))


def _clean_up(args: argparse.Namespace, work: Path) -> None:
    if not args.keep and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    elif args.keep:
        _say(f"kept {work}")


def _emit(args: argparse.Namespace, report: Report | None, sinks: list[str]) -> int:
    """Print the report (and its JSON); 0 when every measurement produced a figure."""
    print(format_report(report, sinks))
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_dict(), indent=1))
    return 0 if _complete(report) else 1


def _pipeline(args: argparse.Namespace) -> int:
    say = _say
    work = _work_dir(args)
    opts = Options(
        workloads=args.workload, sinks=args.sink, rows=args.rows, tables=args.tables,
        pgbench_seconds=args.pgbench_seconds, pgbench_scale=args.pgbench_scale, pgbench_clients=args.pgbench_clients,
        lag_rates=args.lag_rates, lag_seconds=args.lag_seconds, big_mb=args.big_mb, timeout=args.timeout, e_rows=args.e_rows or 0,
        work_dir=work, server_config=args.server_config.read_text() if args.server_config else "",
        changefeed_config=with_worker_count(args.changefeed_config.read_text() if args.changefeed_config else "",
                                            args.worker_count),
        native=not args.no_native, profile_dir=args.profile, snapshot_rows=args.snapshot_rows,
        snapshot_tables=args.snapshot_tables, chunk_rows=args.chunk_rows, spark_master=args.spark_master,
        compare_rows=args.compare_rows, verify_write_rate=args.verify_write_rate,
        consistency=args.consistency, barrier_interval=args.barrier_interval,
    )
    say(f"work directory {work}; workloads {','.join(opts.workloads)}; sinks {','.join(opts.sinks)}")
    report: Report | None = None
    try:
        # the snapshot workload's pg_dump | psql reference needs the PostgreSQL target server
        pg_target = opts.native or bool({"snapshot", "verify"} & set(opts.workloads))
        with BenchEnv(work / "servers", opts.sinks, opts.server_config, native=pg_target) as env:
            profiler = _profiler(args, env.pids)
            say(f"servers up: {json.dumps(env.pids())}")
            report = Report(time.strftime("%Y-%m-%d %H:%M:%S %Z"), _jsonable(vars(args)), machine_info(env))
            if "snapshot" in opts.consistency:
                report.consistency, report.barrier_interval = opts.variants, opts.barrier_interval
            _timed(report, lambda: Runner(opts, env, say, profiler).run(report))
    finally:
        _clean_up(args, work)
    return _emit(args, report, opts.labels)


def _mariadb_pipeline(args: argparse.Namespace) -> int:
    """``--upstream mariadb``: bench.mariadb_run's scenarios, the same report, JSON and exit code."""
    from bench.mariadb_run import MariaDBBenchEnv, MariaDBRunner

    say = _say
    work = _work_dir(args)
    config = with_worker_count(args.changefeed_config.read_text() if args.changefeed_config else "",
                               args.worker_count)
    say(f"work directory {work}; upstream mariadb; workloads {','.join(args.workload)}; sinks {','.join(args.sink)}")
    report: Report | None = None
    try:
        server_config = args.server_config.read_text() if args.server_config else ""
        with MariaDBBenchEnv(work / "servers", args.sink, server_config) as env:
            profiler = _profiler(args, env.pids)
            say(f"servers up: {json.dumps(env.pids())}")
            report = Report(time.strftime("%Y-%m-%d %H:%M:%S %Z"), _jsonable(vars(args)), machine_info(env),
                            upstream="mariadb")
            _timed(report, lambda: MariaDBRunner(env, args.sink, args.workload, args.rows, args.timeout, say, config,
                                                 native=not args.no_native, compare_rows=args.compare_rows,
                                                 profiler=profiler, o_txns=args.o_txns).run(report))
    finally:
        _clean_up(args, work)
    return _emit(args, report, args.sink)


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def _complete(report: Report) -> bool:
    if report.errors:
        return False
    for p in report.phases:
        ms = [p.recv, p.native, *p.tidewater.values(), *p.ceiling.values()]
        if any(m is not None and not m.ok for m in ms):
            return False
    snap = report.snapshot
    if snap is not None and (snap.errors or any(r.error or r.verified.startswith("NO") for r in snap.runs)):
        return False
    if report.verify is not None and not verify_complete(report.verify):
        return False
    return all(not r.error for r in report.lag) and all(not r.error for r in report.big)


def with_worker_count(config: str, workers: int | None) -> str:
    """``config`` (changefeed TOML) with ``[sink] worker-count = workers`` (None: unchanged)."""
    if workers is None:
        return config
    line = f"worker-count = {workers}\n"
    lines = config.splitlines(keepends=True)
    for i, text in enumerate(lines):
        if text.strip() == "[sink]":
            return "".join(lines[:i + 1] + [line] + lines[i + 1:])
    return config + ("\n" if config and not config.endswith("\n") else "") + "[sink]\n" + line
